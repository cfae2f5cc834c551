package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"mesh-controller/app"
	"mesh-controller/app/builder"
	"mesh-controller/app/host"
	"mesh-controller/app/process"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/builds"
	"mesh-controller/contexts/inventory"
)

// testClock is a controller's clock that a test moves forward instead of
// sleeping: the daemon's goroutines read it, race-free, as the test moves it.
type testClock struct{ ahead atomic.Int64 }

func (c *testClock) now() time.Time          { return time.Now().Add(time.Duration(c.ahead.Load())) }
func (c *testClock) advance(d time.Duration) { c.ahead.Add(int64(d)) }

// withClock gives the controller a clock the test moves. The daemon takes
// the controller's clock when it starts, so it is restarted: the clock is
// set while nothing serves, and read by everything started after.
func (m *testMesh) withClock() *testClock {
	m.t.Helper()
	clk := &testClock{}
	m.stop()
	m.c.Now = clk.now
	m.start()
	return clk
}

// builderWith joins a host that runs mesh-builder as the builder module,
// holding the build seat, whose runner uses sup if given (a test that
// kills the builder keeps it from being restarted behind its back), and
// waits until it is ready.
func (m *testMesh) builderWith(t testing.TB, node string, sup *host.Supervisor) *testHost {
	t.Helper()
	bin := buildBuilder(t)
	h := m.joinWith(node, sup)
	m.addModule(writeManifest(t, `{"module": "builder", "version": "1.0.0", "run": {"command": ["`+bin+`"], "ready": {"after": "300ms"}},
		"seats": [{"seat": "build", "delivers": "builds of module sources", "replicated": true}],
		"data": [{"name": "work", "path": "/var/lib/builder/work", "precious": "rebuildable"}]}`))
	if _, err := m.c.Assign(context.Background(), node, []string{"builder"}); err != nil {
		t.Fatal(err)
	}
	checkFor(t, settle, m.moduleIn(node, "builder", protocol.StateReady))
	return h
}

