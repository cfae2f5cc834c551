package app

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

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

// builderWith is builderOn with the host's supervisor given: a test that
// kills the builder keeps it from being restarted behind its back.
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
	waitFor(t, "the builder ready on "+node, func() bool { return m.moduleState(node, "builder").State == protocol.StateReady })
	return h
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
	st, err := m.c.stores(context.Background())
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
	m := newTestMesh(t)
	clk := m.withClock()
	m.builderWith(t, "b1", &host.Supervisor{BackoffBase: time.Hour, BackoffCap: 2 * time.Hour, ResetAfter: time.Hour})
	builderPid := m.moduleState("b1", "builder").Pid
	if !alive(builderPid) {
		t.Fatalf("the builder's pid %d is not a living process", builderPid)
	}
	repo := scriptRepo(t, "hangs", "exec sleep 4322")
	ctx := context.Background()
	a, err := m.c.Build(ctx, BuildRequest{Repository: repo, NoWait: true})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the build in flight on b1", func() bool {
		got := m.ask(t, a.ID)
		return got.State == builds.InFlight && got.Builder == "b1/builder"
	})
	// The build command is the builder's own child (run in a session of
	// its own, so the supervisor's kill of the module's group misses it).
	var sleeper int
	waitFor(t, "the build command running under the builder", func() bool {
		out, _ := exec.Command("pgrep", "-P", strconv.Itoa(builderPid), "-x", "sleep").Output()
		if f := strings.Fields(string(out)); len(f) == 1 {
			sleeper, _ = strconv.Atoi(f[0])
		}
		return sleeper > 0
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
	waitFor(t, "b1's host to report the builder killed and not restarted", func() bool {
		s := m.moduleState("b1", "builder")
		return s.State == protocol.StateBackingOff && strings.Contains(s.LastExit, "killed")
	})
	waitFor(t, "the build's process gone with its builder", func() bool { return !alive(sleeper) })

	// Past the in-flight bound: the try is given up, the ask waits again.
	// The dispatcher is kicked over a connection made before the clock
	// moves (a command dials the broker the lease names, and the lease
	// looks expired until the daemon renews it on the moved clock).
	kicker := m.controllerConn(t)
	kick := func() {
		t.Helper()
		if err := kicker.Publish(BuildKickSubject, []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	clk.advance(inventory.DefaultBuildTimeout + buildTryMargin + time.Minute)
	kick()
	requeued := "build " + a.ID + ": no outcome from b1/builder in time; asked again"
	waitFor(t, "the daemon to ask again: "+requeued, func() bool { return strings.Contains(m.logs.String(), requeued) })
	if got := m.ask(t, a.ID); got.State != builds.Waiting || got.Tries != 1 || got.LastTryAt == nil {
		t.Fatalf("after its try was given up: %+v", got)
	}
	// Past the waiting bound, counted from the try given up: dead.
	clk.advance(askWaitBound + time.Minute)
	kick()
	died := "build " + a.ID + ": no builder took it within " + askWaitBound.String() + ": dead"
	waitFor(t, "the daemon to say: "+died, func() bool { return strings.Contains(m.logs.String(), died) })
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
