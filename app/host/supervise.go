package host

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"mesh-controller/app/protocol"
)

// ModuleSpec is one module the host is declared to run, worked out by the caller.
type ModuleSpec struct {
	// Module and Version name it and what it runs.
	Module, Version string
	// Archive is the digest of the archive it runs from ("" when none):
	// reported in ModuleState.Archive.
	Archive string
	// Serial is the declaration that (re)started it; reported in ModuleState.Serial.
	Serial int64
	// Fingerprint is a digest of the module's part of the declaration: while
	// it is unchanged, Apply never restarts the module.
	Fingerprint string
	// Dir is absolute: the working directory and HOME; relative command
	// paths resolve against it.
	Dir string
	// Command is run.command: [0] absolute, or relative to Dir if it contains
	// a '/', else looked up on the host's PATH.
	Command []string
	// Env is the child's whole environment; nothing of the host's is added.
	Env []string
	// Ready says when it is ready; nil is protocol.DefaultReadyAfter of
	// running without exiting.
	Ready *protocol.Ready
	// Ports are the declared ports by name, for Ready.Port.
	Ports map[string]int
	// StopGrace is how long SIGTERM has before SIGKILL; 0 is
	// protocol.DefaultStopGrace.
	StopGrace time.Duration
	// MemoryMB, when > 0, is written to the module's cgroup v2 memory.max
	// where the host may make one.
	MemoryMB int64
	// WaitingFor, when not empty, names the secrets it waits for: it is not
	// started.
	WaitingFor []string
}

// ErrUnknownModule is returned for a module the last Apply did not list.
var ErrUnknownModule = errors.New("no such module on this host")

// Supervisor runs the modules declared to a host as child processes: it
// starts, watches, restarts with back-off and stops them, and keeps their
// logs. Its zero value with StateDir and LogDir set is ready to use; all its
// methods are safe from any goroutine.
type Supervisor struct {
	// StateDir holds a pid file per running module in StateDir/modules.
	StateDir string
	// LogDir holds each module's log, LogDir/<module>.log, and its backups.
	LogDir string
	// Users runs each module as its own system user mesh-<module>, made on
	// first start; only meaningful when the host runs as root.
	Users bool
	// LogMaxMB is the size at which a module's log is rotated; 0 is 10.
	LogMaxMB int
	// LogBackups is how many rotated logs are kept; 0 is 3.
	LogBackups int
	// BackoffBase, BackoffCap and ResetAfter shape restarts: the pause
	// starts at BackoffBase, doubles to BackoffCap, and is reset once a run
	// lasted ResetAfter. Zero values are 1s, 60s and 60s.
	BackoffBase, BackoffCap, ResetAfter time.Duration
	// Logf is the host's log; nil discards.
	Logf func(format string, args ...any)
	// OnChange is called, in its own goroutine and never concurrently with
	// itself, after any module's state changed, so the host can beat early.
	OnChange func()

	// followIdle is how long Follow stays silent before send(nil); 0 is 5s.
	// Tests shorten it.
	followIdle time.Duration

	mu     sync.Mutex
	mods   map[string]*supervised   // the modules of the last Apply, and removed ones still stopping
	live   map[*supervised]struct{} // every module goroutine not yet returned, including replaced runs
	logs   map[string]*moduleLog    // one per module name ever run: lumberjack keeps a goroutine per logger
	closed bool                     // StopAll or Handover was called: Apply starts nothing more
	held   map[string]holding       // modules held stopped (Hold), each closed by its release
	notes  map[string]moduleNote    // what the host says of each module's data (Note)
	// restarted counts, by module, the runs started again after one
	// exited, since the supervisor was made (mesh_host_module_restarts_total).
	restarted map[string]uint64
	// handing says Handover is under way: a module asked to stop is left
	// running, and what it runs is put in handed for the next program.
	handing bool
	handed  []HandedModule

	onceMu   sync.Mutex // guards the once-only notes below
	saidOnce map[string]bool

	cgOnce sync.Once
	cg     *cgroups // nil: no cgroup v2 for modules here

	notifyMu  sync.Mutex
	notifying bool
	again     bool
}

