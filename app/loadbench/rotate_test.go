package loadbench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// TestRotateUnderLoad measures a rotation of the signing key over
// MESH_BENCH_HOSTS simulated hosts (10,000 by default), with the real
// binaries: the time from 'identity rotate' until every host acknowledged
// the new key (its beats say it verifies with it), and the serving
// controller's CPU meanwhile. Not part of make test:
//
//	MESH_BENCH=1 go test -run TestRotateUnderLoad -v -timeout 20m ./app/loadbench/
func TestRotateUnderLoad(t *testing.T) {
	hosts := benchHosts(t, 10000)
	dir := t.TempDir()
	mc, mh := build(t, dir, "./cmd/mesh-controller", "mesh-controller"), build(t, dir, "./cmd/mesh-host", "mesh-host")
	c := newController(t, mc)
	if dir := os.Getenv("MESH_BENCH_PROFILES"); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		c.profile = filepath.Join(dir, fmt.Sprintf("rotate-%d-hosts", hosts))
	}
	c.serve()
	defer c.stop()
	tokens := filepath.Join(c.data, "tokens.txt")
	c.run("token", "issue", "--new", "k", "--count", strconv.Itoa(hosts), "--out", tokens)
	const interval = 10 * time.Second
	sim := exec.Command(mh, "simulate", "--broker", c.url, "--tokens", tokens, "--heartbeat", interval.String(), "--report", "1h", "--json")
	var simOut bytes.Buffer
	sim.Stdout = &simOut
	if err := sim.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Process.Kill(); sim.Wait() })
	st := openStores(t, c.data)
	// acked waits until every host acknowledged key, or within runs out:
	// how many did, and when half, 99 % and all of them had.
	acked := func(key string, within time.Duration) (n int, half, most time.Duration) {
		start := time.Now()
		for time.Since(start) < within {
			st.DB("identity").Reader.QueryRow(`SELECT count(*) FROM key_acks WHERE key = ?`, key).Scan(&n)
			if half == 0 && n >= hosts/2 {
				half = time.Since(start)
			}
			if most == 0 && n >= hosts*99/100 {
				most = time.Since(start)
			}
			if n >= hosts {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		return n, half, most
	}
	out, _ := c.run("identity", "show")
	first := regexp.MustCompile(`(?m)^fingerprint\s+(\S+)$`).FindStringSubmatch(out)[1]
	// Every host joined and beat once with the first key.
	if n, _, _ := acked(first, time.Duration(hosts/100+120)*time.Second); n < hosts {
		t.Fatalf("only %d of %d hosts beat with the first key", n, hosts)
	}
	time.Sleep(interval) // a steady state: no join left in flight
	// The controller's CPU with every host beating and nothing rotated,
	// to set beside what the rotation took.
	pid := c.cmd.Process.Pid
	ticks, start := procTicks(pid), time.Now()
	time.Sleep(2 * interval)
	steady := float64(procTicks(pid)-ticks) / 100 / time.Since(start).Seconds()

	ticks, start = procTicks(pid), time.Now()
	out, took := c.run("identity", "rotate", "--why", "load bench")
	m := regexp.MustCompile(`signing key rotated: (\S+) replaces`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("identity rotate said: %s", out)
	}
	n, half, most := acked(m[1], 2*time.Minute)
	all := time.Since(start)
	half, most = half+took, most+took
	cpu := float64(procTicks(pid)-ticks) / 100
	add(fmt.Sprintf("rotation over %d hosts: identity rotate itself", hosts), took.Round(time.Millisecond).String(), "its own process: the rotation, its hand act, the latest declarations signed again")
	add(fmt.Sprintf("rotation over %d hosts: until every host acknowledged the new key", hosts), measured(all, n, hosts),
		fmt.Sprintf("from the command's start: half by %s, 99%% by %s (written each second)", half.Round(100*time.Millisecond), most.Round(100*time.Millisecond)))
	add(fmt.Sprintf("rotation over %d hosts: serving controller CPU meanwhile", hosts), fmt.Sprintf("%.2f s (%.0f%% of one core)", cpu, 100*cpu/all.Seconds()),
		fmt.Sprintf("%.0f%% of one core steady before it, every host beating", 100*steady))
	sim.Process.Signal(os.Interrupt)
	sim.Wait()
	var stats struct {
		KeysFollowed int64 `json:"keys_followed"`
		GaveUp       int64 `json:"gave_up"`
	}
	json.Unmarshal(simOut.Bytes(), &stats)
	add(fmt.Sprintf("rotation over %d hosts: hosts that followed it / gave up", hosts), fmt.Sprintf("%d / %d", stats.KeysFollowed, stats.GaveUp), "mesh-host simulate's count")
}
