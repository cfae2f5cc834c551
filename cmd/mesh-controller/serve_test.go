package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// buildBinary builds the real mesh-controller, as a person runs it.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "mesh-controller")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// startServe starts serve and waits for its ready line.
func startServe(t *testing.T, bin, data string, args ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"--data", data, "serve", "--listen", "127.0.0.1:0"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "ready") {
				ready <- sc.Text()
			}
		}
		close(ready)
	}()
	select {
	case line, ok := <-ready:
		if !ok {
			cmd.Wait()
			t.Fatalf("serve ended before ready: %s", stderr.String())
		}
		if !strings.Contains(line, "ready: broker nats://127.0.0.1:") {
			t.Fatalf("ready line: %q", line)
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("serve not ready after 20s: %s", stderr.String())
	}
	return cmd, &stderr
}

// After SIGTERM the daemon stops cleanly and gives the lease back, so a new
// serve starts at once rather than after the lease expires.
func TestServe_SIGTERMGivesTheLeaseBack(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	data := t.TempDir()
	if out, err := exec.Command(bin, "--data", data, "migrate").CombinedOutput(); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	first, firstErr := startServe(t, bin, data)

	second := exec.Command(bin, "--data", data, "serve", "--listen", "127.0.0.1:0")
	out, err := second.CombinedOutput()
	if code := second.ProcessState.ExitCode(); code != 1 || err == nil {
		t.Fatalf("second serve exited %d: %s", code, out)
	}
	if want := fmt.Sprintf("another controller holds the lease: pid %d on ", first.Process.Pid); !strings.Contains(string(out), want) {
		t.Fatalf("second serve did not name the first (%q): %s", want, out)
	}
	// With the embedded broker a second serve cannot stand by: the
	// broker is the first one's, in its process. It is told so, in one line.
	if lines := strings.Split(strings.TrimSpace(string(out)), "\n"); len(lines) != 1 || !strings.Contains(lines[0], "to stand by for it, serve with --broker") {
		t.Fatalf("second serve's refusal is not one line saying how to stand by: %s", out)
	}

	if err := first.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := first.Wait(); err != nil {
		t.Fatalf("after SIGTERM: %v\n%s", err, firstErr.String())
	}
	third, _ := startServe(t, bin, data) // refused for the lease (10 s) if it had not been given back
	third.Process.Signal(syscall.SIGTERM)
	if err := third.Wait(); err != nil {
		t.Fatal(err)
	}
}

// brokerURL reads the broker's URL from broker show --json.
func brokerURL(t *testing.T, showJSON string) string {
	t.Helper()
	var v struct {
		URLs []string `json:"urls"`
	}
	decodeJSON(t, showJSON, &v)
	if len(v.URLs) == 0 {
		t.Fatalf("no broker URL in %s", showJSON)
	}
	return v.URLs[0]
}

// checkFor polls check until it returns nil, failing the test after
// timeout with the last error check returned.
func checkFor(t testing.TB, timeout time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v", timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// decodeJSON decodes a command's --json output, failing the test if it is not.
func decodeJSON(t *testing.T, out string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
}
