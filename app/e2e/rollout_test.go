package e2e

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"mesh-controller/app"
	"mesh-controller/contexts/inventory"
)

// runningStore is store 1.0.0: a real process, ready 100 ms after it starts.
const runningStore = `{"module": "store", "version": "1.0.0", "run": {"command": ["sh", "-c", "exec sleep 1000"], "ready": {"after": "100ms"}}}`

// storeRunning is store at version with this shell script as its process,
// ready 100 ms after it starts.
func storeRunning(version, script string) string {
	return fmt.Sprintf(`{"module": "store", "version": %q, "run": {"command": ["sh", "-c", %q], "ready": {"after": "100ms"}}}`, version, script)
}

// up is what a script of storeUp runs to say it is ready.
const up = `touch "$HOME/up-$MESH_VERSION"; `

// storeUp is store at version with this shell script as its process,
// ready once the script has run up: a script that exits first is failed
// however slowly a busy machine starts it (ready 100 ms after the start,
// it could be judged ready before it had run at all).
func storeUp(version, script string) string {
	return fmt.Sprintf(`{"module": "store", "version": %q, "run": {"command": ["sh", "-c", %q], "ready": {"command": ["sh", "-c", "test -e \"$HOME/up-$MESH_VERSION\""]}}}`,
		version, script)
}

// rollOutMesh is a mesh whose hosts run store 1.0.0 (ready), with store
// 2.0.0 registered as next.
func rollOutMesh(t *testing.T, next string, names ...string) (*testMesh, []*testHost) {
	t.Helper()
	m := newTestMesh(t)
	m.restartWith(app.ServeOptions{CatchUpEvery: 20 * time.Millisecond})
	var hosts []*testHost
	for _, n := range names {
		hosts = append(hosts, m.join(n))
	}
	m.addModule(writeManifest(t, runningStore))
	for _, n := range names {
		m.assign(t, n, "store")
	}
	for _, n := range names {
		checkFor(t, settle, m.storeReady(n, "1.0.0"))
	}
	m.addModule(writeManifest(t, next))
	return m, hosts
}

// storeReady is a check that node's host reports store ready at version.
func (m *testMesh) storeReady(node, version string) func() error {
	return func() error {
		if s := m.moduleState(node, "store"); s.Version != version || s.State != "ready" {
			return fmt.Errorf("%s: store %s is %s, not %s ready (%s)", node, s.Version, s.State, version, s.Detail)
		}
		return nil
	}
}

// rollOut runs upgrade store roll-out as r asks (wait 5s unless said),
// and returns its view and error, with the lines it said.
func (m *testMesh) rollOut(ctx context.Context, r app.UpgradeRequest) (app.UpgradeView, []string, error) {
	var said []string
	r.Module, r.Action = "store", "roll-out"
	if r.Wait == 0 {
		r.Wait = 5 * time.Second
	}
	r.Progress = func(s string) { said = append(said, s) }
	v, err := m.c.Upgrade(ctx, r)
	return v, said, err
}

// rollOutNode is node's record in the last roll-out of store.
func rollOutNode(t *testing.T, v app.UpgradeView, node string) inventory.RollOutNode {
	t.Helper()
	return rollOutNodeOf(t, v.RollOut, node)
}

// rollOutNodeOf is node's record in the roll-out ro.
func rollOutNodeOf(t *testing.T, ro *inventory.RollOut, node string) inventory.RollOutNode {
	t.Helper()
	if ro == nil {
		t.Fatal("no roll-out in the view")
	}
	for _, n := range ro.Nodes {
		if n.Node == node {
			return n
		}
	}
	t.Fatalf("%s is not in the roll-out: %+v", node, ro.Nodes)
	return inventory.RollOutNode{}
}

