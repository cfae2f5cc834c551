// Package loadbench measures a real controller serving thousands of
// simulated hosts, with the real binaries, and prints a table. It runs only
// from 'make bench' (MESH_BENCH=1): several minutes, not part of make test.
package loadbench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"mesh-controller/app"
	"mesh-controller/app/apptest"
	"mesh-controller/embedded/sqlite"
	"mesh-controller/embedded/sqlite/sqlitetest"
)

type row struct{ figure, value, beside string }

var table []row

func add(figure, value, beside string) {
	table = append(table, row{figure, value, beside})
	fmt.Printf("  %-58s %-22s %s\n", figure, value, beside)
}

func build(t *testing.T, dir, pkg, name string) string {
	bin := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

type controller struct {
	t    *testing.T
	bin  string
	data string
	cmd  *exec.Cmd
	url  string
	// profile, if set, is where serve writes its CPU profile, its heap
	// profile (on SIGUSR1) and its log: path + .cpu.pprof, .heap.pprof, .log.
	profile string
	// listen is where serve's broker listens; empty picks a free port.
	listen string
	// broker, if set, is serve's --broker: an external broker's URLs.
	broker string
	// args are more of serve's flags (--memory-limit).
	args []string
	// lastCPU is the CPU time (user and system) of the last command run.
	lastCPU time.Duration
}

func (c *controller) run(args ...string) (string, time.Duration) {
	c.t.Helper()
	out, took, err := c.try(args...)
	if err != nil {
		c.t.Fatalf("%v: %v", args, err)
	}
	return out, took
}

// try runs a command whose failure is a measured outcome (a roll-out that
// did not hear every host within its wait), not the bench's.
func (c *controller) try(args ...string) (string, time.Duration, error) {
	start := time.Now()
	cmd := exec.Command(c.bin, append([]string{"--data", c.data}, args...)...)
	out, err := cmd.Output()
	took := time.Since(start)
	if cmd.ProcessState != nil {
		c.lastCPU = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		// What the command said, not only how it exited: its last line.
		lines := strings.Split(strings.TrimSpace(string(ee.Stderr)), "\n")
		err = fmt.Errorf("%w: %s", err, lines[len(lines)-1])
	}
	return string(out), took, err
}

func (c *controller) serve() time.Duration {
	c.t.Helper()
	args := []string{"--data", c.data, "serve", "--listen", cmp.Or(c.listen, "127.0.0.1:0")}
	if c.broker != "" {
		args = append(args, "--broker", c.broker)
	}
	args = append(args, c.args...)
	if c.profile != "" {
		for _, ext := range []string{".cpu.pprof", ".heap.pprof", ".log"} {
			os.Remove(c.profile + ext) // serve refuses to overwrite a CPU profile
		}
		args = append(args, "--cpu-profile", c.profile+".cpu.pprof", "--heap-profile", c.profile+".heap.pprof")
	}
	c.cmd = exec.Command(c.bin, args...)
	out, _ := c.cmd.StdoutPipe()
	var stderr bytes.Buffer
	c.cmd.Stderr = &stderr
	if c.profile != "" {
		// A file, not a writer copied through a pipe: the child keeps
		// writing to it after this returns (a closed pipe on its stderr
		// would kill it).
		if f, err := os.Create(c.profile + ".log"); err == nil {
			defer f.Close() // the child holds its own copy
			c.cmd.Stderr = f
		}
	}
	start := time.Now()
	if err := c.cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "ready") {
			c.url = regexp.MustCompile(`nats://[0-9.:]+`).FindString(sc.Text())
			go func() {
				for sc.Scan() {
				}
			}()
			return time.Since(start)
		}
	}
	c.cmd.Wait()
	if c.profile != "" {
		b, _ := os.ReadFile(c.profile + ".log")
		stderr.Write(b)
	}
	c.t.Fatalf("serve ended before ready: %s", stderr.String())
	return 0
}

