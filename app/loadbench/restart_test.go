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
	"mesh-controller/embedded/sqlite"
)

// TestRestartUnderLoad is restartUnderLoad alone, which 'make bench' runs
// within TestLoad: MESH_BENCH=1 go test -run TestRestartUnderLoad -v
// ./app/loadbench/ (MESH_BENCH_HOSTS hosts, 10,000 by default).
func TestRestartUnderLoad(t *testing.T) {
	if os.Getenv("MESH_BENCH") == "" {
		t.Skip("the load measurement runs from 'make bench' (MESH_BENCH=1)")
	}
	hosts, err := strconv.Atoi(cmp.Or(os.Getenv("MESH_BENCH_HOSTS"), "10000"))
	if err != nil {
		t.Fatal(err)
	}
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
	c.serve()
	defer func() {
		if c.cmd.ProcessState == nil {
			c.stop()
		}
	}()
	tokens := filepath.Join(c.data, "tokens.txt")
	c.run("token", "issue", "--new", "r", "--count", strconv.Itoa(hosts), "--out", tokens)
	// One handle on the stores for this process, as a process opens each
	// store once.
	ctx := context.Background()
	a := app.New(c.data)
	defer a.Close()
	st, err := a.Stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	count := func(query string, args ...any) int {
		var n int
		st.DB("inventory").Reader.QueryRow(query, args...).Scan(&n)
		return n
	}
	// until polls count until it reaches every host, or within runs out:
	// it returns how long it took and how many it reached.
	until := func(within time.Duration, query string, args ...any) (time.Duration, int) {
		start, n := time.Now(), 0
		for time.Since(start) < within {
			if n = count(query, args...); n >= hosts {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		return time.Since(start), n
	}
	measured := func(d time.Duration, n int) string {
		if n < hosts {
			return fmt.Sprintf("%d of %d in %s", n, hosts, d.Round(time.Second))
		}
		return d.Round(100 * time.Millisecond).String()
	}

	sim := exec.Command(mh, "simulate", "--broker", c.url, "--tokens", tokens, "--heartbeat", "10s", "--report", "1h", "--json")
	var simOut bytes.Buffer
	sim.Stdout = &simOut
	if err := sim.Start(); err != nil {
		t.Fatal(err)
	}
	defer sim.Process.Kill()
	// Each phase is given twice to four times its goal, no more: make
	// bench stays under fifteen minutes, and a row says how many came in
	// time when not all did.
	d, n := until(90*time.Second, `SELECT count(*) FROM nodes WHERE joined_at IS NOT NULL`)
	add(fmt.Sprintf("joins: %d hosts joining at once, all joined", hosts), measured(d, n), "goal ≤ 15 s (mesh-host simulate, same two cores)")
	until(time.Minute, `SELECT count(*) FROM nodes WHERE heartbeat_interval_s IS NOT NULL`)

	for _, away := range []time.Duration{0, 20 * time.Second} {
		c.stop()
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
		start := time.Now()
		c.serve()
		d, n := until(time.Minute, `SELECT count(*) FROM nodes n JOIN declarations d ON d.node = n.name
			WHERE d.plan_version = n.plan_version AND n.serial_applied >= d.serial AND n.last_heard >= ?`, sqlite.FormatTime(start))
		what := "serve restarted"
		if away > 0 {
			what = fmt.Sprintf("serve and its broker away %s", away)
		}
		add(fmt.Sprintf("%s under %d hosts: all heard again and caught up", what, hosts), measured(d, n), "goal ≤ 30 s, from serve's start")
	}

	sim.Process.Signal(os.Interrupt)
	sim.Wait()
	var stats struct {
		GaveUp int64 `json:"gave_up"`
	}
	json.Unmarshal(simOut.Bytes(), &stats)
	add(fmt.Sprintf("restarts under %d hosts: hosts that gave up", hosts), strconv.FormatInt(stats.GaveUp, 10), "goal 0")
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
