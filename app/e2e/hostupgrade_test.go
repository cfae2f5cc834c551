package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"mesh-controller/app"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/inventory"
)

// The hosts upgrading themselves (issue 31), with real mesh-host processes
// of two releases, real module processes, and the real controller.

// Two host releases, each mesh-host built with its version stamped and
// the fault hooks of a test build (acting only when MESH_FAULT names one).
const (
	hostV1 = "v9.1.0-e2e"
	hostV2 = "v9.2.0-e2e"
)

// buildHostRelease builds mesh-host stamped version, with the fault hooks,
// once per test binary.
func buildHostRelease(t testing.TB, version string) string {
	t.Helper()
	return buildProgramWith(t, "mesh-host", "../../cmd/mesh-host", "-tags", "faults", "-ldflags", "-X main.version="+version)
}

// hostUpgradeMesh is a mesh that declares what changes at once, and the
// two releases' binaries.
func hostUpgradeMesh(t *testing.T) (m *testMesh, v1, v2 string) {
	t.Helper()
	v1, v2 = buildHostRelease(t, hostV1), buildHostRelease(t, hostV2)
	m = newTestMesh(t)
	m.restartWith(app.ServeOptions{CatchUpEvery: 20 * time.Millisecond})
	return m, v1, v2
}

// realHost is a real mesh-host process running its own copy of a release
// (the host replaces its executable), started again when it exits, as a
// machine's service manager would (Restart=always), until the test ends.
type realHost struct {
	t     *testing.T
	node  string
	exe   string
	state string
	root  string
	logs  *syncBuffer
	// fault is MESH_FAULT for its first start (every start when always).
	fault  string
	always bool
	// onExit, if set, is told each exit before the host starts again.
	onExit func(starts int)

	mu      sync.Mutex
	pid     int
	starts  int
	stopped bool
	done    chan struct{}
}

