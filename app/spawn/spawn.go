// Package spawn starts child processes that die with the process that
// started them: every child is forked from one OS thread that never exits,
// because a child's parent-death signal (Pdeathsig) fires when the thread
// that forked it ends, not the process, and Go ends the threads of
// goroutines that exit while locked to them. The host's supervisor and the
// builder start their children here.
package spawn

import (
	"os/exec"
	"runtime"
	"sync"
)

var spawner struct {
	once sync.Once
	reqs chan req
}

type req struct {
	cmd  *exec.Cmd
	done chan error
}

// Start starts cmd (as exec.Cmd.Start does) on the spawner's thread.
func Start(cmd *exec.Cmd) error {
	spawner.once.Do(func() {
		spawner.reqs = make(chan req)
		go func() {
			runtime.LockOSThread() // never unlocked, never returns: see the package's doc
			for r := range spawner.reqs {
				r.done <- r.cmd.Start()
			}
		}()
	})
	done := make(chan error, 1)
	spawner.reqs <- req{cmd: cmd, done: done}
	return <-done
}
