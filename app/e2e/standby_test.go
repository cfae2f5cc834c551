package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"mesh-controller/app"
	"mesh-controller/app/apptest"
	"mesh-controller/app/daemon"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/health"
)

// programs are the programs the tests built, by package: each is built once
// per test binary.
var programs sync.Map // package → func() (string, error)

// programsDir holds what buildProgram builds; TestMain removes it, so a
// run leaves no binaries behind in the temporary dir.
var programsDir = sync.OnceValues(func() (string, error) { return os.MkdirTemp("", "mesh-e2e-programs-") })

// buildProgram builds the Go program in pkg (relative to app/), static as
// it ships, once per test binary, and returns its path.
func buildProgram(t testing.TB, name, pkg string) string {
	t.Helper()
	return buildProgramWith(t, name, pkg)
}

// buildProgramWith is buildProgram with go build's flags (a build tag, a
// version stamped): each pkg and flags built once per test binary.
func buildProgramWith(t testing.TB, name, pkg string, flags ...string) string {
	t.Helper()
	build, _ := programs.LoadOrStore(strings.Join(append([]string{pkg}, flags...), " "), sync.OnceValues(func() (string, error) {
		root, err := programsDir()
		if err != nil {
			return "", err
		}
		dir, err := os.MkdirTemp(root, name+"-")
		if err != nil {
			return "", err
		}
		bin := filepath.Join(dir, name)
		cmd := exec.Command("go", append(append([]string{"build"}, flags...), "-o", bin, pkg)...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", errors.New(string(out))
		}
		return bin, nil
	}))
	bin, err := build.(func() (string, error))()
	if err != nil {
		t.Fatalf("build %s: %v", name, err)
	}
	return bin
}

// buildController builds mesh-controller: the standby tests kill and pause
// real serve processes.
func buildController(t testing.TB) string {
	return buildProgram(t, "mesh-controller", "../../cmd/mesh-controller")
}

// outLine is a line a serve process wrote, and when the test read it.
type outLine struct {
	at   time.Time
	text string
}

// serveProc is a real 'mesh-controller serve' process; its stdout and
// stderr lines are kept as they come, each with when it was read.
type serveProc struct {
	name string
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  []outLine
	done chan struct{}
}

// startServeProc starts serve on data's stores and the external broker.
func startServeProc(t *testing.T, name, data, broker string, args ...string) *serveProc {
	t.Helper()
	return startProc(t, name, buildController(t), append([]string{"--data", data, "--broker", broker, "serve", "--catch-up-every", "200ms"}, args...)...)
}

// startProc starts a real program (a controller's serve, a host's run) with
// args and without the test's MESH_ variables; its output lines are kept as
// they come. It is stopped (SIGTERM, SIGKILL after 15 s) when the test ends.
func startProc(t *testing.T, name, bin string, args ...string) *serveProc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MESH_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	p := &serveProc{name: name, cmd: cmd, done: make(chan struct{})}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var readers sync.WaitGroup
	for _, r := range []io.Reader{stdout, stderr} {
		readers.Go(func() {
			sc := bufio.NewScanner(r)
			for sc.Scan() {
				p.mu.Lock()
				p.out = append(p.out, outLine{at: time.Now(), text: sc.Text()})
				p.mu.Unlock()
			}
		})
	}
	go func() {
		readers.Wait()
		cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.cmd.Process.Signal(syscall.SIGCONT)
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s (pid %d) said:\n%s", p.name, p.pid(), p.text())
		}
	})
	return p
}

func (p *serveProc) pid() int { return p.cmd.Process.Pid }

func (p *serveProc) text() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	for _, l := range p.out {
		fmt.Fprintf(&b, "  %s | %s\n", l.at.Format("15:04:05.000"), l.text)
	}
	return b.String()
}

// find is the first line (from the from'th on) matching re, and its index.
func (p *serveProc) find(re *regexp.Regexp, from int) (outLine, int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := from; i < len(p.out); i++ {
		if re.MatchString(p.out[i].text) {
			return p.out[i], i, true
		}
	}
	return outLine{}, 0, false
}

func (p *serveProc) lines() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.out)
}

