package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"mesh-controller/app"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/inventory"
)

// notesPreparing is notes 2.0.0, whose prepare converts a note, then
// fails on another.
const notesPreparing = `{"module": "notes", "version": "2.0.0", "run": {"command": ["bin/notes"]},
 "prepare": {"command": ["sh", "-c", "echo converted > $MESH_DATA_FILES/a.txt; echo 'cannot convert sub/b.txt' >&2; exit 4"], "timeout": "1m"},
 "data": [{"name": "files", "path": "/srv/notes", "keeps": "the notes", "precious": "irreplaceable", "backup": "hourly"}]}`

// A roll-out whose canary's prepare fails goes back, and says so node by
// node, with real hosts, real module processes, the real backup module on
// the seat's holder and real restic: db1 (the canary) stops notes 1.0.0,
// snapshots its irreplaceable notes through the holder, runs 2.0.0's
// prepare, which changes a note and fails; the notes are restored from
// that snapshot byte for byte (what the prepare left kept aside, a retired
// data set data lists), 1.0.0 runs again, and the roll-out rolls back: db1
// back on 1.0.0 with its host's word on the data, db2 never moved. The
// controller recorded the pre-upgrade snapshot as a backup of the notes.
func TestRollOut_PrepareFailsRollsBack(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("restic"); err != nil {
		t.Skip("restic is not installed (make test installs it)")
	}
	start := time.Now()
	b := newBackupMesh(t)
	ctx := context.Background()
	t.Cleanup(func() {
		if t.Failed() {
			b.dump(t)
		}
	})
	db2 := b.join("db2")
	db2.install(t, "notes", "bin/notes", filepath.Join(b.db1.root, protocol.ModulesDir, "notes", "bin", "notes"))
	b.assign(t, "db2", "notes")
	// db1 has its access to its repository: it was backed up once.
	checkFor(t, firstBackup, b.backedUp(t))
	checkFor(t, settle, b.moduleIn("db2", "notes", "ready"))
	want := tree(t, b.notes)
	b.addModule(writeManifest(t, notesPreparing))

	var said []string
	v, err := b.c.Upgrade(ctx, app.UpgradeRequest{Module: "notes", Action: "roll-out", Canary: 1, Wait: time.Minute,
		Progress: func(s string) { said = append(said, s) }})
	lines := strings.Join(said, "\n")
	if !errors.Is(err, app.ErrRollOutRolledBack) {
		t.Fatalf("a canary whose prepare fails: %v\n%s", err, lines)
	}
	runs, rerr := func() ([]inventory.BackupRun, error) {
		st, err := b.c.Stores(ctx)
		if err != nil {
			return nil, err
		}
		return st.Inventory.BackupRuns(ctx, "db1", "notes", "files", 10)
	}()
	if rerr != nil {
		t.Fatal(rerr)
	}
	var snap, restore inventory.BackupRun
	for _, r := range runs {
		switch {
		case r.Kind == inventory.RunBackup && snap.Ask == "" && strings.HasPrefix(r.Ask, "upgrade-"):
			snap = r
		case r.Kind == inventory.RunRestore && restore.Ask == "":
			restore = r
		}
	}
	if !snap.OK || snap.Snapshot == "" || !restore.OK || protocol.ShortSnapshot(restore.Snapshot) != snap.Snapshot || !strings.HasPrefix(restore.Aside, "/srv/notes.before-restore-") {
		t.Fatalf("the controller's record of the snapshot and the restore: %+v", runs)
	}
	short := snap.Snapshot
	// The host's retry may run the failing upgrade once more (the retry
	// healer), with a snapshot of its own before it: the error a roll-out
	// keeps may be of either attempt, each naming its own snapshot.
	restoredFrom := func(said string) bool {
		for _, r := range runs {
			if r.Kind == inventory.RunBackup && strings.HasPrefix(r.Ask, "upgrade-") && r.Snapshot != "" &&
				strings.HasSuffix(said, "data restored from the pre-upgrade snapshot "+r.Snapshot) {
				return true
			}
		}
		return false
	}

	c := rollOutNode(t, v, "db1")
	if c.Result != "failed" || c.Back != "returned" ||
		!strings.Contains(c.Error, "prepare of notes 2.0.0 failed: exit status 4: cannot convert sub/b.txt; notes 1.0.0 runs again: data restored from the pre-upgrade snapshot ") ||
		!restoredFrom(strings.SplitN(c.Error, " (what prepare left", 2)[0]) ||
		c.Detail != "prepare of 2.0.0 failed; data restored from the pre-upgrade snapshot "+short {
		t.Fatalf("the canary: %+v", c)
	}
	if r := rollOutNode(t, v, "db2"); r.Moved || r.Back != "" {
		t.Fatalf("db2 moved: %+v", r)
	}
	if s := b.moduleState("db2", "notes"); s.Version != "1.0.0" {
		t.Errorf("db2 runs notes %s", s.Version)
	}
	// The failure said is the first attempt's, which may be before the
	// retry's: it names its own snapshot.
	failed := false
	for _, l := range said {
		head, _, ok := strings.Cut(l, " (what prepare left is kept at /srv/notes.before-restore-")
		failed = failed || (ok && strings.HasPrefix(head, "db1 failed: prepare of notes 2.0.0 failed: exit status 4: cannot convert sub/b.txt; notes 1.0.0 runs again: ") && restoredFrom(head))
	}
	if !failed {
		t.Errorf("the roll-out did not say db1 failed, restored from a pre-upgrade snapshot:\n%s", lines)
	}
	if w := "db1 back on notes 1.0.0 (prepare of 2.0.0 failed; data restored from the pre-upgrade snapshot " + short + ")"; !strings.Contains(lines, w) {
		t.Errorf("the roll-out did not say %q:\n%s", w, lines)
	}
	if got := tree(t, b.notes); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("db1's notes %v, want %v as they were", got, want)
	}
	if got := tree(t, filepath.Join(b.db1.root, restore.Aside)); got["a.txt"] != "converted\n" {
		t.Fatalf("what the prepare left, kept aside: %v", got)
	}
	checkFor(t, settle, b.moduleIn("db1", "notes", "ready"))
	if s := b.moduleState("db1", "notes"); s.Version != "1.0.0" {
		t.Fatalf("db1 runs notes %s", s.Version)
	}
	views, err := b.c.Data(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, d := range views {
		found = found || (d.Node == "db1" && d.Path == restore.Aside && d.State == "retired")
	}
	if !found {
		t.Fatalf("data does not list what the prepare left as retired: %+v", views)
	}
	b.handActsSay(t, "move db1 from 1.0.0 to 2.0.0", "db1 on notes 2.0.0: failed: prepare of notes 2.0.0 failed", "rollback of notes 2.0.0: db1 back on notes 1.0.0 (prepare of 2.0.0 failed")
	t.Logf("took %s", time.Since(start))
}

