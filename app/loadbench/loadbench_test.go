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
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"mesh-controller/app"
	"mesh-controller/contexts/inventory"
	"mesh-controller/embedded/sqlite"
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
	// listen is where serve's broker listens; empty picks a free port.
	listen string
}

func (c *controller) run(args ...string) (string, time.Duration) {
	c.t.Helper()
	start := time.Now()
	out, err := exec.Command(c.bin, append([]string{"--data", c.data}, args...)...).Output()
	if err != nil {
		c.t.Fatalf("%v: %v", args, err)
	}
	return string(out), time.Since(start)
}

func (c *controller) serve() time.Duration {
	c.t.Helper()
	c.cmd = exec.Command(c.bin, "--data", c.data, "serve", "--listen", cmp.Or(c.listen, "127.0.0.1:0"))
	out, _ := c.cmd.StdoutPipe()
	var stderr bytes.Buffer
	c.cmd.Stderr = &stderr
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
	c.t.Fatalf("serve ended before ready: %s", stderr.String())
	return 0
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
	c.run("migrate")
	return c
}

// TestLoad is 'make bench'.
func TestLoad(t *testing.T) {
	if os.Getenv("MESH_BENCH") == "" {
		t.Skip("the load measurement runs from 'make bench' (MESH_BENCH=1)")
	}
	dir := t.TempDir()
	mc := build(t, dir, "./cmd/mesh-controller", "mesh-controller")
	mh := build(t, dir, "./cmd/mesh-host", "mesh-host")
	fmt.Printf("\nmesh-controller under load, on this machine (%d cores):\n\n", runtimeCores())
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

	for _, s := range []struct {
		hosts    int
		interval time.Duration
		fanout   bool
	}{{1000, 10 * time.Second, true}, {1000, time.Second, false}, {10000, 10 * time.Second, false}} {
		scenario(t, mc, mh, s.hosts, s.interval, s.fanout, natsRate)
	}
	restartUnderLoad(t, mc, mh, 10000)
	fmt.Println()
}

func runtimeCores() int {
	out, _ := exec.Command("nproc").Output()
	n, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	return n
}

func scenario(t *testing.T, mc, mh string, hosts int, interval time.Duration, fanout bool, natsRate float64) {
	c := newController(t, mc)
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
	// Wait until every host beats, then measure a steady window.
	deadline := time.Now().Add(joinWait)
	for time.Now().Before(deadline) {
		out, _ := c.run("node", "list", "--json")
		if strings.Count(out, `"heartbeat_interval_s": `+strconv.FormatFloat(interval.Seconds(), 'f', -1, 64)+",") >= hosts {
			break
		}
		time.Sleep(2 * time.Second)
	}
	pid := c.cmd.Process.Pid
	t0, w0 := procTicks(pid), time.Now()
	time.Sleep(20 * time.Second)
	cpu := float64(procTicks(pid)-t0) / 100 / time.Since(w0).Seconds()
	add(label+": controller CPU", fmt.Sprintf("%.0f%% of one core", cpu*100), "goal: heartbeats on at most a third of a core")
	add(label+": controller resident memory", mib(procRSS(pid)), "goal < 512 MiB at 10,000")
	var nl, st []time.Duration
	for i := 0; i < 5; i++ {
		_, d := c.run("node", "list", "--json")
		nl = append(nl, d)
		_, d = c.run("status", "--json")
		st = append(st, d)
	}
	add(label+": node list --json (median of 5)", median(nl).Round(time.Millisecond).String(), "whole process")
	add(label+": status --json (median of 5)", median(st).Round(time.Millisecond).String(), "goal < 50 ms")
	if fanout {
		fanOut(t, c, hosts)
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
	rate := float64(hosts) / interval.Seconds()
	add(label+": heartbeat rate vs raw NATS", fmt.Sprintf("%.0f beats/s", rate), fmt.Sprintf("%.3f%% of %.0f msg/s", 100*rate/natsRate, natsRate))
}

// absorbedBeats counts the heartbeats the controller took in: one interval
// counted in the hourly aggregates per beat after each node's first, plus
// the first.
func absorbedBeats(t *testing.T, data string) int64 {
	ctx := context.Background()
	db, err := sqlite.Open(ctx, sqlite.Location{Context: "health", DSN: filepath.Join(data, "health.db")}, false)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var intervals, nodes int64
	db.Reader.QueryRow(`SELECT coalesce(sum(count), 0), count(DISTINCT node) FROM heartbeat_hours`).Scan(&intervals, &nodes)
	return intervals + nodes
}

// fanOut assigns one module to every node, then moves it to a new version
// with one roll-out --together: the time until every host reports it applied.
func fanOut(t *testing.T, c *controller, hosts int) {
	ctx := context.Background()
	a := app.New(c.data)
	defer a.Close()
	v1 := filepath.Join(c.data, "v1.json")
	v2 := filepath.Join(c.data, "v2.json")
	os.WriteFile(v1, []byte(`{"module": "fan", "version": "1.0.0", "data": [{"name": "d", "path": "/srv/fan", "precious": "rebuildable"}]}`), 0o600)
	os.WriteFile(v2, []byte(`{"module": "fan", "version": "2.0.0", "data": [{"name": "d", "path": "/srv/fan", "precious": "rebuildable"}]}`), 0o600)
	c.run("module", "add", v1)
	nodes, _ := a.NodeList(ctx)
	start := time.Now()
	for _, n := range nodes {
		if _, err := a.Assign(ctx, n.Name, []string{"fan"}); err != nil {
			t.Fatal(err)
		}
	}
	add(fmt.Sprintf("fan-out: assign one module to %d nodes, one by one", hosts), time.Since(start).Round(time.Millisecond).String(), "each signed, kept and sent")
	c.run("module", "add", v2)
	start = time.Now()
	c.run("upgrade", "fan", "roll-out", "--together", "--wait", "5m")
	all := time.Since(start)
	// Through the stores this process opened for the assigns: a process
	// opens each store once.
	st, err := a.Stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	db := st.DB("inventory")
	var lat []time.Duration
	rows, _ := db.Reader.Query(`SELECT applied_at FROM nodes WHERE applied_at IS NOT NULL`)
	for rows.Next() {
		var s string
		rows.Scan(&s)
		if at, err := sqlite.ParseTime(s); err == nil && at.After(start) {
			lat = append(lat, at.Sub(start))
		}
	}
	rows.Close()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	if len(lat) == 0 {
		add("fan-out: roll-out --together", "no host reported", "")
		return
	}
	p := func(q float64) time.Duration {
		return lat[min(int(q*float64(len(lat))), len(lat)-1)].Round(time.Millisecond)
	}
	add(fmt.Sprintf("fan-out: roll-out --together to %d hosts, all applied", len(lat)), all.Round(time.Millisecond).String(),
		fmt.Sprintf("per host p50 %s, p99 %s, max %s; goal ~1.5 s", p(0.5), p(0.99), lat[len(lat)-1].Round(time.Millisecond)))
	_ = inventory.Converged
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