// supervised is one run of a declared module: a spec and the goroutine driving it.
// A new Fingerprint makes a new one that starts once the old one is done.
type supervised struct {
	spec     ModuleSpec
	prev     *supervised   // the run this one replaces; started only once prev is done
	stopReq  chan struct{} // closed to ask the module to stop
	stopOnce sync.Once
	done     chan struct{} // closed when its goroutine returned, its processes gone
	release  chan struct{} // non-nil: held (Hold); it starts once this is closed
	heldWhy  string        // while what it is held: its state's detail says

	// adopted is the run a previous program of this host handed over
	// (Adopt): watched first, rather than a run started.
	adopted *run

	// Under Supervisor.mu.
	removed  bool // no longer declared: forgotten once stopped
	st       protocol.ModuleState
	restarts []time.Time // bounded, oldest first
}

func (m *supervised) stop() { m.stopOnce.Do(func() { close(m.stopReq) }) }

// maxRestartTimes bounds the restart times a module keeps for Restarts1h.
const maxRestartTimes = 1024

// Apply makes the declared set of modules the running one: it starts new
// modules, stops and forgets those no longer listed, restarts those whose
// Fingerprint changed and leaves the others alone. It returns at once; the
// work happens in each module's goroutine. After StopAll it does nothing.
func (s *Supervisor) Apply(specs []ModuleSpec) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		s.logf("supervisor: the host is stopping; declaration not applied")
		return
	}
	if s.mods == nil {
		s.mods = map[string]*supervised{}
		s.live = map[*supervised]struct{}{}
	}
	declared := map[string]bool{}
	for _, spec := range specs {
		if declared[spec.Module] {
			continue // the caller's planner refuses duplicates; the first wins
		}
		declared[spec.Module] = true
		old := s.mods[spec.Module]
		if old != nil && !old.removed && old.spec.Fingerprint == spec.Fingerprint {
			continue
		}
		h := s.held[spec.Module]
		m := &supervised{spec: spec, prev: old, stopReq: make(chan struct{}), done: make(chan struct{}), release: h.ch, heldWhy: h.why}
		m.st = protocol.ModuleState{Module: spec.Module, Version: spec.Version, Archive: spec.Archive, State: protocol.StateStarting, Serial: spec.Serial, Since: time.Now()}
		if m.release != nil {
			m.st.State, m.st.Detail = protocol.StateStopped, "stopped while "+h.why
		} else if len(spec.WaitingFor) > 0 {
			m.st.State = protocol.StateWaiting
			m.st.Detail = "for secrets: " + strings.Join(spec.WaitingFor, ", ")
		} else if old != nil {
			m.st.Detail = "waiting for the previous run to stop"
		}
		if old != nil {
			old.stop()
		}
		s.mods[spec.Module] = m
		s.live[m] = struct{}{}
		go s.drive(m)
	}
	for name, m := range s.mods {
		if !declared[name] && !m.removed {
			m.removed = true
			m.st.Detail = "stopping: no longer declared"
			m.stop()
		}
	}
	s.changed()
}

// restoring is while what a restore holds a module; heldDetail its
// state's detail meanwhile.
const (
	restoring  = "its data is restored"
	heldDetail = "stopped while " + restoring
)

// holding is a module held: closed by its release, held while why.
type holding struct {
	ch  chan struct{}
	why string
}

// moduleNote is what the host says of a module's data while it runs a
// version (Note).
type moduleNote struct {
	version, detail string
}

// Note has the host say detail of module while it runs version: its
// state's Detail when nothing else is said there (what became of its data
// on its last upgrade, say). An empty detail says nothing more.
func (s *Supervisor) Note(module, version, detail string) {
	s.mu.Lock()
	if s.notes == nil {
		s.notes = map[string]moduleNote{}
	}
	if detail == "" {
		delete(s.notes, module)
	} else {
		s.notes[module] = moduleNote{version: version, detail: detail}
	}
	s.mu.Unlock()
	s.changed()
}

// ErrHeld means a module is held already.
var ErrHeld = errors.New("the module is stopped for a restore already")

// Hold stops module, as a declaration that no longer lists it would
// (SIGTERM, SIGKILL after its grace), and keeps it from starting again —
// neither restarted nor started by an Apply that changes it — until the
// release it returns is called: its data is restored meanwhile. It returns
// once the module's processes are gone. A module held already is refused
// (ErrHeld); one not running is held all the same.
func (s *Supervisor) Hold(module string) (release func(), err error) {
	return s.HoldWhile(module, restoring)
}

