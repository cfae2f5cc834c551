package loadbench

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"mesh-controller/app"
	"mesh-controller/app/apptest"
	"mesh-controller/embedded/sqlite"
)

// TestRestartUnderLoad is restartUnderLoad alone, which 'make bench' runs
// within TestLoad: MESH_BENCH=1 go test -run TestRestartUnderLoad -v
// ./app/loadbench/ (MESH_BENCH_HOSTS hosts, 10,000 by default).
func TestRestartUnderLoad(t *testing.T) {
	hosts := benchHosts(t, 10000)
	dir := t.TempDir()
	restartUnderLoad(t, build(t, dir, "./cmd/mesh-controller", "mesh-controller"), build(t, dir, "./cmd/mesh-host", "mesh-host"), hosts)
}

// restartUnderLoad measures a rack of hosts joining at once, then serve
// stopped and started again under them, at once and after 20 s away (the
// embedded broker goes with serve): the time from the new serve's start
// until every host is heard again and has applied the declaration made for
// it while serve was away.
func restartUnderLoad(t *testing.T, mc, mh string, hosts int) {
	c := newController(t, mc)
	c.listen = freeAddr(t)
	if dir := os.Getenv("MESH_BENCH_PROFILES"); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		// The joins' serve: its profile is written as it stops, before
		// the restarts (which keep no profile).
		c.profile = filepath.Join(dir, fmt.Sprintf("joins-%d-hosts", hosts))
	}
	c.serve()
	defer func() {
		if c.cmd.ProcessState == nil {
			c.stop()
		}
	}()
	tokens := filepath.Join(c.data, "tokens.txt")
	c.run("token", "issue", "--new", "r", "--count", strconv.Itoa(hosts), "--out", tokens)
	ctx := context.Background()
	st := openStores(t, c.data)
	until := func(within time.Duration, query string, args ...any) (time.Duration, int) {
		return untilCount(st, within, hosts, query, args...)
	}
	measured := func(d time.Duration, n int) string { return measured(d, n, hosts) }

	sim := exec.Command(mh, "simulate", "--broker", c.url, "--tokens", tokens, "--heartbeat", "10s", "--report", "1h", "--json")
	var simOut bytes.Buffer
	sim.Stdout = &simOut
	serveTicks := procTicks(c.cmd.Process.Pid)
	if err := sim.Start(); err != nil {
		t.Fatal(err)
	}
	defer sim.Process.Kill()
	// Each phase is given twice to four times its goal, no more: make
	// bench stays under fifteen minutes, and a row says how many came in
	// time when not all did.
	d, n := until(90*time.Second, `SELECT count(*) FROM nodes WHERE joined_at IS NOT NULL`)
	spent := machineCPU{serve: ticks(procTicks(c.cmd.Process.Pid) - serveTicks), hosts: ticks(procTicks(sim.Process.Pid))}
	add(fmt.Sprintf("joins: %d hosts joining at once, all joined", hosts), measured(d, n), "goal ≤ 10 s (mesh-host simulate, same two cores)")
	add("joins: the machine's CPU until all joined", spent.String(),
		fmt.Sprintf("on %d cores no less than %s of wall time", runtimeCores(), spent.wall(runtimeCores()).Round(100*time.Millisecond)))
	if hosts == beside.hosts {
		beside.joined, beside.joinCPU = n, spent
		if n >= hosts {
			beside.joins = d
		}
	}
	until(time.Minute, `SELECT count(*) FROM nodes WHERE heartbeat_interval_s IS NOT NULL`)
	// MESH_BENCH_JOINS_ONLY=1 stops after the joins row: the restarts take
	// minutes more.
	joinsOnly := os.Getenv("MESH_BENCH_JOINS_ONLY") != ""
	c.profile = ""

	for _, away := range []time.Duration{0, 20 * time.Second} {
		c.stop()
		if joinsOnly {
			break
		}
		// Something every node depends on changed while serve was away:
		// each is declared anew when it starts again.
		names, err := st.Inventory.JoinedNodes(ctx)
		if err == nil {
			err = st.Inventory.BumpPlans(ctx, names)
		}
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(away) // the measured outage itself
		if dir := os.Getenv("MESH_BENCH_PROFILES"); dir != "" {
			c.profile = filepath.Join(dir, fmt.Sprintf("restart-%s-%d-hosts", away, hosts))
		}
		start := time.Now()
		c.serve()
		d, n := until(time.Minute, `SELECT count(*) FROM nodes n JOIN declarations d ON d.node = n.name
			WHERE d.plan_version = n.plan_version AND n.serial_applied >= d.serial AND n.last_heard >= ?`, sqlite.FormatTime(start))
		what := "serve restarted"
		if away > 0 {
			what = fmt.Sprintf("serve and its broker away %s", away)
		}
		add(fmt.Sprintf("%s under %d hosts: all heard again and caught up", what, hosts), measured(d, n), "goal ≤ 30 s, from serve's start")
		if hosts == beside.hosts {
			beside.restarts = append(beside.restarts, measured(d, n)+" ("+what+")")
		}
	}

	// What --memory-limit trades: serve started again under each, every
	// host heard again, then the same steady window as the scenario's.
	for _, limit := range []int{300, 500, 700} {
		c.stop()
		c.args = []string{"--memory-limit", strconv.Itoa(limit)}
		start := time.Now()
		c.serve()
		if _, n := until(time.Minute, `SELECT count(*) FROM nodes WHERE last_heard >= ?`, sqlite.FormatTime(start)); n < hosts {
			add(fmt.Sprintf("--memory-limit %d: hosts heard again", limit), measured(time.Since(start), n), "")
		}
		time.Sleep(10 * time.Second) // the reconnection's garbage collected
		rss, cpu := window(c.cmd.Process.Pid, steadyWindow)
		add(fmt.Sprintf("--memory-limit %d under %d hosts: resident memory / CPU", limit, hosts), fmt.Sprintf("%s / %.0f%%", mib(rss), cpu*100), "the collector's work for the memory")
		if hosts == beside.hosts {
			beside.limits = append(beside.limits, limitFigures{mib: limit, rss: rss, cpu: cpu})
		}
	}

	sim.Process.Signal(os.Interrupt)
	sim.Wait()
	var stats struct {
		GaveUp int64 `json:"gave_up"`
	}
	json.Unmarshal(simOut.Bytes(), &stats)
	add(fmt.Sprintf("restarts under %d hosts: hosts that gave up", hosts), strconv.FormatInt(stats.GaveUp, 10), "goal 0")
}

