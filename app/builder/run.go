package builder

import (
	"context"
	"errors"
	"mesh-controller/app/process"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// groupGoneBound is how long the builder waits, after SIGKILL, for every
// process of a build's group to be gone before it says some would not die
// (a process stuck in the kernel cannot be killed sooner).
const groupGoneBound = 10 * time.Second

// ioDelay bounds how long output is read once a group is gone: a process
// that left the group (setsid) and kept the pipe must not hold up the build.
const ioDelay = 2 * time.Second

// ran is how one command run in its own process group ended.
type ran struct {
	state    *os.ProcessState // nil when it did not start
	err      error            // why it did not start
	timedOut bool             // killed at its timeout
	stopped  error            // killed because ctx was done: its cause
	strays   int              // processes of its group still alive past groupGoneBound
}

// runGroup runs cmd as the leader of a new session and so of its own
// process group (no controlling terminal: nothing it starts can prompt),
// and kills the whole group with SIGKILL when the leader exits, at the
// timeout (0: none) or when ctx is done — a build's background processes
// never outlive it. It returns once the group is gone (or past
// groupGoneBound) and the leader is reaped.
//
// A cmd that comes with its own SysProcAttr (a sandbox's) keeps it: it
// sets Setsid and Pdeathsig itself.
func runGroup(ctx context.Context, timeout time.Duration, cmd *exec.Cmd) ran {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	}
	cmd.WaitDelay = ioDelay
	if err := process.Start(cmd); err != nil {
		return ran{err: err}
	}
	pgid := cmd.Process.Pid
	exited := make(chan struct{})
	go func() {
		process.WaitExit(pgid)
		close(exited)
	}()
	var deadline <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		deadline = t.C
	}
	var r ran
	select {
	case <-exited:
	case <-deadline:
		r.timedOut = true
	case <-ctx.Done():
		r.stopped = context.Cause(ctx)
	}
	// The leader is not reaped until its group is gone, so the group's id
	// cannot be taken by another process while we signal it.
	unix.Kill(-pgid, unix.SIGKILL)
	<-exited
	r.strays = waitGroupGone(pgid, groupGoneBound)
	cmd.Wait() // reaps; how it ended is in ProcessState
	r.state = cmd.ProcessState
	return r
}

// waitGroupGone kills the group until no live process is in it, and
// returns how many are still alive when the bound passes (0: all gone).
// Zombies are not counted: they are dead, waiting for their parent (init
// for a build's orphans) to reap them.
func waitGroupGone(pgid int, bound time.Duration) int {
	deadline := time.Now().Add(bound)
	for {
		if err := unix.Kill(-pgid, unix.SIGKILL); errors.Is(err, unix.ESRCH) {
			return 0
		}
		n := len(process.GroupMembers(pgid, 0))
		if n == 0 || time.Now().After(deadline) {
			return n
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lookPath finds a command's program: absolute as given, relative to dir
// when it holds a '/', else in the directories of pathList (relative
// entries skipped: they would resolve against the checkout).
func lookPath(name, dir, pathList string) (string, error) {
	executable := func(p string) bool {
		fi, err := os.Stat(p)
		return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
	}
	switch {
	case name == "":
		return "", errors.New("no program named")
	case filepath.IsAbs(name):
		if executable(name) {
			return name, nil
		}
	case strings.Contains(name, "/"):
		if p := filepath.Join(dir, name); executable(p) {
			return p, nil
		}
	default:
		for _, d := range filepath.SplitList(pathList) {
			if !filepath.IsAbs(d) {
				continue
			}
			if p := filepath.Join(d, name); executable(p) {
				return p, nil
			}
		}
	}
	return "", errors.New(name + " not found or not executable")
}
