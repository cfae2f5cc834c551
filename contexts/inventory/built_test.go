package inventory

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"mesh-controller/embedded/sqlite/sqlitetest"
)

// A version built again: another archive or a newer commit replaces the
// version's archive and commit (Rebuilt when the archive changed); the
// same build again changes nothing; another manifest under the same
// version is refused; a version added by hand is left alone by a later
// add without an archive. BuiltVersions says which are current and
// previous.
func TestStore_AddBuiltAgain(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	add := func(version, extra string, o Origin) (Added, error) {
		t.Helper()
		doc := `{"module": "greeter", "version": "` + version + `"` + extra + `}`
		m, ps := ParseManifest([]byte(doc))
		if len(ps) > 0 {
			t.Fatal(ps)
		}
		return s.AddBuilt(ctx, m, []byte(strings.ReplaceAll(doc, " ", "")), o, now)
	}
	// Each archive unpacks to a size of its own, kept with its digest.
	unpacked := map[string]int64{"d1": 100, "d2": 200}
	origin := func(commit, digest string) Origin {
		return Origin{Source: "/r", Commit: commit, BuildID: "b-" + commit, Archive: Archive{Digest: digest, Bytes: 10, UnpackedBytes: unpacked[digest]}}
	}
	built := func() []BuiltVersion {
		t.Helper()
		vs, err := s.BuiltVersions(ctx, "greeter")
		if err != nil {
			t.Fatal(err)
		}
		return vs
	}
	if _, err := add("1.0.0", "", origin("c1", "d1")); err != nil {
		t.Fatal(err)
	}
	if got := built()[0].Archive; got != (Archive{Digest: "d1", Bytes: 10, UnpackedBytes: 100}) {
		t.Fatalf("the archive kept: %+v", got)
	}
	a, err := add("1.0.0", "", origin("c1", "d1"))
	if err != nil || a.New || a.Rebuilt || !a.Current {
		t.Fatalf("the same build again: %+v %v", a, err)
	}
	a, err = add("1.0.0", "", origin("c2", "d2"))
	if err != nil || !a.Rebuilt || built()[0].Archive.Digest != "d2" || built()[0].Commit != "c2" || built()[0].BuildID != "b-c2" {
		t.Fatalf("another archive: %+v %v %+v", a, err, built())
	}
	snap, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := snap.Archives["greeter@1.0.0"]; got != (Archive{Digest: "d2", Bytes: 10, UnpackedBytes: 200}) || built()[0].Archive != got {
		t.Fatalf("the archive built again, as the snapshot has it: %+v, as built versions: %+v", got, built()[0].Archive)
	}
	// A reproducible build of a newer commit: the same archive, the commit moves.
	a, err = add("1.0.0", "", origin("c3", "d2"))
	if err != nil || a.Rebuilt || built()[0].Commit != "c3" {
		t.Fatalf("the same archive from a newer commit: %+v %v %+v", a, err, built())
	}
	if _, err := add("1.0.0", `, "description": "changed"`, origin("c4", "d4")); !errors.Is(err, ErrVersionConflict) {
		t.Fatalf("another manifest, same version: %v", err)
	}
	if _, err := add("1.0.0", "", Origin{Source: "/r"}); err != nil || built()[0].Archive.Digest != "d2" {
		t.Fatalf("an add by hand changed the built version: %v %+v", err, built())
	}
	for _, v := range []string{"1.1.0", "1.10.0", "1.2.0"} {
		if _, err := add(v, "", origin("c-"+v, "d-"+v)); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for _, v := range built() {
		got = append(got, v.Version+map[bool]string{true: " current", false: ""}[v.Current]+map[bool]string{true: " previous", false: ""}[v.Previous])
	}
	if strings.Join(got, ", ") != "1.0.0, 1.1.0, 1.2.0 previous, 1.10.0 current" {
		t.Fatalf("built versions: %s", strings.Join(got, ", "))
	}
}

// One module's built versions are found through the versions' primary key
// and the modules': the WHERE clause is written per case, since one
// statement for one module and for all would have one plan, a scan. Every
// module's are read whole; that that runs is what is checked.
func TestStore_BuiltVersionsPlan(t *testing.T) {
	_, db := newStore(t)
	query, args := builtVersionsQuery("greeter")
	if plan := sqlitetest.QueryPlan(t, db, query, args...); !db.Postgres && !sqlitetest.Indexed(plan) {
		t.Errorf("one module's built versions are not found through an index: %q", plan)
	} else {
		t.Logf("one module: %q", plan)
	}
	query, args = builtVersionsQuery("")
	sqlitetest.QueryPlan(t, db, query, args...)
}
