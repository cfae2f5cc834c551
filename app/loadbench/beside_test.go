package loadbench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"mesh-controller/app"
	"mesh-controller/app/protocol"
	"mesh-controller/embedded/broker"
)

// steadyWindow is how long a steady state is measured, the controller's
// and the floor's alike.
const steadyWindow = 20 * time.Second

// besides is what the 10,000-host scenarios measured of the controller,
// kept for the rows that put each beside its floor.
type besides struct {
	hosts    int
	interval time.Duration
	rss      int64
	cpu      float64
	// ownPerHost and brokerPerHost are heap bytes in use per host.
	ownPerHost, brokerPerHost float64
	beatsLost                 int64
	// fanApplied hosts applied the settings change, fanP99 after it began.
	fanApplied int
	fanP99     time.Duration
	// fanCPU is the CPU the machine spent on the settings change.
	fanCPU machineCPU
	// joinCPU is the CPU the machine spent on the joins.
	joinCPU machineCPU
	// parts are the settings change's declare parts (plan, sign, store, send).
	parts map[string]time.Duration
	// decl is a declaration the settings change made, for the floor to sign.
	decl protocol.Declaration
	// joins is how long 10,000 joins took (0: not all joined; joined says
	// how many did); restarts the restarts under load, "" when all came back.
	joins    time.Duration
	joined   int
	restarts []string
	gaveUp   int64
	// limits are the steady state under each --memory-limit.
	limits []limitFigures
}

type limitFigures struct {
	mib int
	rss int64
	cpu float64
}

var beside = besides{parts: map[string]time.Duration{}}

// besideHosts is the host count of the scenario measured beside its floor:
// the largest make bench runs.
var besideHosts int

// nameProfiles names the CPU profiles serve wrote, one per phase (each
// SIGUSR2 began the next): the joins, the steady window, node list and
// status, the fan-out, the rest.
func (c *controller) nameProfiles() {
	if c.profile == "" {
		return
	}
	for i, phase := range []string{"joins", "steady", "lists", "fanout", "end"} {
		from := c.profile + ".cpu.pprof"
		if i > 0 {
			from += "." + strconv.Itoa(i)
		}
		os.Rename(from, c.profile+"-"+phase+".cpu.pprof")
	}
}

// joinFloor is the controller's in-process cost of one join, as
// BenchmarkJoin measures it (one after another).
func joinFloor(t *testing.T) time.Duration {
	cmd := exec.Command("go", "test", "-run", "^$", "-bench", "BenchmarkJoin/one", "-benchtime", "2000x", "./app/")
	cmd.Dir = "../.."
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("BenchmarkJoin: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`BenchmarkJoin/one\S*\s+\d+\s+(\d+) ns/op`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("BenchmarkJoin said: %s", out)
	}
	ns, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return time.Duration(ns)
}