// wait is the first line from the from'th on matching pattern, waiting
// for it within the bound; the test fails, saying what the process said,
// if it does not come (or the process ends first).
func (p *serveProc) wait(t *testing.T, within time.Duration, pattern string, from int) (outLine, int) {
	t.Helper()
	re := regexp.MustCompile(pattern)
	var got outLine
	var at int
	checkFor(t, within, func() error {
		var ok bool
		if got, at, ok = p.find(re, from); ok {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s ended without saying %q:\n%s", p.name, pattern, p.text())
		default:
		}
		return fmt.Errorf("%s has not said %q:\n%s", p.name, pattern, p.text())
	})
	return got, at
}

const (
	readyLine   = `^ready: broker nats://`
	standbyLine = `^standby: pid \d+ on .* serves \(lease generation \d+\) until `
	// sentLine is a catch-up's declaration sent: node, serial.
	sentLine = `msg="behind its plan: declaration sent" node=(\S+) serial=(\d+)`
)

// sent is every node/serial a controller said it sent, in order.
func (p *serveProc) sent() [][2]string {
	re := regexp.MustCompile(sentLine)
	p.mu.Lock()
	defer p.mu.Unlock()
	var out [][2]string
	for _, l := range p.out {
		if m := re.FindStringSubmatch(l.text); m != nil {
			out = append(out, [2]string{m[1], m[2]})
		}
	}
	return out
}

// controllersShown is what 'broker show --json' says of the controllers.
func controllersShown(t *testing.T, data, broker string) app.ControllersView {
	t.Helper()
	out, err := exec.Command(buildController(t), "--data", data, "--broker", broker, "broker", "show", "--json").Output()
	if err != nil {
		t.Fatalf("broker show: %v", err)
	}
	var v struct {
		Controllers app.ControllersView `json:"controllers"`
	}
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("broker show --json: %v\n%s", err, out)
	}
	return v.Controllers
}

// Two serve processes started at once on the same stores and broker:
// exactly one serves, the other stands by naming it; broker show and
// doctor say which is which.
func TestStandby_StartedAtOnce(t *testing.T) {
	t.Parallel()
	c, st := migrated(t)
	external, _ := externalBroker(t, st, freeAddr(t))
	defer external.Shutdown()
	url := external.ClientURL()
	buildController(t)
	for round := range 3 {
		procs := []*serveProc{
			startServeProc(t, fmt.Sprintf("a%d", round), c.DataDir, url),
			startServeProc(t, fmt.Sprintf("b%d", round), c.DataDir, url),
		}
		var serving, standing *serveProc
		checkFor(t, 20*time.Second, func() error {
			serving, standing = nil, nil
			for _, p := range procs {
				_, _, ready := p.find(regexp.MustCompile(readyLine), 0)
				_, _, stands := p.find(regexp.MustCompile(standbyLine), 0)
				switch {
				case ready && serving != nil:
					return fmt.Errorf("both serve:\n%s\n%s", procs[0].text(), procs[1].text())
				case ready:
					serving = p
				case stands:
					standing = p
				}
			}
			if serving == nil || standing == nil {
				return fmt.Errorf("not yet one serving and one standing by:\n%s\n%s", procs[0].text(), procs[1].text())
			}
			return nil
		})
		line, _ := standing.wait(t, time.Second, standbyLine, 0)
		if !strings.Contains(line.text, fmt.Sprintf("pid %d on ", serving.pid())) {
			t.Fatalf("the standby names another: %q (serving: pid %d)", line.text, serving.pid())
		}
		var shown app.ControllersView
		checkFor(t, 5*time.Second, func() error {
			shown = controllersShown(t, c.DataDir, url)
			if shown.Serving == nil || shown.Serving.PID != serving.pid() || len(shown.StandingBy) != 1 || shown.StandingBy[0].PID != standing.pid() {
				return fmt.Errorf("broker show says %s; want pid %d serving, pid %d standing by", shown, serving.pid(), standing.pid())
			}
			return nil
		})
		out, err := exec.Command(buildController(t), "--data", c.DataDir, "doctor", "run").CombinedOutput()
		want := fmt.Sprintf("pid %d on .* serves .*; pid %d on .* stands by", serving.pid(), standing.pid())
		if !regexp.MustCompile(want).Match(out) {
			t.Fatalf("doctor run does not say %q: %v\n%s", want, err, out)
		}
		// Given back (SIGTERM), the standby takes over at once: no
		// lease to wait out.
		serving.cmd.Process.Signal(syscall.SIGTERM)
		<-serving.done
		standing.wait(t, 3*time.Second, readyLine, 0)
		standing.cmd.Process.Signal(syscall.SIGTERM)
		<-standing.done
	}
}