// heapProfile has serve write its heap profile (serve --heap-profile) and
// returns what its log says the memory is made of, "" without profiles.
func (c *controller) heapProfile() string {
	if c.profile == "" {
		return ""
	}
	re := regexp.MustCompile(`heap profile written to .*: (.*)`)
	b, _ := os.ReadFile(c.profile + ".log")
	before := len(re.FindAllSubmatch(b, -1))
	c.cmd.Process.Signal(syscall.SIGUSR1)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		b, _ := os.ReadFile(c.profile + ".log")
		if m := re.FindAllSubmatch(b, -1); len(m) > before {
			return string(m[len(m)-1][1])
		}
	}
	return "no heap profile written"
}

// untilBeating waits until hosts nodes beat every interval, as node list
// says, or within runs out, and returns how many do. node list of
// thousands of nodes is a measured cost: it is asked every 2 s.
func (c *controller) untilBeating(hosts int, interval, within time.Duration) int {
	c.t.Helper()
	every := `"heartbeat_interval_s": ` + strconv.FormatFloat(interval.Seconds(), 'f', -1, 64) + ","
	deadline := time.Now().Add(within)
	for {
		out, _ := c.run("node", "list", "--json")
		n := strings.Count(out, every)
		if n >= hosts || time.Now().After(deadline) {
			return n
		}
		time.Sleep(2 * time.Second)
	}
}

func (c *controller) stop() {
	c.cmd.Process.Signal(syscall.SIGTERM)
	c.cmd.Wait()
}

func procRSS(pid int) int64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	m := regexp.MustCompile(`VmRSS:\s+(\d+) kB`).FindSubmatch(b)
	if m == nil {
		return 0
	}
	kb, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return kb << 10
}

func procTicks(pid int) int64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return u + s
}