// sandboxVisibleDir is a new dir a build's command can see, for a test to
// signal it through: not beneath /tmp, which a build's sandbox covers
// whole (app/builder), and open for others to enter, since a build runs as
// a user of its own.
func sandboxVisibleDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("/var/lib", "mesh-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// scriptRepo makes a local bare git repository whose mesh.json builds
// module 1.0.0 by running script with sh, its outputs bin/.
func scriptRepo(t testing.TB, module, script string) string {
	t.Helper()
	base := t.TempDir()
	bare, work := filepath.Join(base, module+".git"), filepath.Join(base, "work")
	git(t, base, "init", "-q", "--bare", "-b", "main", bare)
	git(t, base, "init", "-q", "-b", "main", work)
	manifest, err := json.Marshal(map[string]any{"module": module, "version": "1.0.0",
		"build": map[string]any{"command": []string{"sh", "-c", script}, "outputs": []string{"bin/"}},
		"run":   map[string]any{"command": []string{"bin/x"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(work, "mesh.json"), manifest, 0o644); err != nil {
		t.Fatal(err)
	}
	git(t, work, "add", ".")
	git(t, work, "commit", "-q", "-m", module)
	git(t, work, "push", "-q", bare, "main")
	return bare
}

// ask reads one ask as the stores hold it now.
func (m *testMesh) ask(t testing.TB, id string) builds.Ask {
	t.Helper()
	st, err := m.c.Stores(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	a, err := st.Builds.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// A builder killed with SIGKILL in the middle of a build (its host's
// supervisor holding back the restart for an hour, so the builder is gone
// while its host still beats and its node still holds the build seat):
// the build's own process dies with it; past the in-flight bound the ask
// goes back to waiting with its try counted; offered to a seat holder
// that does not answer, it is not taken; past the waiting bound it is
// dead. The daemon's log says each step.
func TestBuild_BuilderDiesMidBuild(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	clk := m.withClock()
	m.builderWith(t, "b1", &host.Supervisor{BackoffBase: time.Hour, BackoffCap: 2 * time.Hour, ResetAfter: time.Hour})
	builderPid := m.moduleState("b1", "builder").Pid
	if !alive(builderPid) {
		t.Fatalf("the builder's pid %d is not a living process", builderPid)
	}
	repo := scriptRepo(t, "hangs", "exec sleep 4322")
	ctx := context.Background()
	a, err := m.c.Build(ctx, app.BuildRequest{Repository: repo, NoWait: true})
	if err != nil {
		t.Fatal(err)
	}
	checkFor(t, settle, m.inFlightOn(t, a.ID, "b1/builder"))
	// The build command is the builder's own child (run in a session of
	// its own, so the supervisor's kill of the module's group misses it).
	var sleeper int
	checkFor(t, settle, func() error {
		out, _ := exec.Command("pgrep", "-P", strconv.Itoa(builderPid), "-x", "sleep").Output()
		if f := strings.Fields(string(out)); len(f) == 1 {
			sleeper, _ = strconv.Atoi(f[0])
			return nil
		}
		return fmt.Errorf("not one build command (sleep) under the builder, pid %d: %q", builderPid, out)
	})
	// Should it outlive the test, it is killed after (if still the same
	// process: its pid is not taken by another since it started).
	started, err := process.StartTicks(sleeper)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if now, err := process.StartTicks(sleeper); err == nil && now == started {
			syscall.Kill(sleeper, syscall.SIGKILL)
		}
	})

	if err := syscall.Kill(builderPid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	checkFor(t, settle, func() error {
		if s := m.moduleState("b1", "builder"); s.State != protocol.StateBackingOff || !strings.Contains(s.LastExit, "killed") {
			return fmt.Errorf("b1's host reports the builder %s (last exit %q), not killed and backing off", s.State, s.LastExit)
		}
		return nil
	})
	checkFor(t, settle, stopped(sleeper, "the build's process"))

	// Past the in-flight bound: the try is given up, the ask waits again.
	// The dispatcher is kicked over a connection made before the clock
	// moves (a command dials the broker the lease names, and the lease
	// looks expired until the daemon renews it on the moved clock).
	kicker := m.controllerConn(t)
	kick := func() {
		t.Helper()
		if err := kicker.Publish(app.BuildKickSubject, []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	clk.advance(inventory.DefaultBuildTimeout + app.BuildTryMargin + time.Minute)
	kick()
	requeued := "build " + a.ID + ": no outcome from b1/builder in time; asked again"
	checkFor(t, settle, m.logSays(requeued))
	if got := m.ask(t, a.ID); got.State != builds.Waiting || got.Tries != 1 || got.LastTryAt == nil {
		t.Fatalf("after its try was given up: %+v", got)
	}
	// Past the waiting bound, counted from the try given up: dead.
	clk.advance(app.AskWaitBound + time.Minute)
	kick()
	died := "build " + a.ID + ": no builder took it within " + app.AskWaitBound.String() + ": dead"
	checkFor(t, settle, m.logSays(died))
	got := m.ask(t, a.ID)
	if got.State != builds.Dead || got.Tries != 1 || got.FinishedAt == nil || !strings.Contains(got.Why, "no builder took it") {
		t.Fatalf("after the waiting bound: %+v", got)
	}
	if logs := m.logs.String(); strings.Count(logs, "build "+a.ID+": taken by") != 1 || strings.Contains(logs, "(taken in by serve)") {
		t.Fatalf("the ask taken again, or an outcome sent, after its builder died:\n%s", logs)
	}
	if s := m.moduleState("b1", "builder"); s.State != protocol.StateBackingOff || alive(builderPid) {
		t.Fatalf("the builder came back during the test: %+v", s)
	}
}

// The build queue across restarts of the serving controller. Asks queued
// while no module holds the build seat wait; a builder takes the oldest,
// whose build waits on a gate the test opens. The controller restarts
// while it builds: the new one finds the same queue (the build in flight
// on the same builder, its try not given up; the others waiting), the
// builder comes back through the new broker still busy with it, and the
// outcome it sends once the gate opens is taken in by the new controller
// and the version registered. The asks that waited are then taken; one
// (a dry run: no archive to store) ends while no controller serves at
// all, and the outcome its builder sends then is taken in by the
// controller started after.
func TestBuild_QueueAcrossControllerRestart(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	ctx := context.Background()
	gated := func(module string) (repo, gate string) {
		gate = filepath.Join(sandboxVisibleDir(t), "gate")
		return scriptRepo(t, module, "while [ ! -e '"+gate+"' ]; do sleep 0.05; done; mkdir -p bin && echo "+module+" > bin/x"), gate
	}
	first, gate1 := gated("gated")
	last, gate2 := gated("later")
	quick := scriptRepo(t, "quick", "mkdir -p bin && echo quick > bin/x")

	var asks []builds.Ask
	for _, r := range []app.BuildRequest{{Repository: first}, {Repository: quick}, {Repository: last, DryRun: true}} {
		r.NoWait = true
		a, err := m.c.Build(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if a.State != builds.Waiting {
			t.Fatalf("queued with no builder: %+v", a)
		}
		asks = append(asks, a)
		if len(asks) == 1 {
			// Asks asked within one millisecond go in the order of their
			// ids: the gated one is to be the oldest.
			checkFor(t, settle, func() error {
				if now := m.c.Now().Truncate(time.Millisecond); !now.After(a.AskedAt) {
					return fmt.Errorf("the clock says %s, not a millisecond after the first ask at %s", now.Format(time.RFC3339Nano), a.AskedAt.Format(time.RFC3339Nano))
				}
				return nil
			})
		}
	}

	// A builder: the oldest ask is its; the others wait (it is busy).
	b1 := m.builderOn(t, "b1")
	st, err := m.c.Stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m.c.KickBuilds(ctx, st)
	checkFor(t, settle, m.inFlightOn(t, asks[0].ID, "b1/builder"))
	taken := *m.ask(t, asks[0].ID).TakenAt

	m.restartWith(app.ServeOptions{})
	if got := m.ask(t, asks[0].ID); got.State != builds.InFlight || got.Builder != "b1/builder" || !got.TakenAt.Equal(taken) || got.Tries != 0 {
		t.Fatalf("the build in flight after the restart: %+v", got)
	}
	for _, a := range asks[1:] {
		if got := m.ask(t, a.ID); got.State != builds.Waiting || got.Tries != 0 {
			t.Fatalf("a waiting ask after the restart: %+v", got)
		}
	}
	// The builder is back, through the new controller's broker, still busy
	// with the same build: a probe ask is answered so.
	nc := m.controllerConn(t)
	probe, _ := json.Marshal(builder.Ask{ID: "b-probe", Repository: quick})
	checkFor(t, settle, func() error {
		reply, err := nc.Request(protocol.BuildAskSubject("b1"), probe, time.Second)
		if err != nil {
			return fmt.Errorf("the builder does not answer through the new controller's broker: %w", err)
		}
		var bt protocol.BuildTaken
		if json.Unmarshal(reply.Data, &bt) != nil || bt.Taken || bt.Why != "busy with "+asks[0].ID {
			t.Fatalf("the builder's answer after the restart: %s", reply.Data)
		}
		return nil
	})

	// The build ends now: its archive and outcome go to the new controller.
	if err := os.WriteFile(gate1, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	done := m.waitEnded(t, asks[0].ID, nc)
	if done.State != builds.Done || !done.Registered || done.Late || done.Module != "gated" || done.Version != "1.0.0" || done.Digest == "" {
		t.Fatalf("the build across the restart: %+v\n%s", done, m.logs.String())
	}
	snap, err := st.Inventory.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if cur := snap.Current["gated"]; cur != "1.0.0" {
		t.Fatalf("gated's current version %q, want 1.0.0", cur)
	}
	if got := snap.Archives["gated@1.0.0"]; got.Digest != done.Digest {
		t.Fatalf("gated 1.0.0's archive %+v, the build's %s", got, done.Digest)
	}
	if mod, err := st.Inventory.Module(ctx, "gated"); err != nil || mod.Source != first {
		t.Fatalf("gated's module: %+v %v", mod, err)
	}
	// The daemon says so once the stores hold it.
	registered := "build " + asks[0].ID + ": gated 1.0.0 registered from"
	checkFor(t, settle, m.logSays(registered))

	// The asks that waited through the restart are taken in turn (these
	// two were asked within a millisecond or not: either may go first).
	// The dry run waits on its gate.
	kick := m.kicker(nc)
	checkFor(t, settle, func() error {
		kick()
		if got := m.ask(t, asks[2].ID); got.State != builds.InFlight {
			return fmt.Errorf("the dry run is %s, not in flight on b1: %s", got.State, got.Why)
		}
		return nil
	})
	// No controller serves when it ends: the builder's work dir for it is
	// removed as Build returns, and the outcome is sent next.
	m.stop()
	work := filepath.Join(b1.root, "var/lib/builder/work", "build-"+asks[2].ID+"-*")
	if dirs, _ := filepath.Glob(work); len(dirs) != 1 {
		t.Fatalf("the dry run's work dir: %v", dirs)
	}
	if err := os.WriteFile(gate2, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	checkFor(t, settle, func() error {
		if dirs, _ := filepath.Glob(work); len(dirs) != 0 {
			return fmt.Errorf("the dry run has not ended on b1: its work dir is there, %q", dirs)
		}
		return nil
	})
	if got := m.ask(t, asks[2].ID); got.State != builds.InFlight {
		t.Fatalf("the dry run's outcome recorded with no controller serving: %+v", got)
	}
	m.start()
	nc = m.controllerConn(t)
	if got := m.waitEnded(t, asks[2].ID, nc); got.State != builds.Done || !got.DryRun || got.Registered || got.Late || got.Module != "later" || got.Digest == "" {
		t.Fatalf("the dry run across the restart: %+v\n%s", got, m.logs.String())
	}
	checkFor(t, settle, func() error {
		if l := m.logLine("build " + asks[2].ID + " of "); !strings.Contains(l, "a dry run, done") || !strings.Contains(l, "looked at, nothing registered") {
			return fmt.Errorf("the daemon does not say it looked at the dry run: %q", l)
		}
		return nil
	})
	if got := m.waitEnded(t, asks[1].ID, nc); got.State != builds.Done || !got.Registered || got.Module != "quick" || got.Builder != "b1/builder" {
		t.Fatalf("the quick build: %+v", got)
	}
}

// kicker returns a func that kicks the dispatcher over nc, at most every
// 200ms however often it is called: an ask offered while its builder was
// still busy waits otherwise for the next round (daemon.DispatchEvery).
func (m *testMesh) kicker(nc *nats.Conn) func() {
	var kicked time.Time
	return func() {
		if time.Since(kicked) > 200*time.Millisecond {
			nc.Publish(app.BuildKickSubject, []byte("{}"))
			kicked = time.Now()
		}
	}
}

// logLine is the daemon's first log line holding s, "" if none.
func (m *testMesh) logLine(s string) string {
	for _, l := range strings.Split(m.logs.String(), "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}

// waitEnded waits until an ask is no longer waiting or in flight, nor done
// and waiting for its registration, kicking the dispatcher over nc, and
// returns it.
func (m *testMesh) waitEnded(t *testing.T, id string, nc *nats.Conn) builds.Ask {
	t.Helper()
	var a builds.Ask
	kick := m.kicker(nc)
	checkFor(t, settle, func() error {
		kick()
		a = m.ask(t, id)
		if a.State != builds.Waiting && a.State != builds.InFlight && (a.State != builds.Done || a.Registered || a.DryRun || a.Why != "") {
			return nil
		}
		return fmt.Errorf("build %s has not ended: %s on %q, registered %v (%s)", id, a.State, a.Builder, a.Registered, a.Why)
	})
	return a
}

// inFlightOn is a check that ask id is in flight on builder; it says where
// the ask is instead.
func (m *testMesh) inFlightOn(t testing.TB, id, builder string) func() error {
	return func() error {
		if a := m.ask(t, id); a.State != builds.InFlight || a.Builder != builder {
			return fmt.Errorf("build %s is %s on %q, not in flight on %s: %s", id, a.State, a.Builder, builder, a.Why)
		}
		return nil
	}
}