// handActsSay is a check that the hand acts of the roll-out say each of
// wants in one act's what.
func (m *testMesh) handActsSay(t *testing.T, wants ...string) {
	t.Helper()
	acts, err := m.c.HandActs(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range wants {
		found := false
		for _, a := range acts.Acts {
			found = found || (a.Cause == "roll-out" && strings.Contains(a.What, w))
		}
		if !found {
			t.Errorf("no roll-out hand act says %q: %+v", w, acts.Acts)
		}
	}
}

// A canary that fails goes back: the canary node runs the old version
// again, the others were never moved (their declarations are those they
// had), and the roll-out says so node by node.
func TestRollOut_CanaryFailsRollsBack(t *testing.T) {
	t.Parallel()
	start := time.Now()
	m, hosts := rollOutMesh(t, storeUp("2.0.0", "exit 3"), "db1", "db2", "db3")
	declared := map[string]int64{}
	for _, n := range []string{"db2", "db3"} {
		declared[n] = m.node(n).SerialDeclared
	}
	v, said, err := m.rollOut(context.Background(), app.UpgradeRequest{Canary: 1})
	if !errors.Is(err, app.ErrRollOutRolledBack) {
		t.Fatalf("a failing canary: %v\n%s", err, strings.Join(said, "\n"))
	}
	if v.RollOut.Phase != inventory.RollOutRolledBack {
		t.Fatalf("phase %s", v.RollOut.Phase)
	}
	c := rollOutNode(t, v, "db1")
	if c.Batch != 0 || c.Result != "failed" || c.Back != "returned" || !strings.Contains(c.Error, "failed") {
		t.Fatalf("the canary: %+v", c)
	}
	for _, n := range []string{"db2", "db3"} {
		if r := rollOutNode(t, v, n); r.Moved || r.Result != "waiting" || r.Back != "" {
			t.Errorf("%s moved: %+v", n, r)
		}
		if got := m.node(n).SerialDeclared; got != declared[n] {
			t.Errorf("%s was declared again (%d, was %d)", n, got, declared[n])
		}
	}
	checkFor(t, settle, m.storeReady("db1", "1.0.0"))
	if got := moduleVersionOn(t, hosts[0], "store"); got != "1.0.0" {
		t.Fatalf("db1 runs store %s", got)
	}
	for _, w := range []string{"db1 failed: ", "db1 back on store 1.0.0"} {
		if !strings.Contains(strings.Join(said, "\n"), w) {
			t.Errorf("the roll-out did not say %q:\n%s", w, strings.Join(said, "\n"))
		}
	}
	if !strings.Contains(err.Error(), "1 node failed, past --max-failures 0: db1") || !strings.Contains(err.Error(), "db1 back on store 1.0.0") {
		t.Errorf("the error: %v", err)
	}
	m.handActsSay(t, "roll-out store 2.0.0 to 3 nodes", "move db1 from 1.0.0 to 2.0.0", "db1 on store 2.0.0: failed", "rollback of store 2.0.0: db1 back on store 1.0.0")
	t.Logf("took %s", time.Since(start))
}

// A batch failing past --max-failures returns every node the roll-out
// moved, the canary and the batches before it with it; with
// --max-failures 1 the same one failure is tolerated and the roll-out
// goes on to the end.
func TestRollOut_BatchFailurePastMaxFailures(t *testing.T) {
	t.Parallel()
	start := time.Now()
	// db3 alone cannot run 2.0.0.
	next := storeUp("2.0.0", `case "$MESH_NODE" in db3) exit 3;; esac; `+up+`exec sleep 1000`)
	t.Run("rolled back", func(t *testing.T) {
		m, _ := rollOutMesh(t, next, "db1", "db2", "db3", "db4")
		v, said, err := m.rollOut(context.Background(), app.UpgradeRequest{Canary: 1, Batch: "2"})
		if !errors.Is(err, app.ErrRollOutRolledBack) {
			t.Fatalf("%v\n%s", err, strings.Join(said, "\n"))
		}
		for _, n := range []string{"db1", "db2", "db3"} {
			if r := rollOutNode(t, v, n); !r.Moved || r.Back != "returned" {
				t.Errorf("%s: %+v", n, r)
			}
			checkFor(t, settle, m.storeReady(n, "1.0.0"))
		}
		if r := rollOutNode(t, v, "db4"); r.Moved || r.Batch != 2 {
			t.Errorf("db4, of the last batch, moved: %+v", r)
		}
		if r := rollOutNode(t, v, "db3"); r.Result != "failed" {
			t.Errorf("db3: %+v", r)
		}
	})
	t.Run("tolerated", func(t *testing.T) {
		m, _ := rollOutMesh(t, next, "db1", "db2", "db3", "db4")
		v, said, err := m.rollOut(context.Background(), app.UpgradeRequest{Canary: 1, Batch: "50%", MaxFailures: 1})
		if err != nil {
			t.Fatalf("%v\n%s", err, strings.Join(said, "\n"))
		}
		if v.RollOut.Phase != inventory.RollOutDone {
			t.Fatalf("phase %s", v.RollOut.Phase)
		}
		for _, n := range []string{"db1", "db2", "db4"} {
			if r := rollOutNode(t, v, n); r.Result != "ready" {
				t.Errorf("%s: %+v", n, r)
			}
			checkFor(t, settle, m.storeReady(n, "2.0.0"))
		}
		if r := rollOutNode(t, v, "db3"); r.Result != "failed" || r.Back != "" {
			t.Errorf("db3: %+v", r)
		}
	})
	t.Logf("took %s", time.Since(start))
}

// A node ready, then crashing within the soak, counts as failed: the
// roll-out goes back.
func TestRollOut_SoakFailureCounts(t *testing.T) {
	t.Parallel()
	start := time.Now()
	m, _ := rollOutMesh(t, storeRunning("2.0.0", "sleep 0.5; exit 1"), "db1", "db2")
	v, said, err := m.rollOut(context.Background(), app.UpgradeRequest{Canary: 1, Soak: 2 * time.Second})
	if !errors.Is(err, app.ErrRollOutRolledBack) {
		t.Fatalf("%v\n%s", err, strings.Join(said, "\n"))
	}
	c := rollOutNode(t, v, "db1")
	if c.Result != "failed" || !c.Applied || !strings.Contains(c.Error, "within the 2s soak") || c.Back != "returned" {
		t.Fatalf("the canary: %+v", c)
	}
	// It was ready before it crashed: the soak is what caught it.
	if !strings.Contains(strings.Join(said, "\n"), "the batch is ready: soaking 2s") {
		t.Errorf("the canary was not said ready first:\n%s", strings.Join(said, "\n"))
	}
	checkFor(t, settle, m.storeReady("db1", "1.0.0"))
	if r := rollOutNode(t, v, "db2"); r.Moved {
		t.Errorf("db2 moved: %+v", r)
	}
	t.Logf("took %s", time.Since(start))
}

// upgrade rollback --why after a roll-out that ended well returns its
// nodes; a second rollback, and one with no roll-out, are refused.
func TestRollOut_RollbackByHand(t *testing.T) {
	t.Parallel()
	start := time.Now()
	m, hosts := rollOutMesh(t, storeRunning("2.0.0", "exec sleep 1000"), "db1", "db2")
	ctx := context.Background()
	v, said, err := m.rollOut(ctx, app.UpgradeRequest{Canary: 1, Soak: 300 * time.Millisecond})
	if err != nil || v.RollOut.Phase != inventory.RollOutDone {
		t.Fatalf("%v\n%s", err, strings.Join(said, "\n"))
	}
	for _, n := range []string{"db1", "db2"} {
		checkFor(t, settle, m.storeReady(n, "2.0.0"))
	}
	if _, err := m.c.Upgrade(ctx, app.UpgradeRequest{Module: "store", Action: "rollback"}); err == nil || !strings.Contains(err.Error(), "--why") {
		t.Fatalf("a rollback without why: %v", err)
	}
	v, err = m.c.Upgrade(ctx, app.UpgradeRequest{Module: "store", Action: "rollback", Why: "2.0.0 is slow", Wait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range []string{"db1", "db2"} {
		if r := rollOutNode(t, v, n); r.Back != "returned" {
			t.Errorf("%s: %+v", n, r)
		}
		checkFor(t, settle, m.storeReady(n, "1.0.0"))
		if got := moduleVersionOn(t, hosts[i], "store"); got != "1.0.0" {
			t.Errorf("%s runs store %s", n, got)
		}
	}
	if !strings.HasPrefix(v.RollOut.Why, "rolled back by hand: 2.0.0 is slow") {
		t.Errorf("why: %q", v.RollOut.Why)
	}
	if _, err := m.c.Upgrade(ctx, app.UpgradeRequest{Module: "store", Action: "rollback", Why: "again"}); err == nil || !strings.Contains(err.Error(), "rolled back already") {
		t.Fatalf("a second rollback: %v", err)
	}
	t.Logf("took %s", time.Since(start))
}

// A serve stopped in the middle of a roll-out, and started again on the
// same stores, goes on with it where it was: every node ends on one
// version, the new one, and no node was moved twice.
func TestRollOut_ServeRestartedResumes(t *testing.T) {
	t.Parallel()
	start := time.Now()
	m, hosts := rollOutMesh(t, storeRunning("2.0.0", "exec sleep 1000"), "db1", "db2", "db3")
	ctx := context.Background()
	stopped := make(chan struct{})
	type result struct {
		v   app.UpgradeView
		err error
	}
	done := make(chan result, 1)
	go func() {
		// The command follows the store: the serve going away and coming
		// back does not end it.
		v, err := m.c.Upgrade(ctx, app.UpgradeRequest{Module: "store", Action: "roll-out", Canary: 1, Soak: 500 * time.Millisecond, Wait: 5 * time.Second,
			Progress: func(s string) {
				// db2 moved, not yet judged.
				if strings.HasPrefix(s, "db2 sent declaration") {
					close(stopped)
				}
			}})
		done <- result{v, err}
	}()
	select {
	case <-stopped:
	case r := <-done:
		t.Fatalf("the roll-out ended before the canary was ready: %+v %v", r.v, r.err)
	case <-time.After(settle):
		t.Fatal("the canary was not ready")
	}
	m.stop()
	m.start()
	var r result
	select {
	case r = <-done:
	case <-time.After(2 * settle):
		t.Fatal("the roll-out did not end after serve started again")
	}
	if r.err != nil || r.v.RollOut.Phase != inventory.RollOutDone {
		t.Fatalf("%+v %v", r.v.RollOut, r.err)
	}
	for i, n := range []string{"db1", "db2", "db3"} {
		checkFor(t, settle, m.storeReady(n, "2.0.0"))
		if got := moduleVersionOn(t, hosts[i], "store"); got != "2.0.0" {
			t.Errorf("%s runs store %s", n, got)
		}
	}
	acts, err := m.c.HandActs(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	moves := map[string]int{}
	for _, a := range acts.Acts {
		for _, n := range []string{"db1", "db2", "db3"} {
			if strings.Contains(a.What, "move "+n+" from") {
				moves[n]++
			}
		}
	}
	if moves["db1"] != 1 {
		t.Errorf("the canary was moved %d times: %v", moves["db1"], moves)
	}
	t.Logf("took %s", time.Since(start))
}

// A serve stopped while it rolls back, started again, finishes the
// rollback: the nodes end on the version they ran. db2's host is away
// through the roll-out, so the rollback waits for it when serve stops.
func TestRollOut_ServeRestartedRollingBack(t *testing.T) {
	t.Parallel()
	start := time.Now()
	m, hosts := rollOutMesh(t, storeUp("2.0.0", "exit 3"), "db1", "db2")
	hosts[1].stop()
	ctx := context.Background()
	stopped := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := m.c.Upgrade(ctx, app.UpgradeRequest{Module: "store", Action: "roll-out", Together: true, Wait: 2 * time.Second,
			Progress: func(s string) {
				if strings.HasPrefix(s, "db2 going back") {
					close(stopped)
				}
			}})
		done <- err
	}()
	select {
	case <-stopped:
	case err := <-done:
		t.Fatalf("the roll-out ended before it rolled back: %v", err)
	case <-time.After(settle):
		t.Fatal("the roll-out did not roll back")
	}
	m.stop()
	hosts[1].start()
	m.start()
	select {
	case err := <-done:
		if !errors.Is(err, app.ErrRollOutRolledBack) || !strings.Contains(err.Error(), "db2 back on store 1.0.0") {
			t.Fatal(err)
		}
	case <-time.After(2 * settle):
		t.Fatal("the rollback did not end after serve started again")
	}
	for _, n := range []string{"db1", "db2"} {
		checkFor(t, settle, m.storeReady(n, "1.0.0"))
	}
	t.Logf("took %s", time.Since(start))
}