func median(ds []time.Duration) time.Duration {
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[len(ds)/2]
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func newController(t *testing.T, bin string) *controller {
	c := &controller{t: t, bin: bin, data: t.TempDir()}
	if onPostgres() {
		// Every context on a fresh database of the test PostgreSQL: the
		// controller's commands and this process's reads follow the
		// variables, as a person's would.
		for _, ctx := range app.Contexts {
			t.Setenv(sqlite.EnvVar(ctx), sqlitetest.NewDatabase(t))
		}
	}
	c.run("migrate")
	return c
}

// onPostgres is make bench-postgres: every scenario's stores on PostgreSQL.
func onPostgres() bool { return os.Getenv("MESH_BENCH_POSTGRES") != "" }

// TestLoad is 'make bench'.
func TestLoad(t *testing.T) {
	if os.Getenv("MESH_BENCH") == "" {
		t.Skip("the load measurement runs from 'make bench' (MESH_BENCH=1)")
	}
	dir := t.TempDir()
	mc := build(t, dir, "./cmd/mesh-controller", "mesh-controller")
	mh := build(t, dir, "./cmd/mesh-host", "mesh-host")
	on := "SQLite"
	if onPostgres() {
		on = "PostgreSQL (a local server, fsync off)"
	}
	fmt.Printf("\nmesh-controller under load, on this machine (%d cores), its stores on %s:\n\n", runtimeCores(), on)
	fmt.Printf("  %-58s %-22s %s\n", "FIGURE", "VALUE", "BESIDE IT")

	// Start to ready, and idle memory with no host: medians of five.
	var readies []time.Duration
	var idle []int64
	for i := 0; i < 5; i++ {
		c := newController(t, mc)
		readies = append(readies, c.serve())
		time.Sleep(2 * time.Second)
		idle = append(idle, procRSS(c.cmd.Process.Pid))
		c.stop()
	}
	sort.Slice(idle, func(i, j int) bool { return idle[i] < idle[j] })
	add("serve: start to ready (median of 5)", median(readies).Round(time.Millisecond).String(), "peer: k3s takes seconds")
	add("serve: idle resident memory, 0 hosts (median of 5)", mib(idle[2]), "goal < 40 MB; PocketBase ~30 MB")

	natsRate := rawNATS(t, 300)
	sqliteRate := rawSQLite(t)
	add("limit: raw NATS publish/subscribe, 300-byte messages", fmt.Sprintf("%.0f msg/s", natsRate), "same machine, same run")
	add("limit: raw SQLite batched insert (1,000 rows a transaction)", fmt.Sprintf("%.0f rows/s", sqliteRate), "same disk, same run")

	type load struct {
		hosts    int
		interval time.Duration
		fanout   bool
	}
	loads := []load{{1000, 10 * time.Second, true}, {1000, time.Second, false}, {10000, 10 * time.Second, true}}
	// MESH_BENCH_HOSTS=N runs the scenarios of that many hosts only, or
	// (a count none has) one of N hosts beating every 10 s; the rows beside
	// the floor are of its largest.
	if only, err := strconv.Atoi(os.Getenv("MESH_BENCH_HOSTS")); err == nil {
		loads = slices.DeleteFunc(loads, func(l load) bool { return l.hosts != only })
		if len(loads) == 0 {
			loads = []load{{only, 10 * time.Second, true}}
		}
	}
	besideHosts = loads[len(loads)-1].hosts
	for _, s := range loads {
		scenario(t, mc, mh, s.hosts, s.interval, s.fanout, natsRate)
	}
	if dir := os.Getenv("MESH_BENCH_PROFILES"); dir != "" {
		fmt.Printf("\nprofiles of each scenario's controller (go tool pprof FILE): %s\n", dir)
	}
	// MESH_BENCH_QUICK=1 stops after the scenarios: about 2 minutes for
	// 10,000 hosts, to try a change to the fan-out or the steady state.
	if os.Getenv("MESH_BENCH_QUICK") != "" {
		return
	}
	restartUnderLoad(t, mc, mh, besideHosts)
	floorRows(t, natsServer(t, dir))
	fmt.Println()
}

func runtimeCores() int {
	out, _ := exec.Command("nproc").Output()
	n, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	return n
}

func scenario(t *testing.T, mc, mh string, hosts int, interval time.Duration, fanout bool, natsRate float64) {
	c := newController(t, mc)
	if dir := os.Getenv("MESH_BENCH_PROFILES"); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		c.profile = filepath.Join(dir, fmt.Sprintf("%d-hosts-%s", hosts, interval))
	}
	c.serve()
	defer c.stop()
	tokens := filepath.Join(c.data, "tokens.txt")
	c.run("token", "issue", "--new", "h", "--count", strconv.Itoa(hosts), "--out", tokens)
	label := fmt.Sprintf("%d hosts beating every %s", hosts, interval)
	joinWait := time.Duration(hosts/200+20) * time.Second
	sim := exec.Command(mh, "simulate", "--broker", c.url, "--tokens", tokens, "--heartbeat", interval.String(), "--report", "1h", "--json")
	var simOut bytes.Buffer
	sim.Stdout = &simOut
	if err := sim.Start(); err != nil {
		t.Fatal(err)
	}
	// A scenario that fails part way leaves no simulator behind (it would
	// beat on, and hold whatever it inherited).
	t.Cleanup(func() { sim.Process.Kill(); sim.Wait() })
	// Wait until every host beats, then measure a steady window (with as
	// many as beat by then: the figures say how many hosts they are of).
	c.untilBeating(hosts, interval, joinWait)
	pid := c.cmd.Process.Pid
	// The steady window is a CPU profile of its own (serve's --cpu-profile
	// begins the next file on each SIGUSR2): .cpu.pprof.1.
	c.cmd.Process.Signal(syscall.SIGUSR2)
	rss, cpu := window(pid, steadyWindow)
	c.cmd.Process.Signal(syscall.SIGUSR2)
	cpuGoal, memGoal, statusGoal, listGoal := "goal: heartbeats on at most a third of a core", "goal < 512 MiB at 10,000", "goal < 50 ms", "whole process"
	if hosts >= 10000 {
		cpuGoal, memGoal, statusGoal, listGoal = "goal ≤ 20 % of one core", "goal ≤ 300 MiB", "goal ≤ 50 ms, whole process", "goal ≤ 100 ms, whole process"
	}
	add(label+": controller CPU", fmt.Sprintf("%.0f%% of one core", cpu*100), cpuGoal)
	add(label+": controller resident memory", mib(rss), memGoal)
	if m := regexp.MustCompile(`heap in use (\d+) MiB, goroutine stacks (\d+) MiB, .*, (\d+) goroutines`).FindStringSubmatch(c.heapProfile()); m != nil {
		add(label+": controller heap / goroutine stacks", m[1]+" / "+m[2]+" MiB", m[3]+" goroutines; heap profile beside the log")
	}
	if c.profile != "" {
		if brokers, own, err := heapSplit(c.profile + ".heap.pprof"); err == nil {
			add(label+": heap in use per host: the controller's own / its broker's", fmt.Sprintf("%.1f / %.1f KB", float64(own)/float64(hosts)/1000,
				float64(brokers)/float64(hosts)/1000), "goal: own ≤ 5 KB (heap profile: allocations under nats-server's package are the broker's)")
			if hosts == besideHosts && interval == 10*time.Second {
				beside.ownPerHost, beside.brokerPerHost = float64(own)/float64(hosts), float64(brokers)/float64(hosts)
			}
		}
	}
	if hosts == besideHosts && interval == 10*time.Second {
		beside.hosts, beside.interval, beside.rss, beside.cpu = hosts, interval, rss, cpu
	}
	var nl, st []time.Duration
	for i := 0; i < 5; i++ {
		_, d := c.run("node", "list", "--json")
		nl = append(nl, d)
		_, d = c.run("status", "--json")
		st = append(st, d)
	}
	add(label+": node list --json (median of 5)", median(nl).Round(time.Millisecond).String(), listGoal)
	add(label+": status --json (median of 5)", median(st).Round(time.Millisecond).String(), statusGoal)
	if fanout {
		c.cmd.Process.Signal(syscall.SIGUSR2) // the fan-out's profile: .cpu.pprof.3
		fanOut(t, c, hosts, sim.Process.Pid)
		c.cmd.Process.Signal(syscall.SIGUSR2)
	}
	// Let the last beats land, then stop the hosts, then the controller
	// (which writes what it absorbed as it stops).
	time.Sleep(2 * interval)
	sim.Process.Signal(os.Interrupt)
	if err := sim.Wait(); err != nil {
		t.Logf("simulate: %v", err)
	}
	c.stop()
	var stats struct {
		BeatsSent int64 `json:"beats_sent"`
		Beating   int64 `json:"beating"`
	}
	json.Unmarshal(simOut.Bytes(), &stats)
	absorbed := absorbedBeats(t, c.data)
	add(label+": heartbeats received / sent", fmt.Sprintf("%d / %d", absorbed, stats.BeatsSent), fmt.Sprintf("lost %d", stats.BeatsSent-absorbed))
	if hosts == beside.hosts && interval == beside.interval {
		beside.beatsLost = stats.BeatsSent - absorbed
	}
	c.nameProfiles()
	rate := float64(hosts) / interval.Seconds()
	add(label+": heartbeat rate vs raw NATS", fmt.Sprintf("%.0f beats/s", rate), fmt.Sprintf("%.3f%% of %.0f msg/s", 100*rate/natsRate, natsRate))
}