// floorRows measures the floor of the 10,000-host figures and prints each
// figure beside it: the bare broker with the host users of issue 32 (four
// permission entries) and with today's, the crypto floor, the signing and
// sending of the fan-out's declarations, the joins'.
func floorRows(t *testing.T, bin string) {
	b := beside
	if b.hosts == 0 {
		return
	}
	beat, pub := signedBeat(t, b.interval)
	type floorFigures struct {
		rss                int64
		cpu                float64
		sign, send, sendTo time.Duration
	}
	measure := func(perms func(string) broker.Permissions, fan bool) floorFigures {
		f := startFloor(t, bin)
		defer f.stop()
		f.connect(b.hosts, perms)
		f.beat(b.interval, beat)
		// As the controller's window: every host beating, then measured.
		for deadline := time.Now().Add(2 * b.interval); f.beats.Load() < int64(b.hosts) && time.Now().Before(deadline); {
			time.Sleep(100 * time.Millisecond)
		}
		var ff floorFigures
		ff.rss, ff.cpu = window(f.cmd.Process.Pid, steadyWindow)
		if fan && b.decl.Node != "" {
			ff.sign, ff.send, ff.sendTo = f.fanOut(b.decl)
		}
		return ff
	}
	before := measure(beforePermissions, false)
	now := measure(app.HostPermissions, true)
	verify := cryptoFloor(t, b.hosts, beat, pub)
	join := joinFloor(t)

	fmt.Printf("\n%d hosts beating every %s, each figure beside its floor measured in this run (the floor: a bare nats-server of go.mod's version,\n"+
		"operator mode, no sublist cache, holding as many connections, each a host's user, permissions and three subscriptions, beating the same signed bytes):\n\n",
		b.hosts, b.interval)
	fmt.Printf("  %-50s %-14s %-44s %-8s %s\n", "FIGURE", "CONTROLLER", "FLOOR", "RATIO", "GOAL")
	r := func(figure, ours, floor string, ratio float64, goal string) {
		rs := ""
		if ratio > 0 {
			rs = fmt.Sprintf("%.2f×", ratio)
		}
		fmt.Printf("  %-50s %-14s %-44s %-8s %s\n", figure, ours, floor, rs, goal)
	}
	r("resident memory", mib(b.rss), mib(now.rss)+" (bare nats-server)", float64(b.rss)/float64(now.rss), "≤ 1.30×")
	nowEntries, beforeEntries := entries(app.HostPermissions("N")), entries(beforePermissions("N"))
	r("permission entries per host user", strconv.Itoa(nowEntries), fmt.Sprintf("%d before; floor %s with them", beforeEntries, mib(before.rss)),
		float64(now.rss)/float64(before.rss), "fewest that keep the attack tests passing")
	r("heap in use per host: the controller's own", fmt.Sprintf("%.1f KB", b.ownPerHost/1000), fmt.Sprintf("broker's %.1f KB per connection", b.brokerPerHost/1000), 0, "≤ 5 KB")
	perInterval := verify.Seconds() / b.interval.Seconds()
	cpuFloor := perInterval + now.cpu
	r("CPU, one core = 100 %", fmt.Sprintf("%.1f %%", b.cpu*100), fmt.Sprintf("%.1f %% (verify %.1f %% + routing %.1f %%)", cpuFloor*100, perInterval*100, now.cpu*100),
		b.cpu/cpuFloor, "≤ 2.00×")
	if b.fanApplied > 0 {
		r("fan-out: settings change applied, p99", b.fanP99.Round(time.Millisecond).String(), fmt.Sprintf("%d of %d hosts applied", b.fanApplied, b.hosts), 0, "≤ 1.5 s")
	}
	cores := runtimeCores()
	if b.fanCPU.total() > 0 {
		// What the two cores allow at best: every process's CPU for the
		// change, spread over every core.
		r("fan-out: the machine's CPU until all applied", b.fanCPU.total().Round(10*time.Millisecond).String(),
			fmt.Sprintf("least wall time on %d cores: %s", cores, b.fanCPU.wall(cores).Round(10*time.Millisecond)), 0,
			fmt.Sprintf("%s: serve %s, hosts %s, command %s", "≤ 1.5 s p99 needs ≤ "+(time.Duration(cores)*1500*time.Millisecond).String(),
				b.fanCPU.serve.Round(10*time.Millisecond), b.fanCPU.hosts.Round(10*time.Millisecond), b.fanCPU.command.Round(10*time.Millisecond)))
	}
	if len(b.parts) > 0 && now.sign > 0 {
		var ours time.Duration
		var said []string
		for _, p := range []string{"plan", "sign", "store", "send"} {
			ours += b.parts[p]
			said = append(said, fmt.Sprintf("%s %d", p, b.parts[p].Milliseconds()))
		}
		r("fan-out: the controller's part (ms: "+strings.Join(said, ", ")+")", ours.Round(time.Millisecond).String(),
			fmt.Sprintf("sign %d ms + send %d ms", now.sign.Milliseconds(), now.send.Milliseconds()), float64(ours)/float64(now.sign+now.send), "")
		r("fan-out: send", b.parts["send"].Round(time.Millisecond).String(),
			fmt.Sprintf("%s (all delivered %s)", now.send.Round(time.Millisecond), now.sendTo.Round(time.Millisecond)), float64(b.parts["send"])/float64(now.send), "close to the floor")
	}
	if b.joins > 0 {
		jf := join * time.Duration(b.hosts)
		r("joins, all at once", b.joins.Round(100*time.Millisecond).String(), fmt.Sprintf("%s (%.2f ms in-process × %d)", jf.Round(100*time.Millisecond),
			float64(join.Microseconds())/1000, b.hosts), float64(b.joins)/float64(jf), "≤ 10 s")
	} else if b.joined > 0 {
		r("joins, all at once", fmt.Sprintf("%d of %d", b.joined, b.hosts), "", 0, "≤ 10 s")
	}
	if n := time.Duration(max(b.joined, 1)); b.joinCPU.total() > 0 {
		r("joins: the machine's CPU per join", (b.joinCPU.total() / n).Round(10*time.Microsecond).String(),
			fmt.Sprintf("least wall time on %d cores: %s", cores, b.joinCPU.wall(cores).Round(100*time.Millisecond)), 0,
			fmt.Sprintf("≤ 10 s needs ≤ %s: serve %s, hosts %s", time.Duration(cores)*10*time.Second/time.Duration(b.hosts),
				(b.joinCPU.serve/n).Round(10*time.Microsecond), (b.joinCPU.hosts/n).Round(10*time.Microsecond)))
	}
	for _, s := range b.restarts {
		r("restart under load: all heard again, caught up", s, "", 0, "≤ 30 s")
	}
	r("heartbeats lost", strconv.FormatInt(b.beatsLost, 10), "", 0, "0")
	for _, l := range b.limits {
		r(fmt.Sprintf("--memory-limit %d: resident memory / CPU", l.mib), fmt.Sprintf("%s / %.1f %%", mib(l.rss), l.cpu*100), "", 0, "what the limit trades")
	}
	if dir := os.Getenv("MESH_BENCH_PROFILES"); dir != "" {
		fmt.Printf("\n  profiles: %s (go tool pprof FILE; CPU one per phase: -joins, -steady, -lists, -fanout, -end)\n", filepath.Clean(dir))
	}
}

// TestFloor is the floor alone, without a controller beside it (its
// columns empty): MESH_BENCH=1 go test -run TestFloor -v ./app/loadbench/
// (MESH_BENCH_HOSTS hosts, 10,000 by default).
func TestFloor(t *testing.T) {
	hosts := benchHosts(t, 10000)
	beside.hosts, beside.interval = hosts, 10*time.Second
	floorRows(t, natsServer(t, t.TempDir()))
}
