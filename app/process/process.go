// Package process is what the host's supervisor and the builder know of
// their children: how they are started so that they die with their parent
// (every child is forked from one OS thread that never exits, because a
// child's parent-death signal fires when the thread that forked it ends,
// not the process, and Go ends the threads of goroutines that exit while
// locked to them), how their exit is waited for without reaping them, and
// what /proc says of them and of their process groups.
package process

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

var spawner struct {
	once sync.Once
	reqs chan req
}

type req struct {
	do   func() error
	done chan error
}

// ServeMainThread runs program in a goroutine of its own, and makes the
// calling goroutine the spawner until program returns, with what program
// returned. The caller must be the main goroutine locked to the process's
// main thread (runtime.LockOSThread in an init function of the main
// package): every child is then forked from the main thread, the one
// thread an Exec from it keeps, so that a program that re-executes itself
// more than once keeps every child, whichever of its programs started it
// (a child forked by another thread gets its parent-death signal when
// that thread ends with the exec). Call it before anything is started;
// without it, the spawner is a thread of its own that never exits, and
// one Exec keeps the children.
func ServeMainThread(program func() int) int {
	spawner.once.Do(func() { spawner.reqs = make(chan req) })
	done := make(chan int, 1)
	go func() { done <- program() }()
	for {
		select {
		case r := <-spawner.reqs:
			r.done <- r.do()
		case code := <-done:
			return code
		}
	}
}

// onSpawner runs do on the spawner's thread.
func onSpawner(do func() error) error {
	spawner.once.Do(func() {
		spawner.reqs = make(chan req)
		go func() {
			runtime.LockOSThread() // never unlocked, never returns: see the package's doc
			for r := range spawner.reqs {
				r.done <- r.do()
			}
		}()
	})
	done := make(chan error, 1)
	spawner.reqs <- req{do: do, done: done}
	return <-done
}

// Start starts cmd (as exec.Cmd.Start does) on the spawner's thread.
func Start(cmd *exec.Cmd) error { return onSpawner(cmd.Start) }

// Exec replaces this process's program with argv0's (syscall.Exec), from
// the spawner's thread: the process keeps its pid, and its children, forked
// from that thread, keep their parent. Exec from any other thread would
// end the spawner's thread as the kernel makes the exec'ing thread the
// only one, and every child's parent-death signal would fire; a program
// that execs more than once serves the spawner on its main thread
// (ServeMainThread). It returns only if the exec failed.
func Exec(argv0 string, argv, env []string) error {
	return onSpawner(func() error { return syscall.Exec(argv0, argv, env) })
}

// WaitExit returns once pid, a child of this process, has exited, without
// reaping it: the leader stays a zombie, so its pid (its group's id) cannot
// be reused before the rest of its group is killed. It waits on a pidfd in
// Go's poller, so a quiet child holds no thread; a kernel before 5.10 falls
// back to a blocking waitid.
func WaitExit(pid int) {
	if fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK); err == nil {
		f := os.NewFile(uintptr(fd), "pidfd")
		defer f.Close()
		if rc, err := f.SyscallConn(); err == nil {
			var exited bool
			err := rc.Read(func(fd uintptr) bool {
				var info unix.Siginfo
				err := unix.Waitid(unix.P_PIDFD, int(fd), &info, unix.WEXITED|unix.WNOWAIT|unix.WNOHANG, nil)
				for err == unix.EINTR {
					err = unix.Waitid(unix.P_PIDFD, int(fd), &info, unix.WEXITED|unix.WNOWAIT|unix.WNOHANG, nil)
				}
				exited = err != nil || info.Signo != 0 // an error: nothing left to wait for
				return exited
			})
			if err == nil && exited {
				return
			}
		}
	}
	var info unix.Siginfo
	for unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil) == unix.EINTR {
	}
}

// Stat is what /proc/<pid>/stat says of a process.
type Stat struct {
	State byte
	Ppid  int
	Pgid  int
	// Start is field 22: clock ticks after boot.
	Start uint64
}

// Dead says the process is a zombie or gone.
func (s Stat) Dead() bool { return s.State == 'Z' || s.State == 'X' }

// ReadStat reads /proc/<pid>/stat; comm may hold spaces and parentheses,
// so fields are counted after its last ')'.
func ReadStat(pid int) (Stat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Stat{}, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 > len(b) {
		return Stat{}, fmt.Errorf("read /proc/%d/stat: malformed", pid)
	}
	f := strings.Fields(string(b[i+2:])) // f[0] is field 3
	if len(f) < 20 {
		return Stat{}, fmt.Errorf("read /proc/%d/stat: malformed", pid)
	}
	ppid, err0 := strconv.Atoi(f[1])
	pgid, err1 := strconv.Atoi(f[2])
	start, err2 := strconv.ParseUint(f[19], 10, 64)
	if err0 != nil || err1 != nil || err2 != nil || len(f[0]) != 1 {
		return Stat{}, fmt.Errorf("read /proc/%d/stat: malformed", pid)
	}
	return Stat{State: f[0][0], Ppid: ppid, Pgid: pgid, Start: start}, nil
}

// StartTicks is when pid started, in clock ticks after boot.
func StartTicks(pid int) (uint64, error) {
	st, err := ReadStat(pid)
	return st.Start, err
}

// GroupMembers lists the living processes of a process group that started
// at or after minStart (0: any); zombies are dead and not listed.
func GroupMembers(pgid int, minStart uint64) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := ReadStat(pid)
		if err != nil || st.Pgid != pgid || st.Start < minStart || st.Dead() {
			continue
		}
		out = append(out, pid)
	}
	return out
}
