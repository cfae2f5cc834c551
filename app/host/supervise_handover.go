package host

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"mesh-controller/app/process"
	"mesh-controller/app/protocol"
)

// A host upgrading itself re-executes its own program in the same process
// (same pid): its modules stay its children. The supervisor of the program
// leaving hands each running module over (Handover): its process, its log
// pipe's read end kept open across the exec, its state and restart
// history; the supervisor of the program arriving adopts each that still
// runs as it was (Adopt) rather than sweeping it, so that no module
// restarts across the host's own upgrade.

// HandedModule is one running module as the host's previous program handed
// it over.
type HandedModule struct {
	Spec     ModuleSpec           `json:"spec"`
	State    protocol.ModuleState `json:"state"`
	Restarts []time.Time          `json:"restarts,omitempty"`
	// Pid, Pgid, StartTicks and BootID say which process it is, as its
	// pid file does: checked before it is adopted, as Sweep checks them.
	Pid        int       `json:"pid"`
	Pgid       int       `json:"pgid"`
	StartTicks uint64    `json:"start_ticks"`
	BootID     string    `json:"boot_id"`
	Cgroup     string    `json:"cgroup,omitempty"`
	PidFile    string    `json:"pid_file"`
	Started    time.Time `json:"started"`
	// LogFD is the read end of its output pipe, left open across the exec.
	LogFD int `json:"log_fd"`
}

// handingOver says Handover is under way.
func (s *Supervisor) handingOver() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.handing
}

// Handover lets go of every module without stopping any, for the host's
// next program to adopt: each that runs is handed over (its log pipe's
// read end no longer closed on exec), the others are left for the next
// program to start. It returns once no module goroutine is left; Apply
// starts nothing after it. Only a host about to re-execute itself calls
// it: one that cannot after all takes them back (Resume).
func (s *Supervisor) Handover() []HandedModule {
	s.endAll(true)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.handed
}

// handOff hands a run over: its output read up to now is in its log, and
// its pipe's read end is kept open across the exec (a duplicate without
// close-on-exec, owned by no *os.File: nothing of this program closes it).
func (s *Supervisor) handOff(m *supervised, r *run) {
	// The copier stops at a deadline, having written what it read.
	if err := r.logR.SetReadDeadline(time.Now()); err != nil {
		s.logf("module %s: its log pipe: %v", m.spec.Module, err)
	}
	select {
	case <-r.copied:
	case <-time.After(time.Second): // a pipe that takes no deadline: its copier is left
	}
	fd, err := unix.Dup(int(r.logR.Fd()))
	if err != nil {
		s.logf("module %s: cannot keep its log pipe across the exec: %v", m.spec.Module, err)
		fd = -1
	}
	r.logR.Close()
	h := HandedModule{Spec: m.spec, Pid: r.pid, Pgid: r.pid, BootID: bootID(), Cgroup: r.cgroup, PidFile: r.pidFile, Started: r.started, LogFD: fd}
	h.StartTicks, _ = process.StartTicks(r.pid)
	s.mu.Lock()
	h.State, h.Restarts = m.st, append([]time.Time(nil), m.restarts...)
	s.handed = append(s.handed, h)
	s.mu.Unlock()
}

// Resume takes back what Handover handed over, in this same program: the
// host could not re-execute itself after all, and goes on. It returns
// Adopt's lines.
func (s *Supervisor) Resume() []string {
	s.mu.Lock()
	s.closed, s.handing = false, false
	for name, m := range s.mods {
		select {
		case <-m.done:
			delete(s.mods, name)
		default:
		}
	}
	handed := s.handed
	s.handed = nil
	s.mu.Unlock()
	return s.Adopt(handed)
}

// Adopt takes on the modules the host's previous program handed over, each
// that is still the process it was (this boot, its pid this process's
// child, of its process group, started when it was) and whose log pipe is
// one: watched, restarted and stopped as if this supervisor had started
// it, its state and restart history going on. Call it before Sweep and the
// first Apply: Sweep leaves an adopted module alone, and an Apply of the
// same fingerprint leaves it running. One not adopted is left to Sweep,
// which ends it if it still runs. It returns a line for each.
func (s *Supervisor) Adopt(handed []HandedModule) []string {
	var lines []string
	boot := bootID()
	seen := map[string]bool{}
	var adopted []*supervised
	for _, h := range handed {
		module := h.Spec.Module
		why := ""
		st, err := process.ReadStat(h.Pid)
		switch {
		case checkName(module) != nil:
			why = "a bad module name"
		case seen[module] || s.known(module):
			why = "handed over twice"
		case h.BootID != boot:
			why = "of another boot"
		case err != nil:
			why = "gone"
		case st.Ppid != os.Getpid() || st.Pgid != h.Pgid || st.Start != h.StartTicks || h.Pgid != h.Pid:
			why = "no longer the process handed over"
		case !isPipe(h.LogFD):
			why = "its log pipe was not handed over"
		}
		seen[module] = true
		if why != "" {
			lines = append(lines, fmt.Sprintf("module %s (pid %d) not adopted: %s; swept", module, h.Pid, why))
			if isPipe(h.LogFD) {
				unix.Close(h.LogFD)
			}
			continue
		}
		// Non-blocking, the file is read through Go's poller: a read
		// deadline can end its copier, as handOff ends it.
		unix.CloseOnExec(h.LogFD)
		unix.SetNonblock(h.LogFD, true)
		r := &run{pid: h.Pid, started: h.Started, cgroup: h.Cgroup, exited: make(chan struct{}),
			logR: os.NewFile(uintptr(h.LogFD), "log pipe of "+module), copied: make(chan struct{}),
			pidFile: filepath.Join(s.pidFileDir(), module+".pid")}
		r.cred, _ = s.credential(h.Spec) // its ready command's, if it is not ready yet
		adopted = append(adopted, &supervised{spec: h.Spec, stopReq: make(chan struct{}), done: make(chan struct{}), adopted: r, st: h.State, restarts: h.Restarts})
		lines = append(lines, fmt.Sprintf("module %s adopted: pid %d, %s, across the host's own upgrade", module, h.Pid, h.State.State))
	}
	s.mu.Lock()
	if s.mods == nil {
		s.mods = map[string]*supervised{}
		s.live = map[*supervised]struct{}{}
	}
	for _, m := range adopted {
		s.mods[m.spec.Module] = m
		s.live[m] = struct{}{}
		go s.drive(m)
	}
	s.mu.Unlock()
	s.changed()
	return lines
}

// isPipe says fd is an open pipe.
func isPipe(fd int) bool {
	var st unix.Stat_t
	return fd > 2 && unix.Fstat(fd, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFIFO
}