// storeKeeping is store at version, keeping an irreplaceable data set,
// with a prepare (if given) run as a shell script.
func storeKeeping(version, prepare string) string {
	p := ""
	if prepare != "" {
		p = fmt.Sprintf(`"prepare": {"command": ["sh", "-c", %q]},`, prepare)
	}
	return fmt.Sprintf(`{"module": "store", "version": %q, %s "run": {"command": ["sh", "-c", "exec sleep 1000"], "ready": {"after": "100ms"}},
 "data": [{"name": "main", "path": "/var/lib/store", "precious": "irreplaceable"}]}`, version, p)
}

// With no backup holder, a roll-out to a version with a prepare is
// refused on its canary, which runs on untouched; the same roll-out with
// --without-snapshot --why goes through, the planner marking the module
// for the nodes it moves, each node's line saying what its host did of
// the data, the why kept in the hand act and upgrade --json showing it;
// rolled back by hand, the data is left as it is, and that is said.
func TestRollOut_WithoutSnapshot(t *testing.T) {
	t.Parallel()
	start := time.Now()
	m := newTestMesh(t)
	h := m.join("db1")
	m.addModule(writeManifest(t, storeKeeping("1.0.0", "")))
	m.assign(t, "db1", "store")
	checkFor(t, settle, m.storeReady("db1", "1.0.0"))
	m.addModule(writeManifest(t, storeKeeping("2.0.0", "echo 2 > $MESH_DATA_MAIN/schema")))
	ctx := context.Background()

	v, said, err := m.rollOut(ctx, app.UpgradeRequest{Canary: 1})
	if !errors.Is(err, app.ErrRollOutRolledBack) || !strings.Contains(err.Error(),
		"refused: store cannot be upgraded to 2.0.0: its irreplaceable data set main cannot be snapshotted first: no backup holder keeps it") {
		t.Fatalf("a roll-out with no snapshot possible: %v\n%s", err, strings.Join(said, "\n"))
	}
	if c := rollOutNode(t, v, "db1"); c.Back != "returned" {
		t.Fatalf("the canary: %+v", c)
	}
	checkFor(t, settle, m.storeReady("db1", "1.0.0"))

	v, said, err = m.rollOut(ctx, app.UpgradeRequest{Canary: 1, WithoutSnapshot: true, Why: "no holder yet; the store is rebuilt from its source"})
	if err != nil || !v.RollOut.WithoutSnapshot {
		t.Fatalf("a roll-out without a snapshot: %v %+v\n%s", err, v.RollOut, strings.Join(said, "\n"))
	}
	prepared := "prepare of 2.0.0 ran; main not snapshotted (allowed without a snapshot: no backup holder keeps it (no module holds the backup seat, or its address is unknown))"
	if c := rollOutNode(t, v, "db1"); c.Result != "ready" || c.Prepared != prepared {
		t.Fatalf("the canary: %+v", c)
	}
	if !strings.Contains(strings.Join(said, "\n"), "db1 runs store 2.0.0: ready ("+prepared+")") {
		t.Errorf("the roll-out did not say what became of the data:\n%s", strings.Join(said, "\n"))
	}
	if b, err := os.ReadFile(filepath.Join(h.root, "var/lib/store/schema")); err != nil || string(b) != "2\n" {
		t.Fatalf("the prepare did not run: %q %v", b, err)
	}
	acts, err := m.c.HandActs(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, a := range acts.Acts {
		found = found || (strings.HasSuffix(a.What, "allowed without a snapshot of irreplaceable data") && a.Why == "no holder yet; the store is rebuilt from its source")
	}
	if !found {
		t.Errorf("no hand act keeps why: %+v", acts.Acts)
	}
	shown, err := m.c.Upgrade(ctx, app.UpgradeRequest{Module: "store"})
	doc, _ := json.Marshal(shown)
	if err != nil || !strings.Contains(string(doc), `"without_snapshot":true`) || !strings.Contains(string(doc), `"prepared":"prepare of 2.0.0 ran;`) {
		t.Fatalf("upgrade --json: %s %v", doc, err)
	}

	// Back by hand: no snapshot was taken, so the data is left as it is.
	v, err = m.c.Upgrade(ctx, app.UpgradeRequest{Module: "store", Action: "rollback", Why: "2.0.0 is slow", Wait: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if c := rollOutNode(t, v, "db1"); c.Back != "returned" || c.Detail != "data left as it is: no snapshot was taken before prepare of 2.0.0 ran" {
		t.Fatalf("the canary back: %+v", c)
	}
	if b, err := os.ReadFile(filepath.Join(h.root, "var/lib/store/schema")); err != nil || string(b) != "2\n" {
		t.Fatalf("the data was not left as it is: %q %v", b, err)
	}
	t.Logf("took %s", time.Since(start))
}