// HoldWhile is Hold, the module's state saying while what it is held ("2.0.0
// prepares its data").
func (s *Supervisor) HoldWhile(module, why string) (release func(), err error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errors.New("the host is stopping")
	}
	if _, ok := s.held[module]; ok {
		s.mu.Unlock()
		return nil, ErrHeld
	}
	if s.held == nil {
		s.held = map[string]holding{}
	}
	ch := make(chan struct{})
	s.held[module] = holding{ch: ch, why: why}
	var stopped <-chan struct{}
	if old := s.mods[module]; old != nil && !old.removed {
		// The run is replaced by one of the same spec that waits: a
		// restart, or an Apply of the same fingerprint, starts nothing.
		m := &supervised{spec: old.spec, prev: old, stopReq: make(chan struct{}), done: make(chan struct{}), release: ch, heldWhy: why}
		m.st = old.st
		m.st.Detail, m.restarts = "stopping while "+why, old.restarts
		old.stop()
		s.mods[module] = m
		s.live[m] = struct{}{}
		go s.drive(m)
		stopped = old.done
	}
	s.mu.Unlock()
	s.changed()
	if stopped != nil {
		<-stopped
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			delete(s.held, module)
			s.mu.Unlock()
			close(ch)
		})
	}, nil
}

// Restarts counts, by module, the runs started again after one exited,
// since the supervisor was made: modules no longer declared too.
func (s *Supervisor) Restarts() map[string]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]uint64, len(s.restarted))
	for module, n := range s.restarted {
		out[module] = n
	}
	return out
}

// States reports every module of the last Apply, sorted by name, and the
// removed ones until they have stopped.
func (s *Supervisor) States() []protocol.ModuleState {
	s.mu.Lock()
	defer s.mu.Unlock()
	hourAgo := time.Now().Add(-time.Hour)
	out := make([]protocol.ModuleState, 0, len(s.mods))
	for _, m := range s.mods {
		st := m.st
		st.LogTail = append([]string(nil), m.st.LogTail...)
		if n, ok := s.notes[st.Module]; ok && st.Detail == "" && n.version == st.Version {
			st.Detail = n.detail
		}
		for _, t := range m.restarts {
			if t.After(hourAgo) {
				st.Restarts1h++
			}
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Module < out[j].Module })
	return out
}

// StopAll stops every module (SIGTERM, SIGKILL after its grace), waits until
// all their processes are gone and their pid files removed, and makes later
// Applies do nothing: the host is stopping.
func (s *Supervisor) StopAll() { s.endAll(false) }

// endAll asks every module goroutine to end, and waits for them all, and
// closes the logs: stopping each module's processes, or, handing over,
// leaving them to run. Apply does nothing after it.
func (s *Supervisor) endAll(handing bool) {
	s.mu.Lock()
	s.closed, s.handing = true, handing
	var all []*supervised
	for m := range s.live {
		all = append(all, m)
	}
	s.mu.Unlock()
	for _, m := range all {
		m.stop()
	}
	for _, m := range all {
		<-m.done
	}
	s.mu.Lock()
	logs := s.logs
	s.mu.Unlock()
	for _, l := range logs {
		l.close()
	}
}