// realHost joins node and runs a real mesh-host of release bin for it.
func (m *testMesh) realHost(t *testing.T, node, bin string, set func(*realHost)) *realHost {
	t.Helper()
	dir, st := m.joinState(t, node)
	h := &realHost{t: t, node: node, exe: filepath.Join(dir, "bin", "mesh-host"), state: st.Dir, root: filepath.Join(dir, "root"), logs: &syncBuffer{}, done: make(chan struct{})}
	if set != nil {
		set(h)
	}
	if err := os.MkdirAll(filepath.Dir(h.exe), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(h.exe, b, 0o755); err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	go h.serve(started)
	<-started
	t.Cleanup(func() {
		h.stop()
		if t.Failed() {
			t.Logf("%s's log:\n%s", node, h.logs.String())
		}
	})
	return h
}

// serve starts the host, and again each time it exits, until stopped.
func (h *realHost) serve(started chan<- struct{}) {
	defer close(h.done)
	for {
		h.mu.Lock()
		if h.stopped {
			h.mu.Unlock()
			return
		}
		cmd := exec.Command(h.exe, "run", "--state", h.state, "--root", h.root, "--heartbeat", "200ms", "--no-module-users", "--no-overlay-interface")
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "MESH_") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		if h.fault != "" && (h.always || h.starts == 0) {
			cmd.Env = append(cmd.Env, "MESH_FAULT="+h.fault)
		}
		cmd.Stdout, cmd.Stderr = h.logs, h.logs
		err := cmd.Start()
		if err == nil {
			h.pid = cmd.Process.Pid
			h.starts++
		}
		h.mu.Unlock()
		if started != nil {
			close(started)
			started = nil
		}
		if err != nil {
			h.t.Errorf("start %s: %v", h.node, err)
			return
		}
		cmd.Wait()
		h.mu.Lock()
		starts, stopped := h.starts, h.stopped
		h.mu.Unlock()
		if !stopped && h.onExit != nil {
			h.onExit(starts)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop ends the host with SIGTERM (its modules with it), and starts it no
// more.
func (h *realHost) stop() {
	h.mu.Lock()
	h.stopped = true
	pid := h.pid
	h.mu.Unlock()
	syscall.Kill(pid, syscall.SIGTERM)
	select {
	case <-h.done:
	case <-time.After(15 * time.Second):
		syscall.Kill(pid, syscall.SIGKILL)
		<-h.done
	}
}

// process is the host's pid and how many times it was started.
func (h *realHost) process() (pid, starts int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.pid, h.starts
}

// says is what the host's executable says it is, as a host checks it.
func says(t *testing.T, exe string) string {
	t.Helper()
	out, err := exec.Command(exe, "version").Output()
	if err != nil {
		t.Fatalf("%s version: %v", exe, err)
	}
	return strings.TrimPrefix(strings.TrimSpace(string(out)), "mesh-host ")
}

// hostRuns is a check that node's host says it runs version, and has
// applied its latest declaration.
func (m *testMesh) hostRuns(node, version string) func() error {
	return func() error {
		n := m.node(node)
		if n.HostVersion != version || n.Behind {
			return fmt.Errorf("%s's host runs %q (declared %q), applied %d of %d%s", node, n.HostVersion, n.HostRelease, n.SerialApplied, n.SerialDeclared, applyFailure(n))
		}
		return nil
	}
}

// pids are the pids of every module on the nodes, by node/module.
func (m *testMesh) pids(t *testing.T, nodes ...string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, n := range nodes {
		for _, s := range m.node(n).Modules {
			if s.State != protocol.StateReady || s.Pid == 0 {
				t.Fatalf("%s/%s is %s, pid %d", n, s.Module, s.State, s.Pid)
			}
			out[n+"/"+s.Module] = s.Pid
		}
	}
	return out
}

// hostRollOutNode is node's record in the hosts' last roll-out.
func hostRollOutNode(t *testing.T, v app.HostUpgradeView, node string) inventory.RollOutNode {
	t.Helper()
	return rollOutNodeOf(t, v.RollOut, node)
}

// A host release added and rolled out, a canary first, then a batch: every
// host re-executes itself (the same pid) on the new release, every module
// keeps running (the same pids, the example module's log going on), node
// list says what each host runs, the collection keeps the release; rolled
// back by hand, every host goes back to the release it ran from the binary
// it kept (the controller keeps no release of it), its modules running on.
func TestHostUpgrade_CanaryThenBatchModulesRunOn(t *testing.T) {
	t.Parallel()
	start := time.Now()
	m, v1, v2 := hostUpgradeMesh(t)
	ctx := context.Background()
	nodes := []string{"web1", "web2"}
	hosts := map[string]*realHost{}
	for _, n := range nodes {
		hosts[n] = m.realHost(t, n, v1, nil)
	}
	hello := filepath.Join(hosts["web1"].root, protocol.ModulesDir, "hello", "bin", "hello")
	if err := os.MkdirAll(filepath.Dir(hello), 0o755); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(buildHello(t)); err != nil || os.WriteFile(hello, b, 0o755) != nil {
		t.Fatalf("install hello: %v", err)
	}
	m.addModule(writeManifest(t, runningStore))
	m.addModule(helloOnFreePort(t))
	for _, n := range nodes {
		m.assign(t, n, "store")
	}
	m.assign(t, "web1", "hello")
	for _, n := range nodes {
		checkFor(t, settle, allOf(m.storeReady(n, "1.0.0"), m.hostRuns(n, hostV1)))
	}
	checkFor(t, settle, m.moduleIn("web1", "hello", protocol.StateReady))
	before := m.pids(t, nodes...)
	hostPids := map[string]int{}
	for n, h := range hosts {
		hostPids[n], _ = h.process()
	}

	rel, err := m.c.HostReleaseAdd(ctx, app.HostReleaseRequest{File: v2})
	if err != nil || !rel.Added || rel.Version != hostV2 || rel.Archive.Digest == "" {
		t.Fatalf("host release add: %+v %v", rel, err)
	}
	var said []string
	v, err := m.c.HostUpgrade(ctx, app.HostUpgradeRequest{To: hostV2, Canary: 1, Batch: "100%", Wait: 30 * time.Second, Soak: 300 * time.Millisecond,
		Progress: func(s string) { said = append(said, s) }})
	if err != nil {
		t.Fatalf("host upgrade: %v\n%s", err, strings.Join(said, "\n"))
	}
	if v.RollOut.Phase != inventory.RollOutDone || v.RollOut.Kind != inventory.RollOutOfHost {
		t.Fatalf("the roll-out: %+v", v.RollOut)
	}
	for i, n := range nodes {
		r := hostRollOutNode(t, v, n)
		if r.Result != "ready" || r.From != hostV1 || r.Batch != min(i, 1) {
			t.Errorf("%s: %+v", n, r)
		}
		checkFor(t, settle, m.hostRuns(n, hostV2))
		if pid, starts := hosts[n].process(); pid != hostPids[n] || starts != 1 {
			t.Errorf("%s's host: pid %d (was %d), started %d times", n, pid, hostPids[n], starts)
		}
		if got := says(t, hosts[n].exe); got != hostV2 {
			t.Errorf("%s's executable says %s", n, got)
		}
	}
	if after := m.pids(t, nodes...); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("modules restarted across the hosts' upgrade: %v, were %v", after, before)
	}
	// The example module's log goes on through the pipe its host handed over.
	var lines []string
	if err := m.c.Logs(ctx, "web1", "hello", 50, false, func(l []string) error { lines = append(lines, l...); return nil }); err != nil ||
		!strings.Contains(strings.Join(lines, "\n"), "adopted pid") {
		t.Fatalf("hello's log after the upgrade: %q %v", lines, err)
	}
	listed, err := m.c.NodeList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range listed {
		if n.HostVersion != hostV2 || n.HostRelease != hostV2 {
			t.Errorf("node list: %s runs %q, declared %q", n.Name, n.HostVersion, n.HostRelease)
		}
	}
	col, err := m.c.Collection(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range col.Archives {
		if k.Digest == rel.Archive.Digest && (k.MayGo || len(k.RunOn) != 2 || fmt.Sprint(k.Held) != "[mesh-host@"+hostV2+"]") {
			t.Errorf("the collection: %+v", k)
		}
	}
	m.handActsSay(t, "roll-out mesh-host "+hostV2+" to 2 nodes", "batch 0: move web1 from "+hostV1+" to "+hostV2, "batch 1: web2 on mesh-host "+hostV2+": ready")

	v, err = m.c.HostUpgrade(ctx, app.HostUpgradeRequest{Rollback: true, Why: "the test goes back", Wait: 30 * time.Second})
	if err != nil {
		t.Fatalf("rollback: %v", err)
	}
	for _, n := range nodes {
		if r := hostRollOutNode(t, v, n); r.Back != "returned" {
			t.Errorf("%s: %+v", n, r)
		}
		checkFor(t, settle, m.hostRuns(n, hostV1))
		if pid, _ := hosts[n].process(); pid != hostPids[n] {
			t.Errorf("%s's host: pid %d (was %d)", n, pid, hostPids[n])
		}
	}
	if after := m.pids(t, nodes...); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("modules restarted across the hosts' rollback: %v, were %v", after, before)
	}
	t.Logf("took %s", time.Since(start))
}

// A release that cannot come up past its exec (a test build's hook kills
// it at each start on trial; the test restarts it, as a service manager
// would): after its trial starts its host goes back to the binary it ran,
// refuses the release in its apply report, and the roll-out puts every
// host it moved back, the canary that had upgraded well with its modules
// running on.
func TestHostUpgrade_FailureRollsBack(t *testing.T) {
	t.Parallel()
	start := time.Now()
	m, v1, v2 := hostUpgradeMesh(t)
	ctx := context.Background()
	good := m.realHost(t, "a1", v1, nil)
	bad := m.realHost(t, "b1", v1, func(h *realHost) { h.fault, h.always = "host-upgrade-after-exec", true })
	m.addModule(writeManifest(t, runningStore))
	for _, n := range []string{"a1", "b1"} {
		m.assign(t, n, "store")
		checkFor(t, settle, allOf(m.storeReady(n, "1.0.0"), m.hostRuns(n, hostV1)))
	}
	before := m.pids(t, "a1")
	goodPid, _ := good.process()
	if _, err := m.c.HostReleaseAdd(ctx, app.HostReleaseRequest{File: v2}); err != nil {
		t.Fatal(err)
	}
	var said []string
	v, err := m.c.HostUpgrade(ctx, app.HostUpgradeRequest{To: hostV2, Canary: 1, Wait: 30 * time.Second, Soak: 200 * time.Millisecond,
		Progress: func(s string) { said = append(said, s) }})
	if !errors.Is(err, app.ErrRollOutRolledBack) {
		t.Fatalf("a release that cannot come up: %v\n%s", err, strings.Join(said, "\n"))
	}
	if r := hostRollOutNode(t, v, "a1"); r.Result != "ready" || r.Back != "returned" {
		t.Errorf("the canary: %+v", r)
	}
	r := hostRollOutNode(t, v, "b1")
	if r.Result != "failed" || r.Back != "returned" || !strings.Contains(r.Error, "mesh-host "+hostV2+" failed here already (mesh-host "+hostV2+" did not come up: started 2 times") {
		t.Errorf("b1: %+v", r)
	}
	for _, n := range []string{"a1", "b1"} {
		checkFor(t, settle, m.hostRuns(n, hostV1))
	}
	if after := m.pids(t, "a1"); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("a1's modules restarted: %v, were %v", after, before)
	}
	if pid, starts := good.process(); pid != goodPid || starts != 1 {
		t.Errorf("a1's host: pid %d (was %d), started %d times", pid, goodPid, starts)
	}
	if _, starts := bad.process(); starts != 3 {
		t.Errorf("b1's host started %d times, not 3 (its own, then once each trial start that died)", starts)
	}
	if got := says(t, bad.exe); got != hostV1 {
		t.Errorf("b1's executable says %s", got)
	}
	checkFor(t, settle, m.storeReady("b1", "1.0.0"))
	if !strings.Contains(err.Error(), "b1 back on mesh-host "+hostV1) || !strings.Contains(err.Error(), "a1 back on mesh-host "+hostV1) {
		t.Errorf("the error: %v", err)
	}
	t.Logf("took %s", time.Since(start))
}

// A host killed at each point of its own upgrade comes back, started
// again, on one of its two binaries, never none, and converges: before
// the rename, on the old one, which applies the declaration again; after
// the rename and before the exec, and after the exec before the report, on
// the new one, which reports it done.
func TestHostUpgrade_KilledMidUpgrade(t *testing.T) {
	t.Parallel()
	start := time.Now()
	m, v1, v2 := hostUpgradeMesh(t)
	ctx := context.Background()
	points := map[string]struct{ fault, after string }{
		"k1": {"host-upgrade-before-rename", hostV1},
		"k2": {"host-upgrade-before-exec", hostV2},
		"k3": {"host-upgrade-after-exec", hostV2},
	}
	var mu sync.Mutex
	cameBack := map[string]string{}
	hosts := map[string]*realHost{}
	for node, p := range points {
		hosts[node] = m.realHost(t, node, v1, func(h *realHost) {
			h.fault = p.fault
			h.onExit = func(int) {
				// Killed: what it starts again on is a binary that runs.
				mu.Lock()
				cameBack[node] = says(t, h.exe)
				mu.Unlock()
			}
		})
	}
	for node := range points {
		checkFor(t, settle, m.hostRuns(node, hostV1))
	}
	if _, err := m.c.HostReleaseAdd(ctx, app.HostReleaseRequest{File: v2}); err != nil {
		t.Fatal(err)
	}
	var said []string
	_, err := m.c.HostUpgrade(ctx, app.HostUpgradeRequest{To: hostV2, Canary: 0, Batch: "100%", Wait: 60 * time.Second,
		Progress: func(s string) { said = append(said, s) }})
	if err != nil {
		t.Fatalf("host upgrade: %v\n%s", err, strings.Join(said, "\n"))
	}
	for node, p := range points {
		checkFor(t, settle, m.hostRuns(node, hostV2))
		mu.Lock()
		back := cameBack[node]
		mu.Unlock()
		if back != p.after {
			t.Errorf("%s, killed at %s, came back on %q, not %s", node, p.fault, back, p.after)
		}
		if _, starts := hosts[node].process(); starts != 2 {
			t.Errorf("%s was started %d times, not 2", node, starts)
		}
		if got := says(t, hosts[node].exe); got != hostV2 {
			t.Errorf("%s's executable says %s", node, got)
		}
	}
	t.Logf("took %s", time.Since(start))
}

// A host upgrading itself under 50 running modules (MESH_MEASURE=1; not in
// make test): every module's pid is unchanged, and the time from the
// declaration sent to the host back on the release and reporting it
// applied is logged.
//
//	MESH_MEASURE=1 go test -count=1 -run TestHostUpgrade_Measure50Modules -v ./app/e2e/
func TestHostUpgrade_Measure50Modules(t *testing.T) {
	if os.Getenv("MESH_MEASURE") != "1" {
		t.Skip("a measurement: MESH_MEASURE=1 runs it")
	}
	m, v1, v2 := hostUpgradeMesh(t)
	ctx := context.Background()
	h := m.realHost(t, "big1", v1, nil)
	const modules = 50
	var names []string
	for i := 1; i <= modules; i++ {
		name := fmt.Sprintf("m%02d", i)
		names = append(names, name)
		m.addModule(writeManifest(t, fmt.Sprintf(`{"module": %q, "version": "1.0.0", "run": {"command": ["sh", "-c", "exec sleep 100000"], "ready": {"after": "100ms"}}}`, name)))
	}
	m.assign(t, "big1", names...)
	checkFor(t, 2*settle, func() error {
		ready := 0
		for _, s := range m.node("big1").Modules {
			if s.State == protocol.StateReady {
				ready++
			}
		}
		if ready != modules {
			return fmt.Errorf("%d of %d modules ready", ready, modules)
		}
		return nil
	})
	checkFor(t, settle, m.hostRuns("big1", hostV1))
	before := m.pids(t, "big1")
	hostPid, _ := h.process()
	if _, err := m.c.HostReleaseAdd(ctx, app.HostReleaseRequest{File: v2}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	at := map[string]time.Time{}
	progress := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		for _, w := range []string{"sent declaration", "applied declaration", "runs mesh-host"} {
			if strings.Contains(s, w) && at[w].IsZero() {
				at[w] = time.Now()
			}
		}
	}
	started := time.Now()
	if _, err := m.c.HostUpgrade(ctx, app.HostUpgradeRequest{To: hostV2, Wait: time.Minute, Soak: time.Second, Progress: progress}); err != nil {
		t.Fatal(err)
	}
	if after := m.pids(t, "big1"); fmt.Sprint(after) != fmt.Sprint(before) || len(after) != modules {
		t.Fatalf("modules restarted: %d of %d pids the same", same(before, after), modules)
	}
	if pid, starts := h.process(); pid != hostPid || starts != 1 {
		t.Fatalf("the host: pid %d (was %d), started %d times", pid, hostPid, starts)
	}
	n := m.node("big1")
	t.Logf("%d modules, every pid unchanged; declaration sent %s after the roll-out was asked; host back on %s and its apply reported %s after the declaration was sent (ready, its modules checked, %s after); the new host's apply took %.1f ms",
		modules, at["sent declaration"].Sub(started).Round(time.Millisecond), hostV2, at["applied declaration"].Sub(at["sent declaration"]).Round(time.Millisecond),
		at["runs mesh-host"].Sub(at["sent declaration"]).Round(time.Millisecond), n.LastApply.TotalMS)
	for _, line := range strings.Split(h.logs.String(), "\n") {
		if strings.Contains(line, "upgrading to") || strings.Contains(line, "upgraded from") || strings.Contains(line, "applied declaration") && strings.Contains(line, " in ") {
			t.Log(line)
		}
	}
}

// same counts the keys of a whose value b has too.
func same(a, b map[string]int) int {
	n := 0
	for k, v := range a {
		if b[k] == v {
			n++
		}
	}
	return n
}
