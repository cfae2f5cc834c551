package loadbench

import (
	"cmp"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"mesh-controller/embedded/broker/clustertest"
)

// simPerProcess bounds the hosts one simulator plays: each holds a
// connection (a file) and this machine gives a process 20,000 files.
const simPerProcess = 8000

// TestScaleCluster is make bench's scale past one box, simulated:
// MESH_BENCH_SCALE_HOSTS hosts (50,000 by default) beating every 30 s
// through a cluster of three nats-server processes on loopback (each
// configured as broker show --config prints), the stores on PostgreSQL
// (make bench runs it under scripts/with-postgres), the hosts played by
// simulators of at most simPerProcess each. It prints the controller's
// CPU, resident memory and heap per host, status's time, the servers'
// memory, and what those per-host figures predict for 100,000 hosts:
//
//	scripts/with-postgres env MESH_BENCH=1 MESH_BENCH_POSTGRES=1 go test -count=1 -run TestScaleCluster -v -timeout 60m ./app/loadbench/
func TestScaleCluster(t *testing.T) {
	if os.Getenv("MESH_BENCH") == "" {
		t.Skip("the load measurement runs with MESH_BENCH=1 ('make bench')")
	}
	if !onPostgres() {
		t.Skip("the scale past one box keeps its stores on PostgreSQL: run it under scripts/with-postgres with MESH_BENCH_POSTGRES=1, as make bench does")
	}
	hosts, err := strconv.Atoi(cmp.Or(os.Getenv("MESH_BENCH_SCALE_HOSTS"), "50000"))
	if err != nil {
		t.Fatal(err)
	}
	const interval = 30 * time.Second
	dir := t.TempDir()
	mc, mh := build(t, dir, "./cmd/mesh-controller", "mesh-controller"), build(t, dir, "./cmd/mesh-host", "mesh-host")
	c := newController(t, mc)
	cl := c.cluster()
	if pd := os.Getenv("MESH_BENCH_PROFILES"); pd != "" {
		os.MkdirAll(pd, 0o755)
		c.profile = filepath.Join(pd, fmt.Sprintf("scale-%d-hosts", hosts))
	}
	c.serve()
	defer c.stop()
	// Idle, before any host: what the per-host figures are counted above.
	time.Sleep(2 * time.Second)
	idleRSS := procRSS(c.cmd.Process.Pid)
	idleHeap := heapInUse(c)

	tokens := filepath.Join(c.data, "tokens.txt")
	c.run("token", "issue", "--new", "s", "--count", strconv.Itoa(hosts), "--out", tokens)
	b, err := os.ReadFile(tokens)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(strings.TrimSpace(string(b))+"\n", "\n")
	lines = lines[:len(lines)-1]
	fmt.Printf("\n%d simulated hosts beating every %s through a cluster of three nats-servers on loopback, the stores on PostgreSQL (a local server, fsync off), %d simulators:\n\n",
		hosts, interval, (len(lines)+simPerProcess-1)/simPerProcess)
	fmt.Printf("  %-58s %-22s %s\n", "FIGURE", "VALUE", "BESIDE IT")
	st := openStores(t, c.data)
	var sims []*exec.Cmd
	for i := 0; i*simPerProcess < len(lines); i++ {
		part := filepath.Join(c.data, fmt.Sprintf("tokens-%d.txt", i))
		if err := os.WriteFile(part, []byte(strings.Join(lines[i*simPerProcess:min((i+1)*simPerProcess, len(lines))], "")), 0o600); err != nil {
			t.Fatal(err)
		}
		// Each simulator joins through its own server of the three.
		sim := exec.Command(mh, "simulate", "--broker", cl.Servers[i%len(cl.Servers)].URL, "--tokens", part, "--heartbeat", interval.String(), "--report", "1h")
		if err := sim.Start(); err != nil {
			t.Fatal(err)
		}
		sims = append(sims, sim)
	}
	defer func() {
		for _, s := range sims {
			s.Process.Kill()
			s.Wait()
		}
	}()
	d, n := untilCount(st, 10*time.Minute, hosts, `SELECT count(*) FROM nodes WHERE heartbeat_interval_s IS NOT NULL`)
	add(fmt.Sprintf("%d hosts joined and beating", hosts), measured(d, n, hosts), "from the simulators' start")
	if n < hosts {
		t.Logf("only %d of %d hosts beat: the figures are of them", n, hosts)
	}

	// A whole interval for the crowd's garbage, then a window of two.
	time.Sleep(interval)
	pid := c.cmd.Process.Pid
	c.cmd.Process.Signal(syscall.SIGUSR2)
	t0, w0 := procTicks(pid), time.Now()
	s0 := serversTicks(cl)
	time.Sleep(2 * interval)
	cpu := float64(procTicks(pid)-t0) / 100 / time.Since(w0).Seconds()
	serversCPU := float64(serversTicks(cl)-s0) / 100 / time.Since(w0).Seconds()
	rss := procRSS(pid)
	c.cmd.Process.Signal(syscall.SIGUSR2)
	heap := heapInUse(c)
	var serversRSS int64
	for _, s := range cl.Servers {
		serversRSS += procRSS(s.Pid())
	}
	add("controller CPU", fmt.Sprintf("%.1f%% of one core", cpu*100), fmt.Sprintf("%.2f ‰ of a core per 1,000 hosts", cpu*1000/float64(n)*1000))
	add("controller resident memory", mib(rss), fmt.Sprintf("idle %s; %.1f KB more per host", mib(idleRSS), float64(rss-idleRSS)/float64(n)/1000))
	add("controller heap in use", mib(heap), fmt.Sprintf("idle %s; %.1f KB more per host", mib(idleHeap), float64(heap-idleHeap)/float64(n)/1000))
	add("the three nats-servers: resident memory, CPU", fmt.Sprintf("%s, %.0f%%", mib(serversRSS), serversCPU*100), fmt.Sprintf("%.1f KB per connection", float64(serversRSS)/float64(n)/1000))
	var sts, nls []time.Duration
	for range 3 {
		_, d := c.run("status", "--json")
		sts = append(sts, d)
		_, d = c.run("node", "list", "--json")
		nls = append(nls, d)
	}
	add("status --json (median of 3)", median(sts).Round(time.Millisecond).String(), "whole process")
	add("node list --json (median of 3)", median(nls).Round(time.Millisecond).String(), "whole process")
	// What the per-host figures say of 100,000 hosts at the same beat.
	const predict = 100000
	add(fmt.Sprintf("predicted at %d hosts: controller CPU", predict), fmt.Sprintf("%.0f%% of one core", cpu*predict/float64(n)*100), "linear in hosts from this run")
	add(fmt.Sprintf("predicted at %d hosts: controller resident memory", predict),
		mib(idleRSS+int64(float64(rss-idleRSS)*predict/float64(n))), "idle + per host × hosts")
	add(fmt.Sprintf("predicted at %d hosts: status --json", predict), (median(sts) * predict / time.Duration(n)).Round(time.Millisecond).String(), "linear in nodes")
	c.nameScaleProfiles()
}

// heapInUse is the controller's heap in use as its heap profile's log
// line says (serve --heap-profile), 0 without profiles.
func heapInUse(c *controller) int64 {
	var mb int64
	if _, err := fmt.Sscanf(c.heapProfile(), "heap in use %d MiB", &mb); err != nil {
		return 0
	}
	return mb << 20
}

// serversTicks is the CPU the cluster's servers have taken, in ticks.
func serversTicks(cl *clustertest.Cluster) int64 {
	var n int64
	for _, s := range cl.Servers {
		n += procTicks(s.Pid())
	}
	return n
}

// nameScaleProfiles names the scale run's CPU profiles: until the window,
// the window, after it.
func (c *controller) nameScaleProfiles() {
	if c.profile == "" {
		return
	}
	c.stop()
	for i, phase := range []string{"joins", "steady", "end"} {
		from := c.profile + ".cpu.pprof"
		if i > 0 {
			from += "." + strconv.Itoa(i)
		}
		os.Rename(from, c.profile+"-"+phase+".cpu.pprof")
	}
}