// drive is a module's life: wait for the run it replaces, then start it,
// watch it and restart it with back-off until asked to stop.
func (s *Supervisor) drive(m *supervised) {
	defer s.retire(m)
	if m.prev != nil {
		select {
		case <-m.prev.done:
			s.update(m, func(st *protocol.ModuleState) { st.Detail = "" })
		case <-m.stopReq:
			// Replaced before it started: it is done only once what it
			// replaced is, so that the run after it waits for both (two
			// runs of a module never overlap, nor share a pid file).
			<-m.prev.done
			s.update(m, stoppedState(""))
			return
		}
	}
	if m.release != nil {
		s.update(m, func(st *protocol.ModuleState) {
			st.State, st.Pid, st.Detail, st.LogTail = protocol.StateStopped, 0, "stopped while "+m.heldWhy, nil
		})
		select {
		case <-m.release:
			s.update(m, func(st *protocol.ModuleState) {
				st.State, st.Detail = protocol.StateStarting, ""
				if len(m.spec.WaitingFor) > 0 {
					st.State, st.Detail = protocol.StateWaiting, "for secrets: "+strings.Join(m.spec.WaitingFor, ", ")
				}
			})
		case <-m.stopReq:
			s.update(m, func(st *protocol.ModuleState) { st.Detail = "" })
			return
		}
	}
	if len(m.spec.WaitingFor) > 0 {
		<-m.stopReq
		s.update(m, stoppedState(""))
		return
	}
	chk, err := parseReady(m.spec)
	if err == nil {
		err = checkName(m.spec.Module)
	}
	if err != nil {
		// The declaration must change to mend this, and a new one comes
		// through Apply with a new Fingerprint: no point retrying.
		s.update(m, func(st *protocol.ModuleState) { st.State, st.Detail = protocol.StateFailed, err.Error() })
		s.logf("module %s: %v", m.spec.Module, err)
		<-m.stopReq
		s.update(m, stoppedState(""))
		return
	}
	base, capped := s.backoff()
	pause := base
	for first := true; ; first = false {
		if s.handingOver() {
			return // nothing runs to hand over: the next program starts it
		}
		if !first {
			s.mu.Lock()
			now := time.Now()
			m.restarts = append(m.restarts, now)
			if s.restarted == nil {
				s.restarted = map[string]uint64{}
			}
			s.restarted[m.spec.Module]++
			for len(m.restarts) > maxRestartTimes || (len(m.restarts) > 0 && now.Sub(m.restarts[0]) > time.Hour) {
				m.restarts = m.restarts[1:]
			}
			s.mu.Unlock()
		}
		lg := s.logFor(m.spec.Module)
		var r *run
		var err error
		wasReady := false
		if first && m.adopted != nil {
			// Handed over by the host's previous program: its state goes
			// on as it was, ready or not yet.
			r, m.adopted = m.adopted, nil
			s.mu.Lock()
			wasReady = m.st.State == protocol.StateReady
			s.mu.Unlock()
			s.watchOutput(r, lg)
			lg.note("adopted pid %d across the host's own upgrade", r.pid)
		} else {
			r, err = s.start(m, lg)
		}
		var state, detail, lastExit string
		ran := false
		if err != nil {
			state, detail = protocol.StateFailed, err.Error()
		} else {
			ran = true
			if !wasReady {
				s.update(m, func(st *protocol.ModuleState) {
					st.State, st.Pid, st.Detail, st.LogTail = protocol.StateStarting, r.pid, "", nil
				})
			}
			out := s.watch(m, r, chk, wasReady)
			if out.handed {
				s.handOff(m, r)
				return
			}
			lastExit = out.exit
			if out.stopped {
				s.update(m, stoppedState(lastExit))
				return
			}
			if out.ranFor >= s.resetAfter() {
				pause = base
			}
			state, detail = protocol.StateFailed, "exited before it was ready"
			if out.wasReady {
				state, detail = protocol.StateBackingOff, ""
			}
		}
		if ran && pause >= capped {
			state, detail = protocol.StateCrashLooping, "keeps exiting; restarted every "+pause.String()
		}
		var tail []string
		if state == protocol.StateFailed || state == protocol.StateCrashLooping {
			tail, _ = s.Tail(m.spec.Module, 20)
		}
		s.update(m, func(st *protocol.ModuleState) {
			st.State, st.Pid, st.Detail, st.LogTail = state, 0, detail, tail
			if ran {
				st.LastExit = lastExit
			}
		})
		if ran {
			lg.note("exited: %s; restarting in %s", lastExit, pause)
			s.logf("module %s: exited: %s; restarting in %s", m.spec.Module, lastExit, pause)
		} else {
			lg.note("cannot start: %s; retrying in %s", detail, pause)
			s.logf("module %s: cannot start: %s; retrying in %s", m.spec.Module, detail, pause)
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-m.stopReq:
			t.Stop()
			if !s.handingOver() {
				s.update(m, stoppedState(""))
			}
			return
		}
		pause = min(pause*2, capped)
	}
}

// outcome is how one run of a module ended.
type outcome struct {
	handed   bool          // it runs on, handed over (Handover)
	stopped  bool          // it was stopped on purpose
	wasReady bool          // its ready check had passed
	ranFor   time.Duration // from start to exit
	exit     string        // "exit status 1", "signal: killed"
}

// watch waits for a started run to become ready, to exit, or to be asked to
// stop (or, handing over, to let go of it). Once ready it only waits: no
// polling while a module runs quietly. A run ready already (handed over
// ready) is not checked again.
func (s *Supervisor) watch(m *supervised, r *run, chk readyCheck, ready0 bool) outcome {
	ready := make(chan struct{}, 1)
	checking := make(chan struct{})
	stopCheck := make(chan struct{})
	go func() {
		defer close(checking)
		if !ready0 && chk.wait(stopCheck, m.spec, r.cred, r.pid) {
			ready <- struct{}{}
		}
	}()
	endCheck := func() {
		close(stopCheck)
		<-checking // a ready command still running is ended before the run is
	}
	out := outcome{wasReady: ready0}
	for {
		select {
		case <-ready:
			out.wasReady = true
			s.update(m, func(st *protocol.ModuleState) { st.State = protocol.StateReady })
		case <-r.exited:
			endCheck()
			out.ranFor = time.Since(r.started)
			out.exit = s.reap(r)
			return out
		case <-m.stopReq:
			endCheck()
			if s.handingOver() {
				out.handed = true
				return out
			}
			out.stopped = true
			out.exit = s.stopRun(m, r)
			return out
		}
	}
}

