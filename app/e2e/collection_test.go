package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"mesh-controller/app"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/inventory"
)

// The collection judges every kept archive, and serve's sweep lets go only
// what nothing needs: never an archive a registered version holds, a node
// runs, or that is a module's current or previous version; an unheld one
// only once it is older than CollectAfter; and the chunks of a put that
// never ended once they are a day old.
func TestCollection_SweepLetsGoOnlyWhatNothingNeeds(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	m.builderOn(t, "b1")
	m.join("web1")
	ctx := context.Background()
	day := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	r := newShellRepo(t, "kept")
	digest := map[string]string{}
	for i, v := range []string{"1.0.0", "1.1.0", "1.2.0", "1.3.0"} {
		r.commit(v, okScript, day.Add(time.Duration(i)*time.Hour))
		a, err := m.c.Build(ctx, app.BuildRequest{Repository: r.bare})
		if err != nil {
			t.Fatalf("build %s: %v", v, err)
		}
		digest[v] = a.Digest
		if v == "1.0.0" {
			m.assign(t, "web1", "kept") // web1 runs 1.0.0 until a roll-out
			checkFor(t, settle, func() error {
				if s := m.moduleState("web1", "kept"); s.Version != "1.0.0" || s.Pid == 0 {
					return fmt.Errorf("kept on web1 is %s at %q, pid %d, not 1.0.0 running", s.State, s.Version, s.Pid)
				}
				return nil
			})
		}
	}
	// Built again (same commit, same version): the version takes the new
	// archive, and the one before is held by nothing.
	again, err := m.c.Rebuild(ctx, "kept", app.BuildRequest{})
	if err != nil || !again.Registered || again.Digest == digest["1.3.0"] {
		t.Fatalf("the rebuild: %+v %v", again, err)
	}
	digest["replaced"], digest["1.3.0"] = digest["1.3.0"], again.Digest

	// A put that never ended: chunks no archive names.
	st, _ := m.c.Stores(ctx)
	nc, err := m.c.DialBroker(ctx, st.Identity)
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	if _, err := js.Publish(ctx, "$O."+protocol.ArchiveBucket+".C.abandoned", []byte("half an archive")); err != nil {
		t.Fatal(err)
	}
	nc.Close()

	judged := func() (map[string]app.KeptArchive, app.Collection) {
		t.Helper()
		col, err := m.c.Collection(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]app.KeptArchive{}
		for name, d := range digest {
			for _, k := range col.Archives {
				if k.Digest == d {
					out[name] = k
				}
			}
		}
		return out, col
	}
	// A roll-out moved a node off 1.1.0 (its record, as serve leaves it):
	// 1.1.0 is what a rollback may return to, and is kept so.
	if err := st.Inventory.StartRollOut(ctx, inventory.RollOut{ID: "r1", Module: "kept", To: "1.3.0", Batch: "1", Phase: inventory.RollOutDone,
		Nodes: []inventory.RollOutNode{{Node: "web2", From: "1.1.0", Moved: true, Result: "ready"}}}, time.Now()); err != nil {
		t.Fatal(err)
	}
	got, col := judged()
	want := map[string]string{"1.0.0": "run on 1 node", "1.1.0": "a version its module's last roll-out may return nodes to", "1.2.0": "previous version",
		"1.3.0": "current version", "replaced": "held by nothing, and kept until"}
	for name, why := range want {
		if k, ok := got[name]; !ok || k.MayGo || !strings.Contains(k.Why, why) {
			t.Errorf("%s: %+v, want kept: %s", name, k, why)
		}
	}
	// collection --json: every key snake_case (cmd's TestJSON_SnakeCase
	// runs no controller to read the archives from).
	doc, _ := json.Marshal(col)
	for _, key := range regexp.MustCompile(`"([^"]+)":`).FindAllStringSubmatch(string(doc), -1) {
		if !regexp.MustCompile(`^[a-z][a-z0-9_]*$`).MatchString(key[1]) {
			t.Errorf("collection --json key %q is not snake_case", key[1])
		}
	}
	if len(col.Leftovers) != 1 || col.Leftovers[0].MayGo || !strings.HasSuffix(col.Leftovers[0].Subject, ".C.abandoned") {
		t.Errorf("leftovers: %+v", col.Leftovers)
	}

	// Eight days on, serve's sweep (every 200 ms here, once a day as
	// shipped) lets the replaced archive and the leftover go, nothing else.
	m.stop()
	later := time.Now().Add(app.CollectAfter + 24*time.Hour)
	m.c.Now = func() time.Time { return later }
	m.restartWith(app.ServeOptions{SweepEvery: 200 * time.Millisecond})
	checkFor(t, settle, m.logSays("the sweep let go 1 archive"))
	if !strings.Contains(m.logs.String(), "and 1 leftover of puts that never ended") {
		t.Errorf("the sweep's line:\n%s", m.logs.String())
	}
	got, col = judged()
	if _, ok := got["replaced"]; ok {
		t.Errorf("the replaced archive is still kept: %+v", got["replaced"])
	}
	for _, v := range []string{"1.0.0", "1.1.0", "1.2.0", "1.3.0"} {
		if _, ok := got[v]; !ok {
			t.Errorf("%s's archive was let go", v)
		}
	}
	if len(col.Leftovers) != 0 {
		t.Errorf("leftovers after the sweep: %+v", col.Leftovers)
	}
}