// tookOver says whether p said it serves within the bound, false as soon
// as it ends.
func tookOver(p *serveProc, within time.Duration) bool {
	ready := regexp.MustCompile(readyLine)
	for end := time.Now().Add(within); time.Now().Before(end); {
		if _, _, ok := p.find(ready, 0); ok {
			return true
		}
		select {
		case <-p.done:
			_, _, ok := p.find(ready, 0)
			return ok
		case <-time.After(20 * time.Millisecond):
		}
	}
	return false
}

// servingAndStandingBy is migrated stores, an external broker, and two
// serve processes on them with a lease of 2 s: a serving, b standing by.
func servingAndStandingBy(t *testing.T) (c *apptest.Mesh, st *app.Stores, url string, a, b *serveProc) {
	t.Helper()
	c, st = migrated(t)
	external, _ := externalBroker(t, st, freeAddr(t))
	t.Cleanup(external.Shutdown)
	url = external.ClientURL()
	a = startServeProc(t, "a", c.DataDir, url, "--lease", "2s")
	a.wait(t, 20*time.Second, readyLine, 0)
	b = startServeProc(t, "b", c.DataDir, url, "--lease", "2s")
	b.wait(t, 20*time.Second, standbyLine, 0)
	return c, st, url, a, b
}

// The serving controller paused (SIGSTOP) past its lease: the standby
// takes over; resumed (SIGCONT), the paused one's first write is refused
// by the stores' fence, and it stops serving and stands by, saying why.
func TestStandby_PausedPastLeaseIsFenced(t *testing.T) {
	t.Parallel()
	// Paused in the middle of a write, a holds SQLite's write lock: b cannot
	// take the lease until a resumes (as on any machine; PostgreSQL's
	// sessions the same). That pause is not this test's: then it starts
	// again on stores of its own, three times at most.
	var (
		c      *apptest.Mesh
		url    string
		a, b   *serveProc
		m      *testMesh
		paused int
	)
	for try := 1; ; try++ {
		c, _, url, a, b = servingAndStandingBy(t)
		m = &testMesh{t: t, c: c, url: url, logs: &syncBuffer{}}
		m.join("web1")
		if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		paused = a.lines()
		if tookOver(b, 12*time.Second) || try == 3 {
			break
		}
		t.Logf("try %d: b did not take over within 12 s of pausing a (a paused holding the stores' write lock?): again", try)
		a.cmd.Process.Signal(syscall.SIGCONT)
		for _, p := range []*serveProc{a, b} {
			p.cmd.Process.Signal(syscall.SIGTERM)
			<-p.done
		}
	}
	b.wait(t, time.Second, readyLine, 0)
	// While a is paused, web1's plan moves: b declares it.
	bumpAll(t, m)
	b.wait(t, 10*time.Second, `msg="behind its plan: declaration sent" node=web1 serial=1\b`, 0)
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	line, _ := a.wait(t, 10*time.Second, `msg="deposed: this controller stopped writing and stands by" err=".*the lease was taken over: this controller's generation is 1, the store's fence 2`, paused)
	a.wait(t, 5*time.Second, standbyLine, paused)
	t.Logf("a, resumed: %s", line.text)
	if got := a.sent(); len(got) != 0 {
		t.Fatalf("the deposed controller sent declarations: %v", got)
	}
	ids, err := c.Stores(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	l, err := ids.Identity.Lease(context.Background())
	if err != nil || l == nil || l.PID != b.pid() || l.Generation != 2 {
		t.Fatalf("lease after a resumed: %+v, %v (want b's, generation 2)", l, err)
	}
	if n := m.node("web1"); n.SerialDeclared != 1 {
		t.Fatalf("web1's latest serial is %d, want b's 1", n.SerialDeclared)
	}
}

// failoverRuns is how many failovers TestStandby_Kill9UnderHosts measures:
// MESH_FAILOVER_RUNS (5 for the p50 the README gives), else 1.
func failoverRuns(t *testing.T) int {
	s := os.Getenv("MESH_FAILOVER_RUNS")
	if s == "" {
		return 1
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("MESH_FAILOVER_RUNS=%q: give a count", s)
	}
	return n
}

// Kill -9 the serving controller under real hosts running a module, with
// the lease as serve sets it: the standby serves within the 15 s bound,
// the hosts' modules keep running (their pids unchanged), what was
// acknowledged before the kill is there after, the new controller
// declares the nodes whose plan moved while no one served, and no serial
// is issued twice. Each run kills the one serving then and starts a new
// standby; the time from kill -9 to the standby's first declaration sent is
// logged, with the p50 over MESH_FAILOVER_RUNS runs. It is the lease left
// at the kill (the kill lands anywhere in the renew cycle), the standby's
// poll, and its start.
func TestStandby_Kill9UnderHosts(t *testing.T) {
	t.Parallel()
	c, st := migrated(t)
	external, _ := externalBroker(t, st, freeAddr(t))
	defer external.Shutdown()
	url := external.ClientURL()
	ctx := context.Background()
	serving := startServeProc(t, "controller0", c.DataDir, url)
	serving.wait(t, 20*time.Second, readyLine, 0)
	m := &testMesh{t: t, c: c, url: url, logs: &syncBuffer{}}
	nodes := []string{"web1", "web2", "web3"}
	for _, node := range nodes {
		h := m.join(node)
		// Each runs its own copy of the example module, on its own port.
		module := "hello-" + node
		manifest, err := os.ReadFile(helloOnFreePort(t))
		if err != nil {
			t.Fatal(err)
		}
		m.addModule(writeManifest(t, strings.Replace(string(manifest), `"module": "hello"`, `"module": "`+module+`"`, 1)))
		h.install(t, module, "bin/hello", buildHello(t))
		if _, err := c.Assign(ctx, node, []string{module}); err != nil {
			t.Fatal(err)
		}
	}
	pids := map[string]int{}
	for _, node := range nodes {
		checkFor(t, settle, m.moduleIn(node, "hello-"+node, protocol.StateReady))
		pids[node] = m.moduleState(node, "hello-"+node).Pid
	}
	procs := []*serveProc{serving}
	var took []time.Duration
	for run := range failoverRuns(t) {
		standby := startServeProc(t, fmt.Sprintf("controller%d", run+1), c.DataDir, url)
		standby.wait(t, 20*time.Second, standbyLine, 0)
		procs = append(procs, standby)
		act, err := c.HandActRecord(ctx, fmt.Sprintf("failover drill %d", run), "acknowledged before the kill", "drill", "")
		if err != nil {
			t.Fatal(err)
		}
		// Settled first: a plan moved before the kill (a later host's key
		// moves those before it) is declared by the one serving then.
		before := map[string]int64{}
		for _, node := range nodes {
			checkFor(t, settle, m.notBehind(node))
			before[node] = m.node(node).SerialApplied
		}

		// The kill lands at a random point of the renew cycle, as a real
		// death does: when the lease has between two thirds of its length
		// and all of it left (it is renewed every third), a point drawn
		// uniformly.
		ttl := daemon.DefaultLeaseTTL
		left := ttl*2/3 + rand.N(ttl/3)
		checkFor(t, ttl, func() error {
			l, err := st.Identity.Lease(ctx)
			if err == nil && (l == nil || time.Until(l.ExpiresAt) > left) {
				err = fmt.Errorf("the lease has more than %s left: %+v", left, l)
			}
			return err
		})
		if err := serving.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		<-serving.done
		// Every node's plan moves while no controller serves: the
		// standby declares them when it takes over.
		bumpAll(t, m)
		ready, _ := standby.wait(t, 15*time.Second, readyLine, 0)
		first, _ := standby.wait(t, 5*time.Second, sentLine, 0)
		took = append(took, first.at.Sub(killed))
		t.Logf("run %d: kill -9 → standby serving %s, → its first declaration sent %s", run, ready.at.Sub(killed).Round(time.Millisecond), first.at.Sub(killed).Round(time.Millisecond))
		if d := ready.at.Sub(killed); d > 15*time.Second {
			t.Fatalf("the standby served %s after kill -9, over the 15 s bound", d)
		}
		for _, node := range nodes {
			checkFor(t, 10*time.Second, func() error {
				n := m.node(node)
				if n.SerialApplied != before[node]+1 || n.SerialDeclared != before[node]+1 {
					return fmt.Errorf("%s: applied %d, declared %d; want both %d (one serial above the last, issued once)", node, n.SerialApplied, n.SerialDeclared, before[node]+1)
				}
				if s := m.moduleState(node, "hello-"+node); s.Pid != pids[node] || s.State != protocol.StateReady {
					return fmt.Errorf("%s: hello %s with pid %d, want pid %d ready: the host must keep running what it applied", node, s.State, s.Pid, pids[node])
				}
				if !alive(pids[node]) {
					return fmt.Errorf("%s: hello's pid %d is gone", node, pids[node])
				}
				return nil
			})
		}
		acts, err := c.HandActs(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(acts.Acts, func(a health.HandAct) bool { return a.ID == act.ID && a.What == act.What }) {
			t.Fatalf("the hand act acknowledged before the kill is gone: %+v", acts.Acts)
		}
		serving = standby
	}
	// No serial was issued twice: each node/serial was said sent by one
	// controller only, once.
	seen := map[[2]string]string{}
	for _, p := range procs {
		for _, s := range p.sent() {
			if other, ok := seen[s]; ok {
				t.Fatalf("%s serial %s sent by %s and by %s", s[0], s[1], other, p.name)
			}
			seen[s] = p.name
		}
	}
	slices.Sort(took)
	t.Logf("kill -9 → the standby's first declaration sent: p50 %s over %d runs (all: %v)", took[len(took)/2].Round(time.Millisecond), len(took), took)
}

// A standby that finds the stores migrated by a newer controller than it
// is stands aside: it says so (its output, its log, broker show), and when
// the one serving dies it never takes the lease.
func TestStandby_StoresNewerStandsAside(t *testing.T) {
	t.Parallel()
	c, st, url, a, b := servingAndStandingBy(t)

	// What a newer controller leaves: a migration this binary does not
	// know (in the builds store, which broker show does not read: it
	// refuses a store newer than it knows, as every command does), and its
	// version on the fence.
	ctx := context.Background()
	if _, err := st.DB("builds").Exec(ctx, `INSERT INTO schema_migrations VALUES (99, '0099_future.sql', 'x', '2030-01-01T00:00:00.000Z')`); err != nil {
		t.Fatal(err)
	}
	if err := st.Identity.MigratedBy(ctx, "v9.9.9"); err != nil {
		t.Fatal(err)
	}
	why := `the stores were migrated by a newer controller, mesh-controller v9\.9\.9 \(builds newer than this binary knows\); this one is development build: upgrade it`
	b.wait(t, 10*time.Second, `^aside: `+why+`; this controller never takes the lease$`, 0)
	b.wait(t, time.Second, `msg="standing aside: `+why+`"`, 0)
	checkFor(t, 5*time.Second, func() error {
		shown := controllersShown(t, c.DataDir, url)
		if len(shown.StandingBy) != 1 || shown.StandingBy[0].PID != b.pid() || !regexp.MustCompile(`^`+why+`$`).MatchString(shown.StandingBy[0].Aside) {
			return fmt.Errorf("broker show says %s", shown)
		}
		if !regexp.MustCompile(fmt.Sprintf(`pid %d on \S+ stands aside \(mesh-controller development build\): `, b.pid())).MatchString(shown.String()) {
			return fmt.Errorf("broker show says %s", shown)
		}
		return nil
	})

	// a dies: b, still there and still aside once a's lease lapsed, takes
	// nothing.
	lease, err := st.Identity.Lease(ctx)
	if err != nil || lease == nil {
		t.Fatal(lease, err)
	}
	a.cmd.Process.Signal(syscall.SIGKILL)
	<-a.done
	checkFor(t, 10*time.Second, func() error {
		sbs, err := st.Identity.Standbys(ctx, time.Now())
		if err != nil {
			return err
		}
		if len(sbs) != 1 || sbs[0].Aside == "" || !sbs[0].ExpiresAt.After(lease.ExpiresAt.Add(2*time.Second)) {
			return fmt.Errorf("b not heard standing aside since a's lease lapsed (%s): %+v", lease.ExpiresAt, sbs)
		}
		return nil
	})
	if _, _, served := b.find(regexp.MustCompile(readyLine), 0); served {
		t.Fatalf("b served stores newer than it knows:\n%s", b.text())
	}
	if l, err := st.Identity.Lease(ctx); err != nil || l == nil || l.Holder != lease.Holder || l.Generation != lease.Generation {
		t.Fatalf("the lease after a died: %+v, %v; want a's, generation %d", l, err, lease.Generation)
	}
}
