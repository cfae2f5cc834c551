package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"mesh-controller/app"
	"mesh-controller/app/host/holdtest"
	"mesh-controller/app/protocol"
)

// holdPort starts a holder of 127.0.0.1:port, something already running
// on an adopted machine (waiting for the port to be free: a holder just
// stopped may still be closing).
func holdPort(t *testing.T, port string) *holdtest.Holder {
	t.Helper()
	h, err := holdtest.Listen("127.0.0.1:"+port, 15*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Stop)
	return h
}

// A module taken onto an adopted node where something already holds its
// port and its data path has files: the preview names the holder (pid,
// command) and the data's size; a digest whose preview the machine no
// longer matches (the holder restarted) is refused naming the change; a
// data path that is a symlink is refused and named; --yes with the
// digest of the preview as it is stops the holder, starts the module, and
// leaves the data there; plan says it was taken and from what, and the
// hand-act log has it.
func TestTake_AdoptedNode(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	ctx := context.Background()
	_, port, _ := strings.Cut(freeAddr(t), ":")
	b, err := os.ReadFile(helloManifest)
	if err != nil {
		t.Fatal(err)
	}
	// The example under a name of its own: processes named hello (other
	// tests' on this machine) would be named in the preview too.
	manifest := strings.ReplaceAll(strings.Replace(string(b), `"module": "hello"`, `"module": "takenhello"`, 1), "18480", port)
	m.addModule(writeManifest(t, manifest))
	adopted := func(name string) *testHost {
		return m.joinToken(name, app.TokenRequest{Node: name, New: true, Adopted: true, TTL: time.Hour}, nil)
	}
	db1, _, db3 := adopted("db1"), adopted("db2"), adopted("db3")
	old := holdPort(t, port)

	// A stale digest: the holder restarted between the preview and --yes.
	p, _, err := m.c.Take(ctx, app.TakeRequest{Node: "db2", Module: "takenhello"})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Stop.Processes) != 1 || p.Stop.Processes[0] != (protocol.TakeProcess{Pid: old.Pid(), Command: "sleep"}) {
		t.Fatalf("the cutover stops %+v, want pid %d (sleep)", p.Stop.Processes, old.Pid())
	}
	old.Stop()
	now := holdPort(t, port)
	_, taken, err := m.c.Take(ctx, app.TakeRequest{Node: "db2", Module: "takenhello", Yes: p.Digest})
	want := fmt.Sprintf("tcp/%s on 127.0.0.1 was held by pid %d (sleep), now held by pid %d (sleep)", port, old.Pid(), now.Pid())
	if !errors.Is(err, app.ErrTakeChanged) || !strings.Contains(err.Error(), want) || taken != nil {
		t.Fatalf("take --yes with a stale digest: %v, want %v naming %q", err, app.ErrTakeChanged, want)
	}

	// A data path that is a symlink is refused, named.
	if err := os.MkdirAll(filepath.Join(db3.root, "var", "lib"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(t.TempDir(), filepath.Join(db3.root, "var", "lib", "hello")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.c.Take(ctx, app.TakeRequest{Node: "db3", Module: "takenhello"}); !errors.Is(err, app.ErrTakeSymlink) || !strings.Contains(err.Error(), "/var/lib/hello") {
		t.Fatalf("take with a symlinked data path: %v, want %v naming /var/lib/hello", err, app.ErrTakeSymlink)
	}

	// The take itself: the holder named, stopped; the data kept.
	db1.install(t, "takenhello", "bin/hello", buildHello(t))
	data := filepath.Join(db1.root, "var", "lib", "hello")
	if err := os.MkdirAll(data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "kept-from-before"), []byte("twelve bytes"), 0o644); err != nil {
		t.Fatal(err)
	}
	p, _, err = m.c.Take(ctx, app.TakeRequest{Node: "db1", Module: "takenhello"})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Look.Ports) != 1 || len(p.Look.Ports[0].Holders) != 1 || p.Look.Ports[0].Holders[0].Pid != now.Pid() || p.Look.Ports[0].Holders[0].Command != "sleep" {
		t.Fatalf("the preview's port holders: %+v, want pid %d (sleep)", p.Look.Ports, now.Pid())
	}
	if len(p.Look.Data) != 1 || !p.Look.Data[0].Dir || p.Look.Data[0].Bytes != 12 {
		t.Fatalf("the preview's data: %+v, want /var/lib/hello, 12 bytes", p.Look.Data)
	}
	again, _, err := m.c.Take(ctx, app.TakeRequest{Node: "db1", Module: "takenhello"})
	if err != nil || again.Digest != p.Digest {
		t.Fatalf("the same machine previewed again: digest %s, was %s (%v): %q", again.Digest, p.Digest, err, app.TakeChanges(p, again))
	}
	_, taken, err = m.c.Take(ctx, app.TakeRequest{Node: "db1", Module: "takenhello", Yes: p.Digest})
	if err != nil || taken == nil {
		t.Fatalf("take --yes %s: %v", p.Digest, err)
	}
	b, err = json.Marshal(taken)
	if err != nil {
		t.Fatal(err)
	}
	if bad := notSnakeCase(b); len(bad) > 0 {
		t.Errorf("take --json keys not snake_case: %v", bad)
	}
	select {
	case <-now.Exited():
	case <-time.After(protocol.TakeGrace + 5*time.Second):
		t.Fatalf("the holder (pid %d) still runs after the cutover", now.Pid())
	}
	checkFor(t, settle, m.moduleIn("db1", "takenhello", protocol.StateReady))
	if b, err := os.ReadFile(filepath.Join(data, "kept-from-before")); err != nil || string(b) != "twelve bytes" {
		t.Fatalf("the data from before the take: %q, %v", b, err)
	}
	pv, err := m.c.PlanShow(ctx, "db1")
	if err != nil {
		t.Fatal(err)
	}
	reasons := strings.Join(pv.Plan.Reasons["takenhello"], "\n")
	if !strings.Contains(reasons, "taken by a person") || !strings.Contains(reasons, fmt.Sprintf("pid %d (sleep)", now.Pid())) {
		t.Errorf("plan's reasons for takenhello: %q, want it taken from pid %d (sleep)", reasons, now.Pid())
	}
	acts, err := m.c.HandActs(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, a := range acts.Acts {
		found = found || (a.What == "take db1 takenhello" && a.Cause == "take" && strings.Contains(a.Why, p.Digest))
	}
	if !found {
		t.Errorf("no hand act for the take in %+v", acts.Acts)
	}
	// Taken once: the same module again is refused as on the node.
	if _, _, err := m.c.Take(ctx, app.TakeRequest{Node: "db1", Module: "takenhello"}); !errors.Is(err, app.ErrAlreadyOnNode) {
		t.Errorf("take of a module on the node already: %v", err)
	}
}

// notSnakeCase are the keys of a JSON document that are not snake_case
// (house rule 8).
func notSnakeCase(doc []byte) []string {
	var v any
	if err := json.Unmarshal(doc, &v); err != nil {
		return []string{err.Error()}
	}
	var bad []string
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				if !snakeKey.MatchString(k) {
					bad = append(bad, k)
				}
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(v)
	return bad
}

var snakeKey = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
