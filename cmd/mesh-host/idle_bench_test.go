package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"mesh-controller/app"
	"mesh-controller/app/apptest"
)

// BenchmarkHost_Idle50Modules is the real mesh-host binary supervising 50
// modules that run quietly, beating every 10 s: its own CPU (a share of
// one core) and resident memory over 30 s once all are ready.
//
//	go test -run '^$' -bench Idle50Modules -benchtime 1x ./cmd/mesh-host/
func BenchmarkHost_Idle50Modules(b *testing.B) {
	const modules = 50
	dir := b.TempDir()
	bin := filepath.Join(dir, "mesh-host")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		b.Fatalf("build mesh-host: %v\n%s", err, out)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := apptest.NewEnv(filepath.Join(dir, "controller"), func(string) string { return "" })
	b.Cleanup(func() { c.Close() })
	if _, err := c.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	ready, done := make(chan app.Ready, 1), make(chan error, 1)
	go func() {
		done <- c.Serve(ctx, app.ServeOptions{Listen: "127.0.0.1:0", Ready: func(r app.Ready) { ready <- r }})
	}()
	b.Cleanup(func() { cancel(); <-done })
	url := (<-ready).BrokerURL
	tok, err := c.TokenIssue(ctx, app.TokenRequest{Node: "web1", New: true, TTL: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	state, root := filepath.Join(dir, "state"), filepath.Join(dir, "root")
	if out, err := exec.Command(bin, "join", "--broker", url, "--token", tok.Token, "--node", "web1", "--state", state).CombinedOutput(); err != nil {
		b.Fatalf("join: %v\n%s", err, out)
	}
	h := exec.Command(bin, "run", "--state", state, "--root", root, "--no-module-users")
	if err := h.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { h.Process.Signal(os.Interrupt); h.Wait() })
	var names []string
	for i := 1; i <= modules; i++ {
		name := fmt.Sprintf("quiet%02d", i)
		f := filepath.Join(dir, name+".json")
		body := `{"module": "` + name + `", "version": "1.0.0", "run": {"command": ["sleep", "100000"], "ready": {"after": "100ms"}}}`
		if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
			b.Fatal(err)
		}
		if _, err := c.ModuleAdd(ctx, f, ""); err != nil {
			b.Fatal(err)
		}
		names = append(names, name)
	}
	if _, err := c.Assign(ctx, "web1", names); err != nil {
		b.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		n, err := c.NodeShow(ctx, "web1")
		if err != nil {
			b.Fatal(err)
		}
		readyCount := 0
		for _, m := range n.Modules {
			if m.State == "ready" {
				readyCount++
			}
		}
		if readyCount == modules {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d ready after 60s", readyCount, modules)
		}
		time.Sleep(200 * time.Millisecond)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		before := cpuTicks(b, h.Process.Pid)
		start := time.Now()
		time.Sleep(30 * time.Second)
		used := float64(cpuTicks(b, h.Process.Pid)-before) / 100 // clock ticks of 10 ms
		b.ReportMetric(100*used/time.Since(start).Seconds(), "%core")
		b.ReportMetric(float64(rssKiB(b, h.Process.Pid))/1024, "RSS-MiB")
	}
}

// cpuTicks is a process's user and system time in clock ticks (1/100 s).
func cpuTicks(b *testing.B, pid int) int64 {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		b.Fatal(err)
	}
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return u + st
}

// rssKiB is a process's resident memory.
func rssKiB(b *testing.B, pid int) int64 {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return n
		}
	}
	return 0
}
