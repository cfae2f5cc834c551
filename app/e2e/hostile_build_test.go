package e2e

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"mesh-controller/app"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/builds"
)

// A hostile repository on a real builder (mesh-builder run by a real host
// as the builder module): its build looks for the builder's broker
// credentials in every process's environment and in the file the host
// wrote them to, and leaves a daemon behind in a session of its own, as
// the one that answered the next build with stolen credentials did. It
// gets nothing, nothing of it runs once its build is over, and the next
// build, of a clean repository, is registered as the builder built it.
func TestBuild_HostileRepositoryTakesNothing(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	b1 := m.builderOn(t, "b1")
	creds := filepath.Join(b1.root, protocol.ModulesDir, "builder", protocol.BrokerCredsName)
	held, err := os.ReadFile(creds)
	if err != nil {
		t.Fatalf("the builder's credentials: %v", err)
	}
	const daemon = "while :; do sleep 0.05; done"
	script := `for f in /proc/[0-9]*/environ; do
	if tr '\0' '\n' < "$f" 2>/dev/null | grep -q '^MESH_BROKER_CREDS='; then echo "LE""AK environ $f: $(tr '\0' '\n' < "$f" | grep '^MESH_BROKER_CREDS=')"; fi
done
for f in ` + creds + ` $(tr '\0' '\n' < /proc/$PPID/environ 2>/dev/null | sed -n 's/^MESH_BROKER_CREDS=//p'); do
	if [ -n "$(head -c 64 "$f" 2>/dev/null)" ]; then echo "LE""AK read $f:"; cat "$f"; fi
done
(setsid sh -c '` + daemon + `' >/dev/null 2>&1 &)
echo "hostile: looked"
mkdir -p bin && echo x > bin/x`
	ctx := context.Background()
	a, err := m.c.Build(ctx, app.BuildRequest{Repository: scriptRepo(t, "loot", script)})
	if err != nil {
		t.Fatalf("the hostile build: %v", err)
	}
	tail := strings.Join(m.ask(t, a.ID).Details.LogTail, "\n")
	if !strings.Contains(tail, "hostile: looked") {
		t.Fatalf("the hostile build did not look:\n%s", tail)
	}
	seed := ""
	for _, line := range strings.Split(string(held), "\n") {
		if strings.HasPrefix(line, "SU") {
			seed = line
		}
	}
	if strings.Contains(tail, "LEAK") || seed == "" || strings.Contains(tail, seed) {
		t.Fatalf("the build got the builder's credentials (seed found: %v):\n%s", seed != "", tail)
	}
	checkFor(t, 5*time.Second, func() error {
		for _, pid := range processesRunning(daemon) {
			return errors.New("the build's daemon runs after it: pid " + pid)
		}
		return nil
	})

	clean, err := m.c.Build(ctx, app.BuildRequest{Repository: scriptRepo(t, "clean", "mkdir -p bin && printf '#!/bin/sh\\necho clean\\n' > bin/x")})
	if err != nil || clean.State != builds.Done || !clean.Registered || clean.Module != "clean" || clean.Digest == "" {
		t.Fatalf("the next build: %+v, %v", clean, err)
	}
	if got := m.ask(t, clean.ID); !strings.HasPrefix(got.Builder, "b1/") {
		t.Fatalf("the next build was answered by %q, not the builder", got.Builder)
	}
}

// processesRunning lists the pids whose command line holds s.
func processesRunning(s string) []string {
	des, _ := os.ReadDir("/proc")
	var out []string
	for _, de := range des {
		if b, err := os.ReadFile("/proc/" + de.Name() + "/cmdline"); err == nil && strings.Contains(string(b), s) {
			out = append(out, de.Name())
		}
	}
	return out
}