// retire forgets a module whose goroutine is ending: a removed one leaves
// the reported set, a replaced one only the live set.
func (s *Supervisor) retire(m *supervised) {
	s.mu.Lock()
	delete(s.live, m)
	if m.removed && s.mods[m.spec.Module] == m {
		delete(s.mods, m.spec.Module)
	}
	m.prev = nil // let the old run be collected
	s.mu.Unlock()
	close(m.done)
	s.changed()
}

// update changes a module's reported state; Since moves when State does.
func (s *Supervisor) update(m *supervised, f func(st *protocol.ModuleState)) {
	s.mu.Lock()
	was := m.st.State
	f(&m.st)
	if m.st.State != was {
		m.st.Since = time.Now()
	}
	s.mu.Unlock()
	s.changed()
}

// stoppedState marks a module stopped on purpose.
func stoppedState(lastExit string) func(st *protocol.ModuleState) {
	return func(st *protocol.ModuleState) {
		st.State, st.Pid, st.LogTail = protocol.StateStopped, 0, nil
		if strings.HasPrefix(st.Detail, "waiting for the previous") || strings.HasPrefix(st.Detail, "for secrets") {
			st.Detail = ""
		}
		if lastExit != "" {
			st.LastExit = lastExit
		}
	}
}

// changed tells OnChange, without ever blocking the supervisor: calls are
// coalesced into one goroutine that runs while changes keep coming.
func (s *Supervisor) changed() {
	if s.OnChange == nil {
		return
	}
	s.notifyMu.Lock()
	if s.notifying {
		s.again = true
		s.notifyMu.Unlock()
		return
	}
	s.notifying = true
	s.notifyMu.Unlock()
	go func() {
		for {
			s.OnChange()
			s.notifyMu.Lock()
			if !s.again {
				s.notifying = false
				s.notifyMu.Unlock()
				return
			}
			s.again = false
			s.notifyMu.Unlock()
		}
	}()
}

// logf writes to the host's log, if it has one.
func (s *Supervisor) logf(format string, args ...any) {
	if s.Logf != nil {
		s.Logf(format, args...)
	}
}

// logOnce writes a line to the host's log the first time key is seen.
func (s *Supervisor) logOnce(key, format string, args ...any) {
	s.onceMu.Lock()
	if s.saidOnce == nil {
		s.saidOnce = map[string]bool{}
	}
	said := s.saidOnce[key]
	s.saidOnce[key] = true
	s.onceMu.Unlock()
	if !said {
		s.logf(format, args...)
	}
}

// backoff returns the first and the longest pause between restarts.
func (s *Supervisor) backoff() (base, capped time.Duration) {
	base, capped = s.BackoffBase, s.BackoffCap
	if base <= 0 {
		base = time.Second
	}
	if capped <= 0 {
		capped = time.Minute
	}
	return min(base, capped), capped
}

func (s *Supervisor) resetAfter() time.Duration {
	if s.ResetAfter > 0 {
		return s.ResetAfter
	}
	return time.Minute
}

func (s *Supervisor) stopGrace(spec ModuleSpec) time.Duration {
	if spec.StopGrace > 0 {
		return spec.StopGrace
	}
	return protocol.DefaultStopGrace
}

// known reports whether module is one this supervisor reports.
func (s *Supervisor) known(module string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.mods[module]
	return ok
}

// checkName refuses a module name that could not be a file name in the log
// and state dirs. The controller's planner checks names; this guards paths.
func checkName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") || name != filepath.Base(name) {
		return fmt.Errorf("bad module name %q", name)
	}
	return nil
}

// pidFileDir is where pid files live.
func (s *Supervisor) pidFileDir() string { return filepath.Join(s.StateDir, "modules") }

// ensureDir makes dir with perm if it is missing.
func ensureDir(dir string, perm os.FileMode) error {
	if err := os.MkdirAll(dir, perm); err != nil {
		return fmt.Errorf("make %s: %w", dir, err)
	}
	return nil
}
