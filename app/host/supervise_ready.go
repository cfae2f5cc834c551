package host

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"mesh-controller/app/process"
	"mesh-controller/app/protocol"
)

// How ready checks poll while a module starts; none runs once it is ready.
const (
	readyPortEvery    = 100 * time.Millisecond
	readyCommandEvery = 500 * time.Millisecond
	readyCommandLimit = 10 * time.Second // one try of a ready command
)

// readyCheck is a module's ready check, checked once per declaration.
type readyCheck struct {
	after   time.Duration // when neither port nor command
	port    int
	command []string
}

// parseReady works out a module's ready check; an error is a declaration
// that cannot be checked.
func parseReady(spec ModuleSpec) (readyCheck, error) {
	r := spec.Ready
	switch {
	case r == nil || (r.After == "" && r.Port == "" && len(r.Command) == 0):
		return readyCheck{after: protocol.DefaultReadyAfter}, nil
	case r.Port != "":
		p, ok := spec.Ports[r.Port]
		if !ok || p <= 0 || p > 65535 {
			return readyCheck{}, fmt.Errorf("ready.port: no declared port %q", r.Port)
		}
		return readyCheck{port: p}, nil
	case len(r.Command) > 0:
		return readyCheck{command: r.Command}, nil
	}
	d, err := time.ParseDuration(r.After)
	if err != nil || d < 0 {
		return readyCheck{}, fmt.Errorf("ready.after: not a duration: %q", r.After)
	}
	return readyCheck{after: d}, nil
}

// wait returns true once the check passes, false once stop is closed. A
// port counts only when a process of the module's group (pgid) listens on
// it: another program on the same port (an earlier run, another host's
// module) must not make this one ready.
func (c readyCheck) wait(stop <-chan struct{}, spec ModuleSpec, cred *syscall.Credential, pgid int) bool {
	switch {
	case c.port > 0:
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port))
		return poll(stop, readyPortEvery, func() bool {
			conn, err := net.DialTimeout("tcp", addr, readyPortEvery)
			if err != nil {
				return false
			}
			conn.Close()
			return listensIn(c.port, pgid)
		})
	case len(c.command) > 0:
		return poll(stop, readyCommandEvery, func() bool { return tryReadyCommand(stop, spec, c.command, cred) })
	}
	t := time.NewTimer(c.after)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-stop:
		return false
	}
}

// poll calls try at once and then every interval until it returns true or
// stop is closed.
func poll(stop <-chan struct{}, every time.Duration, try func() bool) bool {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if try() {
			return true
		}
		select {
		case <-stop:
			return false
		case <-t.C:
		}
	}
}

// tryReadyCommand runs a ready command once, as the module would run (its
// dir, env and user, no shell), bounded by readyCommandLimit and by stop;
// it passes when the command exits 0.
func tryReadyCommand(stop <-chan struct{}, spec ModuleSpec, command []string, cred *syscall.Credential) bool {
	path, err := resolveCommand(spec.Dir, command[0])
	if err != nil {
		return false // it may be installed later
	}
	env := spec.Env
	if env == nil {
		env = []string{}
	}
	cmd := &exec.Cmd{Path: path, Args: command, Env: env, Dir: spec.Dir, SysProcAttr: childAttr(cred)}
	if process.Start(cmd) != nil {
		return false
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t := time.NewTimer(readyCommandLimit)
	defer t.Stop()
	select {
	case err := <-done:
		return err == nil
	case <-t.C:
	case <-stop:
	}
	unix.Kill(-cmd.Process.Pid, unix.SIGKILL) // its own group, whatever it started too
	<-done
	return false
}

// listensIn says whether a process of the group pgid holds a socket
// listening on TCP port (IPv4 or IPv6), as /proc tells.
func listensIn(port, pgid int) bool {
	inodes := map[string]bool{}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "0A" { // 0A: LISTEN
				continue
			}
			_, hexPort, ok := strings.Cut(f[1], ":")
			if p, err := strconv.ParseInt(hexPort, 16, 32); ok && err == nil && int(p) == port {
				inodes["socket:["+f[9]+"]"] = true
			}
		}
	}
	if len(inodes) == 0 {
		return false
	}
	for _, pid := range process.GroupMembers(pgid, 0) {
		fds := "/proc/" + strconv.Itoa(pid) + "/fd"
		entries, err := os.ReadDir(fds)
		if err != nil {
			continue
		}
		for _, e := range entries {
			if target, err := os.Readlink(fds + "/" + e.Name()); err == nil && inodes[target] {
				return true
			}
		}
	}
	return false
}