// benchHosts is MESH_BENCH_HOSTS, or def; the test is skipped without
// MESH_BENCH.
func benchHosts(t *testing.T, def int) int {
	if os.Getenv("MESH_BENCH") == "" {
		t.Skip("the load measurement runs with MESH_BENCH=1 ('make bench')")
	}
	hosts, err := strconv.Atoi(cmp.Or(os.Getenv("MESH_BENCH_HOSTS"), strconv.Itoa(def)))
	if err != nil {
		t.Fatal(err)
	}
	return hosts
}

// openStores is one handle on the stores in data for this process, as a
// process opens each store once; closed when the test ends.
func openStores(t *testing.T, data string) *app.Stores {
	a := apptest.New(data)
	t.Cleanup(func() { a.Close() })
	st, err := a.Stores(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// untilCount polls query, a count of nodes, until it reaches want or
// within runs out: it returns how long it took and how many it reached.
func untilCount(st *app.Stores, within time.Duration, want int, query string, args ...any) (time.Duration, int) {
	start, n := time.Now(), 0
	for time.Since(start) < within {
		st.DB("inventory").Reader.QueryRow(query, args...).Scan(&n)
		if n >= want {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Since(start), n
}

// measured is how long it took, or how many of want came within it.
func measured(d time.Duration, n, want int) string {
	if n < want {
		return fmt.Sprintf("%d of %d in %s", n, want, d.Round(time.Second))
	}
	return d.Round(100 * time.Millisecond).String()
}

// freeAddr is a loopback address no one listens on, so that serve can be
// started again where its hosts dial.
func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
