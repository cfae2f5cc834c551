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
// machine that is gone, as one killed midway does: HeldLock's restic is
// killed (and reaped: a zombie's lock is not stale).
func StaleLock(t testing.TB, repository, password string) { HeldLock(t, repository, password)() }

// HeldLock locks the repository exclusively with a live restic until kill
// is called: restic key passwd holds an exclusive lock while it waits for
// the new password on its standard input, and is returned once a lock of
// its own is listed. The repository must hold no lock before.
func HeldLock(t testing.TB, repository, password string) (kill func()) {
	t.Helper()
	env := append(os.Environ(), "RESTIC_REPOSITORY="+repository, "RESTIC_PASSWORD="+password)
	locks := func() string {
		list := exec.Command("restic", "--no-cache", "--no-lock", "list", "locks")
		list.Env = env
		out, err := list.Output()
		if err != nil {
			t.Fatalf("restic list locks: %v", err)
		}
		return strings.TrimSpace(string(out))
	}
	if held := locks(); held != "" {
		t.Fatalf("the repository is locked already: %s", held)
	}
	cmd := exec.Command("restic", "--no-cache", "key", "passwd")
	cmd.Env = env
	var stderr strings.Builder
	cmd.Stderr = &stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	for deadline := time.Now().Add(30 * time.Second); locks() == ""; time.Sleep(50 * time.Millisecond) {
		select {
		case err := <-exited:
			t.Fatalf("restic key passwd ended before it locked: %v: %s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("restic key passwd took no lock within 30s")
		}
	}
	return func() {
		cmd.Process.Kill()
		<-exited
		in.Close()
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
