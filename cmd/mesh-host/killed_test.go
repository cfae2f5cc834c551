package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"mesh-controller/app"
	"mesh-controller/app/apptest"
)

// alive says a process runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z"
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 20s for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The real mesh-host binary, SIGKILLed while it runs a module that forked a
// child: the module's leader dies with its host (parent-death signal); the
// child it forked, which only a cgroup could reach at once, is ended when
// the host starts again (the pid file's sweep), and the module runs again.
// A host stopped with SIGTERM leaves nothing running.
func TestHost_KilledModulesDoNotOutliveIt(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "mesh-host")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build mesh-host: %v\n%s", err, out)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := apptest.NewEnv(filepath.Join(dir, "controller"), func(string) string { return "" })
	t.Cleanup(func() { c.Close() })
	if _, err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	ready, done := make(chan app.Ready, 1), make(chan error, 1)
	go func() {
		done <- c.Serve(ctx, app.ServeOptions{Listen: "127.0.0.1:0", Ready: func(r app.Ready) { ready <- r }})
	}()
	t.Cleanup(func() { cancel(); <-done })
	var url string
	select {
	case r := <-ready:
		url = r.BrokerURL
	case err := <-done:
		t.Fatal(err)
	}
	tok, err := c.TokenIssue(ctx, app.TokenRequest{Node: "web1", New: true, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	state, root := filepath.Join(dir, "state"), filepath.Join(dir, "root")
	if out, err := exec.Command(bin, "join", "--broker", url, "--token", tok.Token, "--node", "web1", "--state", state).CombinedOutput(); err != nil {
		t.Fatalf("join: %v\n%s", err, out)
	}
	// The module: a shell that forks a child, writes its pid, and becomes
	// the leader (exec), as a daemonising program might.
	script := filepath.Join(root, "etc/mesh/modules/forker/bin/forker")
	if err := os.MkdirAll(filepath.Dir(script), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(script, []byte("#!/bin/sh\nsleep 1000 &\necho $! > \"$MESH_DATA_STATE/child\"\nexec sleep 1000\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	manifest := filepath.Join(dir, "forker.json")
	if err := os.WriteFile(manifest, []byte(`{"module": "forker", "version": "1.0.0", "run": {"command": ["bin/forker"], "ready": {"after": "100ms"}},
		"data": [{"name": "state", "path": "/var/lib/forker", "precious": "rebuildable"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ModuleAdd(ctx, manifest, ""); err != nil {
		t.Fatal(err)
	}
	startHost := func() *exec.Cmd {
		h := exec.Command(bin, "run", "--state", state, "--root", root, "--heartbeat", "200ms", "--no-module-users")
		h.Stdout, h.Stderr = os.Stderr, os.Stderr
		if err := h.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Process.Kill(); h.Wait() })
		return h
	}
	leader := func() (pid int, state string) {
		n, err := c.NodeShow(ctx, "web1")
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range n.Modules {
			if m.Module == "forker" {
				return m.Pid, m.State
			}
		}
		return 0, ""
	}
	child := func() int {
		b, _ := os.ReadFile(filepath.Join(root, "var/lib/forker/child"))
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return pid
	}

	h := startHost()
	if _, err := c.Assign(ctx, "web1", []string{"forker"}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "forker ready", func() bool { pid, st := leader(); return st == "ready" && alive(pid) && child() > 0 })
	firstLeader, _ := leader()
	firstChild := child()

	if err := h.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	h.Wait()
	waitUntil(t, "the leader to die with its host", func() bool { return !alive(firstLeader) })
	if alive(firstChild) {
		t.Logf("the forked child %d outlived the SIGKILLed host (no cgroup v2 here); the next start sweeps it", firstChild)
	}

	h = startHost()
	waitUntil(t, "the forked child swept and forker running again", func() bool {
		pid, st := leader()
		return !alive(firstChild) && st == "ready" && pid != firstLeader && alive(pid)
	})
	second, _ := leader()
	waitUntil(t, "the new child's pid", func() bool { return child() != firstChild && child() > 0 })
	secondChild := child()

	if err := h.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := h.Wait(); err != nil {
		t.Fatalf("mesh-host on SIGTERM: %v", err)
	}
	if alive(second) || alive(secondChild) {
		t.Fatalf("after the host stopped: leader %d alive %v, child %d alive %v", second, alive(second), secondChild, alive(secondChild))
	}
}
