// Package restictest makes, for tests, what a restic killed midway
// leaves behind: a stale lock.
package restictest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// StaleLock leaves the repository locked exclusively by a restic of this
// machine that is gone, as one killed midway does: restic key passwd holds
// an exclusive lock while it waits for the new password on its standard
// input, and is killed (and reaped: a zombie's lock is not stale) once the
// lock is listed.
func StaleLock(t testing.TB, repository, password string) {
	t.Helper()
	env := append(os.Environ(), "RESTIC_REPOSITORY="+repository, "RESTIC_PASSWORD="+password)
	cmd := exec.Command("restic", "--no-cache", "key", "passwd")
	cmd.Env = env
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		list := exec.Command("restic", "--no-cache", "--no-lock", "list", "locks")
		list.Env = env
		out, err := list.Output()
		if err == nil && strings.TrimSpace(string(out)) != "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("restic key passwd took no lock within 30s: %v %s", err, out)
		}
	}
}

// Need skips the test when there is no restic on the PATH, and fails it
// instead where the tools must be (MESH_TEST_TOOLS: make test installs
// Debian's restic).
func Need(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("restic"); err != nil {
		if os.Getenv("MESH_TEST_TOOLS") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
}
