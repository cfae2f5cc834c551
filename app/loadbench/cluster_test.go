package loadbench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"mesh-controller/embedded/broker"
	"mesh-controller/embedded/broker/clustertest"
	"mesh-controller/embedded/sqlite"
)

// TestClusterServerKilled measures a broker server killed under simulated
// hosts: serve and MESH_BENCH_HOSTS hosts (1,000 by default) on a NATS
// cluster of three nats-server processes configured as broker show
// --config prints; the server the controller is on is killed with
// SIGKILL, and the figures are how long until every host that was on it
// is heard again through the other two, and how long a change to every
// node then takes to be applied by all. Not part of make test:
//
//	MESH_BENCH=1 go test -count=1 -run TestClusterServerKilled -v ./app/loadbench/
func TestClusterServerKilled(t *testing.T) {
	hosts := benchHosts(t, 1000)
	dir := t.TempDir()
	mc, mh := build(t, dir, "./cmd/mesh-controller", "mesh-controller"), build(t, dir, "./cmd/mesh-host", "mesh-host")
	c := newController(t, mc)
	cl := c.cluster()
	c.profile = filepath.Join(dir, "serve")
	c.serve()
	defer c.stop()

	tokens := filepath.Join(c.data, "tokens.txt")
	c.run("token", "issue", "--new", "k", "--count", strconv.Itoa(hosts), "--out", tokens)
	ctx := context.Background()
	st := openStores(t, c.data)
	until := func(within time.Duration, want int, query string, args ...any) (time.Duration, int) {
		return untilCount(st, within, want, query, args...)
	}
	sim := exec.Command(mh, "simulate", "--broker", c.url, "--tokens", tokens, "--heartbeat", "10s", "--report", "1h", "--json")
	if err := sim.Start(); err != nil {
		t.Fatal(err)
	}
	defer sim.Process.Kill()
	if d, n := until(2*time.Minute, hosts, `SELECT count(*) FROM nodes WHERE heartbeat_interval_s IS NOT NULL`); n < hosts {
		t.Fatalf("%s", measured(d, n, hosts))
	}

	killed := cl.Holding("mesh-controller")
	var on []string
	for _, node := range cl.Hosts(killed) {
		on = append(on, "'"+node+"'")
	}
	fmt.Printf("\na broker server of three killed under %d simulated hosts (%d of them on it, and the controller):\n\n", hosts, len(on))
	at := time.Now()
	cl.Kill(killed)
	d, n := until(time.Minute, len(on), `SELECT count(*) FROM nodes WHERE name IN (`+strings.Join(on, ",")+`) AND last_heard >= ?`, sqlite.FormatTime(at))
	add(fmt.Sprintf("hosts of the killed server heard again (%d)", len(on)), measured(d, n, len(on)), "from the kill -9")
	d, n = until(time.Minute, hosts, `SELECT count(*) FROM nodes WHERE last_heard >= ?`, sqlite.FormatTime(at))
	add(fmt.Sprintf("every host heard again (%d, beating every 10 s)", hosts), measured(time.Since(at), n, hosts), "from the kill -9")

	names, err := st.Inventory.JoinedNodes(ctx)
	if err == nil {
		err = st.Inventory.BumpPlans(ctx, names)
	}
	if err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	d, n = until(time.Minute, hosts, `SELECT count(*) FROM nodes n JOIN declarations d ON d.node = n.name
		WHERE d.plan_version = n.plan_version AND n.serial_applied >= d.serial AND n.last_heard >= ?`, sqlite.FormatTime(changed))
	add(fmt.Sprintf("then a change to all %d nodes: all applied", hosts), measured(d, n, hosts), "through the two servers left (catch-up every 5 s)")
	fmt.Println()
	if log, err := os.ReadFile(c.profile + ".log"); err == nil {
		for _, line := range strings.Split(string(log), "\n") {
			if strings.Contains(line, `msg="broker: `) {
				fmt.Println("  serve: " + line)
			}
		}
	}
	fmt.Printf("  killed at %s\n", at.UTC().Format(time.RFC3339Nano))
}

// cluster starts three nats-server processes, each configured as broker
// show --config prints for it, and makes them serve's --broker.
func (c *controller) cluster() *clustertest.Cluster {
	cl := clustertest.Start(c.t, 3, func(n broker.ClusterNode) (string, error) {
		out, _ := c.run("broker", "show", "--config", "--name", n.Name, "--listen", n.Listen, "--cluster-listen", n.ClusterListen,
			"--routes", strings.Join(n.Routes, ","), "--dir", n.Dir)
		return out, nil
	})
	c.broker = cl.URLs()
	return cl
}
