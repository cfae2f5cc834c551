package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"mesh-controller/app/protocol"
)

// holder is a process already running on an adopted machine: sleep,
// holding a listening socket on a port it inherited.
type holder struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

// holdPort starts a holder of 127.0.0.1:port (waiting for the port to be
// free: a holder just killed may still be closing).
func holdPort(t *testing.T, port string) *holder {
	t.Helper()
	var ln net.Listener
	var err error
	waitFor(t, "port "+port+" free", func() bool {
		ln, err = net.Listen("tcp", "127.0.0.1:"+port)
		return err == nil
	})
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "600")
	cmd.ExtraFiles = []*os.File{f}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	ln.Close()
	h := &holder{cmd: cmd, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(h.exited) }()
	t.Cleanup(h.stop)
	return h
}

func (h *holder) stop() {
	_ = h.cmd.Process.Kill()
	<-h.exited
}

func (h *holder) pid() int { return h.cmd.Process.Pid }

// A module taken onto an adopted node where something already holds its
// port and its data path has files: the preview names the holder (pid,
// command) and the data's size; a digest whose preview the machine no
// longer matches (the holder restarted) is refused naming the change; a
// data path that is a symlink is refused and named; --yes with the
// digest of the preview as it is stops the holder, starts the module, and
// leaves the data there; plan says it was taken and from what, and the
// hand-act log has it.
func TestTake_AdoptedNode(t *testing.T) {
	m := newTestMesh(t)
	ctx := context.Background()
	_, port, _ := strings.Cut(freeAddr(t), ":")
	b, err := os.ReadFile(helloManifest)
	if err != nil {
		t.Fatal(err)
	}
	m.addModule(writeManifest(t, strings.ReplaceAll(string(b), "18480", port)))
	adopted := func(name string) *testHost {
		return m.joinToken(name, TokenRequest{Node: name, New: true, Adopted: true, TTL: time.Hour}, nil)
	}
	db1, _, db3 := adopted("db1"), adopted("db2"), adopted("db3")
	old := holdPort(t, port)

	// A stale digest: the holder restarted between the preview and --yes.
	p, _, err := m.c.Take(ctx, TakeRequest{Node: "db2", Module: "hello"})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Stop.Processes) != 1 || p.Stop.Processes[0] != (protocol.TakeProcess{Pid: old.pid(), Command: "sleep"}) {
		t.Fatalf("the cutover stops %+v, want pid %d (sleep)", p.Stop.Processes, old.pid())
	}
	old.stop()
	now := holdPort(t, port)
	_, taken, err := m.c.Take(ctx, TakeRequest{Node: "db2", Module: "hello", Yes: p.Digest})
	want := fmt.Sprintf("tcp/%s on 127.0.0.1 was held by pid %d (sleep), now held by pid %d (sleep)", port, old.pid(), now.pid())
	if !errors.Is(err, ErrTakeChanged) || !strings.Contains(err.Error(), want) || taken != nil {
		t.Fatalf("take --yes with a stale digest: %v, want %v naming %q", err, ErrTakeChanged, want)
	}

	// A data path that is a symlink is refused, named.
	if err := os.MkdirAll(filepath.Join(db3.root, "var", "lib"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(t.TempDir(), filepath.Join(db3.root, "var", "lib", "hello")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.c.Take(ctx, TakeRequest{Node: "db3", Module: "hello"}); !errors.Is(err, ErrTakeSymlink) || !strings.Contains(err.Error(), "/var/lib/hello") {
		t.Fatalf("take with a symlinked data path: %v, want %v naming /var/lib/hello", err, ErrTakeSymlink)
	}

	// The take itself: the holder named, stopped; the data kept.
	db1.install(t, "hello", "bin/hello", buildHello(t))
	data := filepath.Join(db1.root, "var", "lib", "hello")
	if err := os.MkdirAll(data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "kept-from-before"), []byte("twelve bytes"), 0o644); err != nil {
		t.Fatal(err)
	}
	p, _, err = m.c.Take(ctx, TakeRequest{Node: "db1", Module: "hello"})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Look.Ports) != 1 || len(p.Look.Ports[0].Holders) != 1 || p.Look.Ports[0].Holders[0].Pid != now.pid() || p.Look.Ports[0].Holders[0].Command != "sleep" {
		t.Fatalf("the preview's port holders: %+v, want pid %d (sleep)", p.Look.Ports, now.pid())
	}
	if len(p.Look.Data) != 1 || !p.Look.Data[0].Dir || p.Look.Data[0].Bytes != 12 {
		t.Fatalf("the preview's data: %+v, want /var/lib/hello, 12 bytes", p.Look.Data)
	}
	again, _, err := m.c.Take(ctx, TakeRequest{Node: "db1", Module: "hello"})
	if err != nil || again.Digest != p.Digest {
		t.Fatalf("the same machine previewed again: digest %s, was %s (%v)", again.Digest, p.Digest, err)
	}
	_, taken, err = m.c.Take(ctx, TakeRequest{Node: "db1", Module: "hello", Yes: p.Digest})
	if err != nil || taken == nil {
		t.Fatalf("take --yes %s: %v", p.Digest, err)
	}
	select {
	case <-now.exited:
	case <-time.After(protocol.TakeGrace + 5*time.Second):
		t.Fatalf("the holder (pid %d) still runs after the cutover", now.pid())
	}
	waitFor(t, "hello ready on db1", func() bool { return m.moduleState("db1", "hello").State == protocol.StateReady })
	if b, err := os.ReadFile(filepath.Join(data, "kept-from-before")); err != nil || string(b) != "twelve bytes" {
		t.Fatalf("the data from before the take: %q, %v", b, err)
	}
	pv, err := m.c.PlanShow(ctx, "db1")
	if err != nil {
		t.Fatal(err)
	}
	reasons := strings.Join(pv.Plan.Reasons["hello"], "\n")
	if !strings.Contains(reasons, "taken by a person") || !strings.Contains(reasons, fmt.Sprintf("pid %d (sleep)", now.pid())) {
		t.Errorf("plan's reasons for hello: %q, want it taken from pid %d (sleep)", reasons, now.pid())
	}
	acts, err := m.c.HandActs(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, a := range acts.Acts {
		found = found || (a.What == "take db1 hello" && a.Cause == "take" && strings.Contains(a.Why, p.Digest))
	}
	if !found {
		t.Errorf("no hand act for the take in %+v", acts.Acts)
	}
	// Taken once: the same module again is refused as on the node.
	if _, _, err := m.c.Take(ctx, TakeRequest{Node: "db1", Module: "hello"}); !errors.Is(err, ErrAlreadyOnNode) {
		t.Errorf("take of a module on the node already: %v", err)
	}
}