// absorbedBeats counts the heartbeats the controller took in: one interval
// counted in the hourly aggregates per beat after each node's first, plus
// the first.
func absorbedBeats(t *testing.T, data string) int64 {
	ctx := context.Background()
	// Where the controller has it: its file, or a database its variable names.
	loc, err := sqlite.Locate("health", data, os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sqlite.Open(ctx, loc, false)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var intervals, nodes int64
	db.Reader.QueryRow(`SELECT coalesce(sum(count), 0), count(DISTINCT node) FROM heartbeat_hours`).Scan(&intervals, &nodes)
	return intervals + nodes
}

// fanOut puts one module on every node with one assign --nodes, then moves
// it to a new version with one roll-out --together, then changes its
// mesh-wide settings: each the time until every host reports it applied,
// and the declare's parts (plan, sign, store, send) as the controller
// measured them; for the settings change, also the CPU the machine spent
// on it (serve, the simulator whose pid is sim, the command).
func fanOut(t *testing.T, c *controller, hosts, sim int) {
	ctx := context.Background()
	a := apptest.New(c.data)
	defer a.Close()
	manifest := func(version string) string {
		f := filepath.Join(c.data, "fan-"+version+".json")
		os.WriteFile(f, []byte(`{"module": "fan", "version": "`+version+`", "data": [{"name": "d", "path": "/srv/fan", "precious": "rebuildable"}],
			"settings": {"schema": {"type": "object"}, "defaults": {}}}`), 0o600)
		return f
	}
	c.run("module", "add", manifest("1.0.0"))
	nodes, _ := a.NodeList(ctx)
	var names []string
	for _, n := range nodes {
		names = append(names, n.Name)
	}
	list := filepath.Join(c.data, "nodes.txt")
	os.WriteFile(list, []byte(strings.Join(names, "\n")+"\n"), 0o600)
	st, err := a.Stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Through the stores this process opened: a process opens each store once.
	db := st.DB("inventory")
	applied := func(start time.Time) []time.Duration {
		var lat []time.Duration
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) {
			lat = lat[:0]
			rows, _ := db.Reader.Query(`SELECT applied_at FROM nodes WHERE applied_at IS NOT NULL`)
			for rows.Next() {
				var s string
				rows.Scan(&s)
				if at, err := sqlite.ParseTime(s); err == nil && at.After(start) {
					lat = append(lat, at.Sub(start))
				}
			}
			rows.Close()
			if len(lat) >= hosts {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		return lat
	}
	parts := func() string {
		out, _ := c.run("durations", "--kind", "declare", "--days", "1", "--json")
		var ds []struct {
			Subject string  `json:"subject"`
			MaxMS   float64 `json:"max_ms"`
		}
		json.Unmarshal([]byte(out), &ds)
		var said []string
		for _, d := range ds {
			said = append(said, fmt.Sprintf("%s %.0f ms", d.Subject, d.MaxMS))
		}
		return strings.Join(said, ", ")
	}
	row := func(what string, took time.Duration, lat []time.Duration, goal string) {
		if len(lat) == 0 {
			add(what, "no host reported", goal)
			return
		}
		p := func(q float64) time.Duration {
			return lat[min(int(q*float64(len(lat))), len(lat)-1)].Round(time.Millisecond)
		}
		add(fmt.Sprintf("%s: %d of %d hosts applied", what, len(lat), hosts), lat[len(lat)-1].Round(time.Millisecond).String(),
			fmt.Sprintf("command %s; per host p50 %s, p99 %s; %s", took.Round(time.Millisecond), p(0.5), p(0.99), goal))
	}

	start := time.Now()
	_, took := c.run("assign", "--nodes", list, "fan")
	row("fan-out: assign --nodes, one module on every node", took, applied(start), "goal: 1,000 nodes ≤ 2 s including the push")
	c.run("module", "add", manifest("2.0.0"))
	start = time.Now()
	goal := "goal: all applied ≤ 1.5 s p99"
	if _, took, err = c.try("upgrade", "fan", "roll-out", "--together", "--wait", "1m", "--soak", "0s"); err != nil {
		goal += "; the roll-out said: " + err.Error()
	}
	row("fan-out: roll-out --together", took, applied(start), goal)
	add("fan-out: roll-out --together, the controller's parts (max of the acts so far)", parts(), "durations --kind declare")
	settings := filepath.Join(c.data, "settings.json")
	os.WriteFile(settings, []byte(`{"workers": 4}`), 0o600)
	serveTicks, simTicks := procTicks(c.cmd.Process.Pid), procTicks(sim)
	start = time.Now()
	_, took = c.run("settings", "set", "fan", settings)
	lat := applied(start)
	spent := machineCPU{serve: ticks(procTicks(c.cmd.Process.Pid) - serveTicks), hosts: ticks(procTicks(sim) - simTicks), command: c.lastCPU}
	row("fan-out: a mesh-wide settings change", took, lat, "goal: all applied ≤ 1.5 s p99")
	add("fan-out: a settings change, the machine's CPU until all applied", spent.String(),
		fmt.Sprintf("on %d cores no less than %s of wall time", runtimeCores(), spent.wall(runtimeCores()).Round(10*time.Millisecond)))
	if hosts != beside.hosts {
		return
	}
	if len(lat) > 0 {
		beside.fanApplied, beside.fanP99 = len(lat), lat[min(int(0.99*float64(len(lat))), len(lat)-1)]
	}
	beside.fanCPU = spent
	// The settings change's own parts: the last declare's four rows.
	rows, err := st.DB("health").Reader.Query(`SELECT subject, ms FROM durations WHERE kind = 'declare' AND at = (SELECT max(at) FROM durations WHERE kind = 'declare')`)
	if err == nil {
		for rows.Next() {
			var part string
			var ms float64
			rows.Scan(&part, &ms)
			beside.parts[part] = time.Duration(ms * float64(time.Millisecond))
		}
		rows.Close()
	}
	// What the floor signs and sends: a declaration as this one made it.
	if d, err := st.Inventory.LatestDeclaration(ctx, names[0]); err == nil && d != nil {
		if err := json.Unmarshal([]byte(d.Body), &beside.decl); err != nil {
			t.Fatal(err)
		}
	}
}

// rawNATS is the plain publish/subscribe rate of an embedded server on this
// machine, for messages of the given size, over loopback TCP.
func rawNATS(t *testing.T, size int) float64 {
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("raw nats not ready")
	}
	defer func() { s.Shutdown(); s.WaitForShutdown() }()
	pub, _ := nats.Connect(s.ClientURL())
	sub, _ := nats.Connect(s.ClientURL())
	defer pub.Close()
	defer sub.Close()
	const n = 500000
	got := make(chan struct{})
	count := 0
	sub.Subscribe("raw.*", func(*nats.Msg) {
		count++
		if count == n {
			close(got)
		}
	})
	sub.Flush()
	msg := bytes.Repeat([]byte("x"), size)
	start := time.Now()
	for i := 0; i < n; i++ {
		pub.Publish("raw.h", msg)
	}
	pub.Flush()
	select {
	case <-got:
	case <-time.After(60 * time.Second):
	}
	return float64(count) / time.Since(start).Seconds()
}

// rawSQLite is the batched insert rate on this disk with the store's pragmas.
func rawSQLite(t *testing.T) float64 {
	ctx := context.Background()
	db, err := sqlite.Open(ctx, sqlite.Location{Context: "raw", DSN: filepath.Join(t.TempDir(), "raw.db")}, true)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.Writer.Exec(`CREATE TABLE r (id INTEGER PRIMARY KEY, node TEXT, at TEXT, ms REAL)`)
	const batches, per = 200, 1000
	start := time.Now()
	for b := 0; b < batches; b++ {
		db.Write(ctx, func(tx *sql.Tx) error {
			stmt, _ := tx.Prepare(`INSERT INTO r (node, at, ms) VALUES (?, ?, ?)`)
			defer stmt.Close()
			for i := 0; i < per; i++ {
				stmt.Exec("h1", "2026-11-29T00:00:00.000Z", 1.5)
			}
			return nil
		})
	}
	return batches * per / time.Since(start).Seconds()
}
