package host

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gopkg.in/natefinch/lumberjack.v2"

	"mesh-controller/app/process"
	"mesh-controller/app/protocol"
)

// The tests run real child processes: small sh scripts, or this test binary
// again in a role (TestSupervisorHelperProcess). Every wait is a poll with a
// deadline.

// checkFor polls f every interval until it returns nil, failing with its
// last error after total.
func checkFor(t *testing.T, total, every time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v", total, err)
		}
		time.Sleep(every)
	}
}

// logBuf collects the supervisor's host log lines.
type logBuf struct {
	mu    sync.Mutex
	lines []string
}

func (l *logBuf) logf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}

func (l *logBuf) count(substr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if strings.Contains(line, substr) {
			n++
		}
	}
	return n
}

// newSup makes a supervisor under a temporary dir with short back-off,
// stopped when the test ends.
func newSup(t *testing.T) (*Supervisor, *logBuf) {
	dir := t.TempDir()
	lb := &logBuf{}
	s := &Supervisor{
		StateDir:    filepath.Join(dir, "state"),
		LogDir:      filepath.Join(dir, "log"),
		BackoffBase: 20 * time.Millisecond,
		BackoffCap:  100 * time.Millisecond,
		Logf:        lb.logf,
	}
	t.Cleanup(s.StopAll)
	return s, lb
}

// script writes an executable sh script into dir.
func script(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// testSpec is a module ready after 100ms of running.
func testSpec(name, dir string, command ...string) ModuleSpec {
	return ModuleSpec{
		Module: name, Version: "1.0", Serial: 1, Fingerprint: "a", Dir: dir, Command: command,
		Env:       []string{"PATH=/usr/bin:/bin", "HOME=" + dir},
		Ready:     &protocol.Ready{After: "100ms"},
		StopGrace: 2 * time.Second,
	}
}

func stateOf(s *Supervisor, module string) (protocol.ModuleState, bool) {
	for _, st := range s.States() {
		if st.Module == module {
			return st, true
		}
	}
	return protocol.ModuleState{}, false
}

// waitState waits for a module to be in state want.
func waitState(t *testing.T, s *Supervisor, module, want string) protocol.ModuleState {
	t.Helper()
	var got protocol.ModuleState
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		st, ok := stateOf(s, module)
		if !ok {
			return fmt.Errorf("module %s not reported", module)
		}
		got = st
		if st.State != want {
			return fmt.Errorf("module %s is %s (%s, last exit %q), want %s", module, st.State, st.Detail, st.LastExit, want)
		}
		return nil
	})
	return got
}

// alive reports whether pid is a living process (a zombie is dead).
func alive(pid int) bool {
	st, err := process.ReadStat(pid)
	return err == nil && !st.Dead()
}

func waitDead(t *testing.T, pids ...int) {
	t.Helper()
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		for _, pid := range pids {
			if alive(pid) {
				return fmt.Errorf("pid %d still alive", pid)
			}
		}
		return nil
	})
}

// readPid waits for a script to have written a pid into file.
func readPid(t *testing.T, file string) int {
	t.Helper()
	var pid int
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		b, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err
	})
	return pid
}

// history records the distinct states a module passes through, through
// OnChange; set it before Apply.
type history struct {
	mu   sync.Mutex
	seen []string
}

func watchStates(s *Supervisor, module string) *history {
	h := &history{}
	s.OnChange = func() {
		st, ok := stateOf(s, module)
		if !ok {
			return
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		if len(h.seen) == 0 || h.seen[len(h.seen)-1] != st.State {
			h.seen = append(h.seen, st.State)
		}
	}
	return h
}

func (h *history) states() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.seen)
}

// TestSupervisorHelperProcess is not a test: the other tests run this test
// binary again in a role named by MESH_SUPERVISE_HELPER.
func TestSupervisorHelperProcess(t *testing.T) {
	switch os.Getenv("MESH_SUPERVISE_HELPER") {
	case "":
		return
	case "listen":
		// A module that listens on its port once a flag file appears.
		for {
			if _, err := os.Stat(os.Getenv("MESH_LISTEN_FLAG")); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+os.Getenv("MESH_LISTEN_PORT"))
		if err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		defer l.Close()
		fmt.Println("listening")
		for {
			time.Sleep(time.Hour)
		}
	case "cgroup":
		// A host alone in its cgroup (a unit with Delegate=yes): arranges
		// the modules' cgroups twice (the second as after re-executing
		// itself), and says where each time and where it lives then.
		fs := os.Getenv("MESH_CGROUP_FS")
		for range 2 {
			self, _ := os.ReadFile("/proc/self/cgroup")
			cg, notes, err := setupCgroups(fs, self, os.Getpid(), "memory")
			if err != nil {
				fmt.Println("error:", err)
				os.Exit(1)
			}
			fmt.Printf("base %s\n", strings.TrimPrefix(cg.base, fs))
			for _, n := range notes {
				fmt.Printf("note %s\n", n)
			}
		}
		self, _ := os.ReadFile("/proc/self/cgroup")
		for _, line := range strings.Split(string(self), "\n") {
			if p, ok := strings.CutPrefix(line, "0::"); ok {
				fmt.Printf("in %s\n", p)
			}
		}
		os.Exit(0)
	case "supervise":
		// A host: supervises one module, says its pid, and waits to be killed.
		dir := os.Getenv("MESH_SUPERVISE_DIR")
		s := &Supervisor{StateDir: filepath.Join(dir, "state"), LogDir: filepath.Join(dir, "log")}
		spec := testSpec("victim", dir, filepath.Join(dir, "mod.sh"))
		s.Apply([]ModuleSpec{spec})
		for {
			if st, ok := stateOf(s, "victim"); ok && st.State == protocol.StateReady {
				fmt.Printf("pid %d\n", st.Pid)
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		for {
			time.Sleep(time.Hour)
		}
	}
}

func TestSupervisor_Ready(t *testing.T) {
	t.Run("default", func(t *testing.T) {
		t.Parallel()
		s, _ := newSup(t)
		dir := t.TempDir()
		spec := testSpec("m", dir, script(t, dir, "run.sh", "exec sleep 1000\n"))
		spec.Ready = nil
		t0 := time.Now()
		s.Apply([]ModuleSpec{spec})
		st := waitState(t, s, "m", protocol.StateReady)
		if d := st.Since.Sub(t0); d < protocol.DefaultReadyAfter {
			t.Fatalf("ready after %s, want at least %s", d, protocol.DefaultReadyAfter)
		}
		if st.Pid == 0 || !alive(st.Pid) || st.Serial != 1 || st.Version != "1.0" {
			t.Fatalf("ready state %+v", st)
		}
	})
	t.Run("after", func(t *testing.T) {
		t.Parallel()
		s, _ := newSup(t)
		dir := t.TempDir()
		spec := testSpec("m", dir, script(t, dir, "run.sh", "exec sleep 1000\n"))
		spec.Ready = &protocol.Ready{After: "300ms"}
		t0 := time.Now()
		s.Apply([]ModuleSpec{spec})
		st := waitState(t, s, "m", protocol.StateReady)
		if d := st.Since.Sub(t0); d < 300*time.Millisecond {
			t.Fatalf("ready after %s, want at least 300ms", d)
		}
	})
	t.Run("port", func(t *testing.T) {
		t.Parallel()
		s, _ := newSup(t)
		dir := t.TempDir()
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		exe, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		flag := filepath.Join(dir, "listen-now")
		spec := testSpec("web", dir, exe, "-test.run=^TestSupervisorHelperProcess$")
		spec.Env = []string{"MESH_SUPERVISE_HELPER=listen", "MESH_LISTEN_PORT=" + strconv.Itoa(port), "MESH_LISTEN_FLAG=" + flag}
		spec.Ports = map[string]int{"http": port}
		spec.Ready = &protocol.Ready{Port: "http"}
		s.Apply([]ModuleSpec{spec})
		checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
			if st, _ := stateOf(s, "web"); st.State != protocol.StateStarting || st.Pid == 0 {
				return fmt.Errorf("state %+v, want starting with a pid", st)
			}
			return nil
		})
		if err := os.WriteFile(flag, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		waitState(t, s, "web", protocol.StateReady)
		c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Fatalf("ready, but its port does not answer: %v", err)
		}
		c.Close()
	})
	t.Run("command", func(t *testing.T) {
		t.Parallel()
		s, _ := newSup(t)
		dir := t.TempDir()
		spec := testSpec("m", dir, script(t, dir, "run.sh", "exec sleep 1000\n"))
		// A bare name from the host's PATH; a path relative to the module's dir.
		spec.Ready = &protocol.Ready{Command: []string{"test", "-e", "ready.flag"}}
		s.Apply([]ModuleSpec{spec})
		checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
			if st, _ := stateOf(s, "m"); st.State != protocol.StateStarting || st.Pid == 0 {
				return fmt.Errorf("state %+v, want starting with a pid", st)
			}
			return nil
		})
		if err := os.WriteFile(filepath.Join(dir, "ready.flag"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		waitState(t, s, "m", protocol.StateReady)
	})
	t.Run("bad after", func(t *testing.T) {
		t.Parallel()
		s, _ := newSup(t)
		dir := t.TempDir()
		spec := testSpec("m", dir, script(t, dir, "run.sh", "touch ran\nexec sleep 1000\n"))
		spec.Ready = &protocol.Ready{After: "soon"}
		s.Apply([]ModuleSpec{spec})
		st := waitState(t, s, "m", protocol.StateFailed)
		if !strings.Contains(st.Detail, `"soon"`) || st.Pid != 0 {
			t.Fatalf("state %+v, want failed saying \"soon\"", st)
		}
		if _, err := os.Stat(filepath.Join(dir, "ran")); err == nil {
			t.Fatal("a module with a bad ready check was started")
		}
	})
	t.Run("undeclared port", func(t *testing.T) {
		t.Parallel()
		s, _ := newSup(t)
		dir := t.TempDir()
		spec := testSpec("m", dir, script(t, dir, "run.sh", "exec sleep 1000\n"))
		spec.Ready = &protocol.Ready{Port: "web"}
		s.Apply([]ModuleSpec{spec})
		if st := waitState(t, s, "m", protocol.StateFailed); !strings.Contains(st.Detail, `"web"`) {
			t.Fatalf("detail %q", st.Detail)
		}
	})
}

func TestSupervisor_CannotStart(t *testing.T) {
	t.Run("not found, then installed", func(t *testing.T) {
		t.Parallel()
		s, _ := newSup(t)
		dir := t.TempDir()
		s.Apply([]ModuleSpec{testSpec("m", dir, "bin/tool")})
		st := waitState(t, s, "m", protocol.StateFailed)
		if st.Detail != "not found: bin/tool" {
			t.Fatalf("detail %q", st.Detail)
		}
		// Retried with back-off, and never crash-looping: it never ran.
		checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
			st, _ := stateOf(s, "m")
			if st.State != protocol.StateFailed || st.Restarts1h < 6 {
				return fmt.Errorf("state %s after %d restarts, want failed after 6", st.State, st.Restarts1h)
			}
			return nil
		})
		script(t, dir, "bin/tool", "exec sleep 1000\n")
		waitState(t, s, "m", protocol.StateReady)
	})
	t.Run("not on PATH", func(t *testing.T) {
		t.Parallel()
		s, _ := newSup(t)
		s.Apply([]ModuleSpec{testSpec("m", t.TempDir(), "no-such-tool-mesh")})
		if st := waitState(t, s, "m", protocol.StateFailed); st.Detail != "not found: no-such-tool-mesh" {
			t.Fatalf("detail %q", st.Detail)
		}
	})
	t.Run("not executable", func(t *testing.T) {
		t.Parallel()
		s, _ := newSup(t)
		dir := t.TempDir()
		p := script(t, dir, "tool", "exec sleep 1000\n")
		if err := os.Chmod(p, 0o644); err != nil {
			t.Fatal(err)
		}
		s.Apply([]ModuleSpec{testSpec("m", dir, "./tool")})
		if st := waitState(t, s, "m", protocol.StateFailed); st.Detail != "not executable: ./tool" {
			t.Fatalf("detail %q", st.Detail)
		}
	})
}

// startTimes reads the nanosecond stamps a script appended to a file.
func startTimes(t *testing.T, file string) []time.Time {
	b, _ := os.ReadFile(file)
	var out []time.Time
	for _, f := range strings.Fields(string(b)) {
		ns, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			t.Fatalf("stamp %q: %v", f, err)
		}
		out = append(out, time.Unix(0, ns))
	}
	return out
}

func TestSupervisor_CrashLoop(t *testing.T) {
	t.Parallel()
	s, _ := newSup(t)
	s.BackoffBase, s.BackoffCap = 50*time.Millisecond, 400*time.Millisecond
	h := watchStates(s, "m")
	dir := t.TempDir()
	starts := filepath.Join(dir, "starts")
	s.Apply([]ModuleSpec{testSpec("m", dir, script(t, dir, "run.sh", "date +%s%N >> starts\necho boom\nexit 1\n"))})
	var at []time.Time
	checkFor(t, 15*time.Second, 10*time.Millisecond, func() error {
		at = startTimes(t, starts)
		if len(at) < 6 {
			return fmt.Errorf("%d starts, want 6", len(at))
		}
		return nil
	})
	// Pauses of 50, 100, 200, 400, 400ms: each gap at least its pause, the
	// first well below the cap, the last not doubled past it.
	for i, want := range []time.Duration{50, 100, 200, 400, 400} {
		gap := at[i+1].Sub(at[i])
		if gap < want*time.Millisecond {
			t.Errorf("gap %d is %s, want at least %dms", i, gap, want)
		}
	}
	if gap := at[1].Sub(at[0]); gap >= 400*time.Millisecond {
		t.Errorf("first gap %s is not shorter than the cap", gap)
	}
	if gap := at[5].Sub(at[4]); gap >= 800*time.Millisecond {
		t.Errorf("gap at the cap %s, want below twice the cap", gap)
	}
	st := waitState(t, s, "m", protocol.StateCrashLooping)
	if st.LastExit != "exit status 1" || st.Restarts1h < 5 || !slices.Contains(unstamped(t, st.LogTail), "boom") || len(st.LogTail) > 20 {
		t.Fatalf("crash-looping state %+v", st)
	}
	seen := h.states()
	iFailed, iLooping := slices.Index(seen, protocol.StateFailed), slices.Index(seen, protocol.StateCrashLooping)
	if iFailed < 0 || iLooping < iFailed {
		t.Fatalf("states seen %v, want failed then crash-looping", seen)
	}
}

func TestSupervisor_BackoffResets(t *testing.T) {
	t.Parallel()
	s, _ := newSup(t)
	s.BackoffBase, s.BackoffCap, s.ResetAfter = 50*time.Millisecond, 400*time.Millisecond, 300*time.Millisecond
	h := watchStates(s, "m")
	dir := t.TempDir()
	// Runs 1-4 exit at once, run 5 runs 600ms (ready, and long enough to
	// reset the back-off), later runs exit at once again.
	body := `echo start $(date +%s%N) >> runs
n=$(grep -c start runs)
if [ "$n" = 5 ]; then sleep 0.6; fi
echo end $(date +%s%N) >> runs
exit 1
`
	s.Apply([]ModuleSpec{testSpec("m", dir, script(t, dir, "run.sh", body))})
	type span struct{ start, end time.Time }
	var runs []span
	checkFor(t, 15*time.Second, 10*time.Millisecond, func() error {
		runs = runs[:0]
		b, _ := os.ReadFile(filepath.Join(dir, "runs"))
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			kind, stamp, _ := strings.Cut(line, " ")
			ns, _ := strconv.ParseInt(stamp, 10, 64)
			if kind == "start" {
				runs = append(runs, span{start: time.Unix(0, ns)})
			} else if len(runs) > 0 {
				runs[len(runs)-1].end = time.Unix(0, ns)
			}
		}
		if len(runs) < 6 {
			return fmt.Errorf("%d runs, want 6", len(runs))
		}
		return nil
	})
	if pause := runs[4].start.Sub(runs[3].end); pause < 400*time.Millisecond {
		t.Errorf("pause before the long run %s, want the cap 400ms", pause)
	}
	if pause := runs[5].start.Sub(runs[4].end); pause >= 300*time.Millisecond {
		t.Errorf("pause after a run longer than ResetAfter %s, want the base 50ms", pause)
	}
	if seen := h.states(); !slices.Contains(seen, protocol.StateReady) || !slices.Contains(seen, protocol.StateBackingOff) ||
		slices.Index(seen, protocol.StateBackingOff) < slices.Index(seen, protocol.StateReady) {
		t.Fatalf("states seen %v, want ready then backing-off", seen)
	}
}

func TestSupervisor_StopGrace(t *testing.T) {
	t.Parallel()
	s, _ := newSup(t)
	dir := t.TempDir()
	// The mark says the trap is set: ready comes at start, before the
	// shell has read its first line.
	trapped := filepath.Join(dir, "trapped")
	stubborn := testSpec("stubborn", dir, script(t, dir, "stubborn.sh", "trap '' TERM\ntouch "+trapped+"\nexec sleep 1000\n"))
	stubborn.StopGrace = time.Second
	polite := testSpec("polite", dir, script(t, dir, "polite.sh", "exec sleep 1000\n"))
	polite.StopGrace = 5 * time.Second
	s.Apply([]ModuleSpec{stubborn, polite})
	pidS := waitState(t, s, "stubborn", protocol.StateReady).Pid
	pidP := waitState(t, s, "polite", protocol.StateReady).Pid
	checkFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		_, err := os.Stat(trapped)
		return err
	})

	t0 := time.Now()
	stopped := make(chan struct{})
	go func() { s.StopAll(); close(stopped) }()
	var deadS, deadP time.Duration
	checkFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if deadS == 0 && !alive(pidS) {
			deadS = time.Since(t0)
		}
		if deadP == 0 && !alive(pidP) {
			deadP = time.Since(t0)
		}
		if deadS == 0 || deadP == 0 {
			return errors.New("still alive")
		}
		return nil
	})
	<-stopped
	if deadS < time.Second {
		t.Errorf("a module ignoring SIGTERM was killed after %s, before its grace of 1s", deadS)
	}
	if deadP >= time.Second {
		t.Errorf("a module ending on SIGTERM took %s", deadP)
	}
	if st, _ := stateOf(s, "stubborn"); st.State != protocol.StateStopped || st.LastExit != "signal: killed" {
		t.Errorf("stubborn: %+v", st)
	}
	if st, _ := stateOf(s, "polite"); st.State != protocol.StateStopped || st.LastExit != "signal: terminated" {
		t.Errorf("polite: %+v", st)
	}
}

func TestSupervisor_ForkedChildEnded(t *testing.T) {
	t.Parallel()
	s, _ := newSup(t)
	s.BackoffBase, s.BackoffCap = 5*time.Second, 10*time.Second // one run is enough
	dir := t.TempDir()
	s.Apply([]ModuleSpec{testSpec("m", dir, script(t, dir, "run.sh", "sleep 1000 &\necho $! > child\nexit 3\n"))})
	child := readPid(t, filepath.Join(dir, "child"))
	st := waitState(t, s, "m", protocol.StateFailed)
	if st.LastExit != "exit status 3" {
		t.Fatalf("last exit %q", st.LastExit)
	}
	waitDead(t, child)
}

func TestSupervisor_ApplyFingerprint(t *testing.T) {
	t.Parallel()
	s, _ := newSup(t)
	dir := t.TempDir()
	spec := testSpec("m", dir, script(t, dir, "run.sh", "sleep 1000 &\nwait\n"))
	s.Apply([]ModuleSpec{spec})
	first := waitState(t, s, "m", protocol.StateReady)

	same := spec
	same.Serial = 2 // a later declaration that leaves this module alone
	s.Apply([]ModuleSpec{same})
	if st, _ := stateOf(s, "m"); st.Pid != first.Pid || st.State != protocol.StateReady || st.Serial != 1 || !st.Since.Equal(first.Since) {
		t.Fatalf("after an unchanged Apply %+v, before %+v", st, first)
	}

	changed := spec
	changed.Serial, changed.Fingerprint = 3, "b"
	s.Apply([]ModuleSpec{changed})
	second := waitState(t, s, "m", protocol.StateReady)
	if second.Pid == first.Pid || second.Serial != 3 {
		t.Fatalf("after a changed Apply %+v, before %+v", second, first)
	}
	if left := process.GroupMembers(first.Pid, 0); len(left) > 0 {
		t.Fatalf("processes %v of the old run remain", left)
	}
}

func TestSupervisor_ApplyRemoves(t *testing.T) {
	t.Parallel()
	s, _ := newSup(t)
	dir := t.TempDir()
	s.Apply([]ModuleSpec{testSpec("m", dir, script(t, dir, "run.sh", "sleep 1000 &\necho $! > child\nwait\n"))})
	st := waitState(t, s, "m", protocol.StateReady)
	child := readPid(t, filepath.Join(dir, "child"))

	pf := filepath.Join(s.StateDir, "modules", "m.pid")
	fi, err := os.Stat(pf)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("pid file: %v, %v", fi, err)
	}
	var p pidFile
	b, _ := os.ReadFile(pf)
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatal(err)
	}
	ticks, _ := process.StartTicks(st.Pid)
	if p.Pid != st.Pid || p.Pgid != st.Pid || p.StartTicks != ticks || p.StartTicks == 0 {
		t.Fatalf("pid file %+v, process %d started at %d", p, st.Pid, ticks)
	}

	s.Apply(nil)
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if sts := s.States(); len(sts) > 0 {
			return fmt.Errorf("still reported: %+v", sts)
		}
		return nil
	})
	if left := process.GroupMembers(st.Pid, 0); len(left) > 0 || alive(child) {
		t.Fatalf("processes %v of its group remain", left)
	}
	if _, err := os.Stat(pf); !os.IsNotExist(err) {
		t.Fatalf("pid file left: %v", err)
	}
	// Its log stays readable: its last lines say how it ended.
	if _, err := s.Tail("m", 1); err != nil {
		t.Fatalf("tail of a removed module: %v", err)
	}
}

func TestSupervisor_StopAll(t *testing.T) {
	t.Parallel()
	s, _ := newSup(t)
	dir := t.TempDir()
	var specs []ModuleSpec
	for _, name := range []string{"a", "b"} {
		specs = append(specs, testSpec(name, dir, script(t, dir, name+".sh", "sleep 1000 &\nsleep 1001 &\nwait\n")))
	}
	s.Apply(specs)
	pa := waitState(t, s, "a", protocol.StateReady).Pid
	pb := waitState(t, s, "b", protocol.StateReady).Pid
	if len(process.GroupMembers(pa, 0)) != 3 {
		t.Fatalf("group of a: %v, want 3 processes", process.GroupMembers(pa, 0))
	}
	s.StopAll()
	for _, pid := range []int{pa, pb} {
		if left := process.GroupMembers(pid, 0); len(left) > 0 {
			t.Fatalf("processes %v remain after StopAll", left)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(s.StateDir, "modules")); len(ents) > 0 {
		t.Fatalf("pid files left: %v", ents)
	}
	for _, st := range s.States() {
		if st.State != protocol.StateStopped || st.Pid != 0 {
			t.Fatalf("after StopAll: %+v", st)
		}
	}
	s.Apply([]ModuleSpec{testSpec("c", dir, specs[0].Command[0])})
	if _, ok := stateOf(s, "c"); ok {
		t.Fatal("Apply after StopAll started a module")
	}
}

func TestSupervisor_Waiting(t *testing.T) {
	t.Parallel()
	s, _ := newSup(t)
	dir := t.TempDir()
	spec := testSpec("m", dir, script(t, dir, "run.sh", "touch ran\nexec sleep 1000\n"))
	spec.WaitingFor = []string{"db-password", "api-key"}
	s.Apply([]ModuleSpec{spec})
	st, _ := stateOf(s, "m")
	if st.State != protocol.StateWaiting || st.Detail != "for secrets: db-password, api-key" || st.Pid != 0 {
		t.Fatalf("state %+v", st)
	}
	// Applying it again changes nothing; nothing is ever started.
	s.Apply([]ModuleSpec{spec})
	if _, err := os.Stat(filepath.Join(dir, "ran")); err == nil {
		t.Fatal("a waiting module was started")
	}
	spec.WaitingFor, spec.Fingerprint = nil, "b"
	s.Apply([]ModuleSpec{spec})
	waitState(t, s, "m", protocol.StateReady)
	if _, err := os.Stat(filepath.Join(dir, "ran")); err != nil {
		t.Fatal("started once its secrets came, but did not run")
	}
}

func TestSupervisor_Env(t *testing.T) {
	t.Parallel()
	s, _ := newSup(t)
	dir := t.TempDir()
	spec := testSpec("m", dir, script(t, dir, "run.sh", "env > env.out\npwd > pwd.out\ntouch written\nexec sleep 1000\n"))
	spec.Env = append(spec.Env, "MESH_MODULE=m")
	s.Apply([]ModuleSpec{spec})
	waitState(t, s, "m", protocol.StateReady)
	// Ready says the process runs, not that the script got this far.
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		_, err := os.Stat(filepath.Join(dir, "written"))
		return err
	})
	b, _ := os.ReadFile(filepath.Join(dir, "env.out"))
	got := map[string]bool{}
	for _, kv := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		k, _, _ := strings.Cut(kv, "=")
		got[k] = true
	}
	for _, kv := range spec.Env {
		if !strings.Contains(string(b), kv+"\n") {
			t.Errorf("child env lacks %s", kv)
		}
	}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "PATH", "HOME", "PWD", "SHLVL", "_", "OLDPWD":
			continue // given, or the shell's own
		}
		if got[k] {
			t.Errorf("the host's %s reached the child", k)
		}
	}
	if pwd, _ := os.ReadFile(filepath.Join(dir, "pwd.out")); strings.TrimSpace(string(pwd)) != dir {
		t.Errorf("child ran in %q, want %q", pwd, dir)
	}
}

func TestSupervisor_LogBounded(t *testing.T) {
	t.Parallel()
	s, _ := newSup(t)
	s.LogMaxMB, s.LogBackups = 1, 2
	dir := t.TempDir()
	line := strings.Repeat("x", 99) // 100 bytes with its newline
	s.Apply([]ModuleSpec{testSpec("m", dir, script(t, dir, "run.sh", "yes "+line+" | head -n 80000\necho DONE\nexec sleep 1000\n"))})
	checkFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		if last, _ := s.Tail("m", 1); !slices.Equal(unstamped(t, last), []string{"DONE"}) {
			return fmt.Errorf("last line %q", last)
		}
		return nil
	})
	// lumberjack removes old backups in its own goroutine.
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		ents, err := os.ReadDir(s.LogDir)
		if err != nil {
			return err
		}
		var total int64
		for _, e := range ents {
			fi, err := e.Info()
			if err != nil {
				return err
			}
			if fi.Mode().Perm()&0o037 != 0 {
				return fmt.Errorf("%s has mode %v", e.Name(), fi.Mode())
			}
			total += fi.Size()
		}
		if len(ents) > 3 || total > 3<<20 {
			return fmt.Errorf("%d files, %d bytes, want at most 3 files and 3 MiB", len(ents), total)
		}
		return nil
	})
}

func TestSupervisor_Tail(t *testing.T) {
	t.Run("from a running module", func(t *testing.T) {
		t.Parallel()
		s, _ := newSup(t)
		dir := t.TempDir()
		s.Apply([]ModuleSpec{testSpec("m", dir, script(t, dir, "run.sh", "seq 1 5000\nexec sleep 1000\n"))})
		var want []string
		for i := 4991; i <= 5000; i++ {
			want = append(want, strconv.Itoa(i))
		}
		checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
			got, err := s.Tail("m", 10)
			if err != nil || !slices.Equal(unstamped(t, got), want) {
				return fmt.Errorf("tail %q, %v", got, err)
			}
			return nil
		})
	})
	t.Run("into the newest backup", func(t *testing.T) {
		t.Parallel()
		s, _ := newSup(t)
		spec := testSpec("m", t.TempDir(), "never-run")
		spec.WaitingFor = []string{"x"}
		s.Apply([]ModuleSpec{spec})
		write := func(name, content string) {
			if err := os.MkdirAll(s.LogDir, 0o750); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(s.LogDir, name), []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		write("m-2019-01-01T00-00-00.000.log", "ancient\n")
		write("m-2020-01-01T00-00-00.000.log", "old1\nold2\nold3\n")
		write("m-web.log", "another module's\n")
		write("m.log", "new1\nnew2")
		for n, want := range map[int][]string{
			1: {"new2"},
			2: {"new1", "new2"},
			4: {"old2", "old3", "new1", "new2"},
			9: {"old1", "old2", "old3", "new1", "new2"},
		} {
			if got, err := s.Tail("m", n); err != nil || !slices.Equal(got, want) {
				t.Errorf("Tail(%d) = %q, %v; want %q", n, got, err, want)
			}
		}
		if _, err := s.Tail("nope", 5); !errors.Is(err, ErrUnknownModule) {
			t.Errorf("tail of an unknown module: %v", err)
		}
	})
	t.Run("long file", func(t *testing.T) {
		t.Parallel()
		f := filepath.Join(t.TempDir(), "big.log")
		var b strings.Builder
		for i := range 20000 {
			fmt.Fprintf(&b, "line %d\n", i)
		}
		os.WriteFile(f, []byte(b.String()), 0o600)
		tailFile := func(name string, n int) ([]string, error) {
			f, end, err := openAtEnd(name)
			if err != nil {
				return nil, err
			}
			defer f.Close()
			return tailFile(f, end, n)
		}
		got, err := tailFile(f, 3)
		if err != nil || !slices.Equal(got, []string{"line 19997", "line 19998", "line 19999"}) {
			t.Fatalf("tail %q, %v", got, err)
		}
		if got, _ := tailFile(f, 20000); len(got) != 20000 || got[0] != "line 0" {
			t.Fatalf("whole file: %d lines from %q", len(got), got[0])
		}
	})
}

func TestSupervisor_Follow(t *testing.T) {
	t.Parallel()
	s, _ := newSup(t)
	s.LogMaxMB = 1
	s.followIdle = 100 * time.Millisecond
	dir := t.TempDir()
	line := strings.Repeat("y", 99)
	// 1.5 MB once told to: the log rotates while followed.
	body := "echo first\nwhile [ ! -e go ]; do sleep 0.02; done\nyes " + line + " | head -n 15000\necho MARKER\nexec sleep 1000\n"
	s.Apply([]ModuleSpec{testSpec("m", dir, script(t, dir, "run.sh", body))})
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if got, _ := s.Tail("m", 1); !slices.Equal(unstamped(t, got), []string{"first"}) {
			return fmt.Errorf("tail %q", got)
		}
		return nil
	})

	var mu sync.Mutex
	var got []string
	idle := 0
	failing := false
	errGone := errors.New("follower gone")
	done := make(chan error, 1)
	go func() {
		done <- s.Follow(context.Background(), "m", 0, func(lines []string) error {
			mu.Lock()
			defer mu.Unlock()
			if failing {
				return errGone
			}
			if lines == nil {
				idle++
			}
			got = append(got, unstamped(t, lines)...)
			return nil
		})
	}()
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		mu.Lock()
		defer mu.Unlock()
		if idle < 2 {
			return fmt.Errorf("%d idle sends, want 2", idle)
		}
		return nil
	})
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		mu.Lock()
		defer mu.Unlock()
		if !slices.Contains(got, "MARKER") {
			return fmt.Errorf("%d lines, no MARKER yet", len(got))
		}
		return nil
	})
	mu.Lock()
	n := 0
	for _, l := range got {
		switch l {
		case line:
			n++
		case "first":
			t.Errorf("Follow sent a line written before it began")
		}
	}
	failing = true
	mu.Unlock()
	if n != 15000 {
		t.Errorf("followed %d of 15000 lines across the rotation", n)
	}
	if b := newestBackup(s.LogDir, "m"); b == "" {
		t.Errorf("the log did not rotate")
	}
	select {
	case err := <-done:
		if err != errGone {
			t.Fatalf("Follow returned %v, want the send error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Follow did not return after send failed")
	}

	ctx, cancel := context.WithCancel(context.Background())
	done2 := make(chan error, 1)
	go func() { done2 <- s.Follow(ctx, "m", 0, func([]string) error { return nil }) }()
	cancel()
	select {
	case err := <-done2:
		if err != nil {
			t.Fatalf("Follow returned %v when its context ended", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Follow did not return when its context ended")
	}
	if err := s.Follow(ctx, "nope", 0, nil); !errors.Is(err, ErrUnknownModule) {
		t.Fatalf("follow of an unknown module: %v", err)
	}
}

// The last lines and the new ones meet at one offset: a line written
// while the last ones are being sent is followed, not lost, and not sent
// twice.
func TestSupervisor_FollowFromTheTail(t *testing.T) {
	t.Parallel()
	s, _ := newSup(t)
	dir := t.TempDir()
	s.Apply([]ModuleSpec{testSpec("m", dir, script(t, dir, "run.sh", "echo first\nwhile [ ! -e go ]; do sleep 0.02; done\necho second\nexec sleep 1000\n"))})
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if got, _ := s.Tail("m", 1); !slices.Equal(unstamped(t, got), []string{"first"}) {
			return fmt.Errorf("tail %q", got)
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var got []string
	done := make(chan error, 1)
	go func() {
		done <- s.Follow(ctx, "m", 1, func(lines []string) error {
			if got == nil {
				// While the last line is sent, the module writes another.
				if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o600); err != nil {
					return err
				}
				checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
					if last, _ := s.Tail("m", 1); !slices.Equal(unstamped(t, last), []string{"second"}) {
						return fmt.Errorf("tail %q", last)
					}
					return nil
				})
				got = []string{}
			}
			got = append(got, unstamped(t, lines)...)
			if slices.Contains(got, "second") {
				cancel()
			}
			return nil
		})
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("the line written while the last ones were sent was not followed: %q", got)
	}
	if !slices.Equal(got, []string{"first", "second"}) {
		t.Fatalf("followed %q, want first then second, each once", got)
	}
}

func TestSweep_HostKilled(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	script(t, dir, "mod.sh", "sleep 1000 &\necho $! > grandchild\nwait\n")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	host := exec.Command(exe, "-test.run=^TestSupervisorHelperProcess$")
	host.Env = append(os.Environ(), "MESH_SUPERVISE_HELPER=supervise", "MESH_SUPERVISE_DIR="+dir)
	out, err := host.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Process.Kill(); host.Wait() })
	pids := make(chan int, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if p, ok := strings.CutPrefix(sc.Text(), "pid "); ok {
				n, _ := strconv.Atoi(p)
				pids <- n
			}
		}
	}()
	var leader int
	select {
	case leader = <-pids:
	case <-time.After(15 * time.Second):
		t.Fatal("the host never said its module was ready")
	}
	grandchild := readPid(t, filepath.Join(dir, "grandchild"))
	pf := filepath.Join(dir, "state", "modules", "victim.pid")
	if _, err := os.Stat(pf); err != nil {
		t.Fatal(err)
	}

	host.Process.Kill() // SIGKILL: the host gets no chance to stop anything
	host.Wait()
	waitDead(t, leader) // its parent-death signal
	if !alive(grandchild) {
		t.Log("the grandchild died with the host (a cgroup?); Sweep has nothing left to end")
	}

	s := &Supervisor{StateDir: filepath.Join(dir, "state"), LogDir: filepath.Join(dir, "log")}
	lines := s.Sweep()
	waitDead(t, grandchild)
	if len(lines) == 0 || !strings.Contains(strings.Join(lines, "\n"), "pid "+strconv.Itoa(grandchild)+" ") {
		t.Fatalf("sweep said %q, want the grandchild %d", lines, grandchild)
	}
	if _, err := os.Stat(pf); !os.IsNotExist(err) {
		t.Fatalf("pid file left: %v", err)
	}
}

func TestSweep_SparesUnrelated(t *testing.T) {
	t.Parallel()
	stateDir := t.TempDir()
	s := &Supervisor{StateDir: stateDir, LogDir: t.TempDir()}
	if err := os.MkdirAll(s.pidFileDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	// An unrelated process group that happens to have a recorded pgid.
	other := exec.Command("sleep", "1000")
	other.SysProcAttr = childAttr(nil)
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Process.Kill(); other.Wait() })
	pid := other.Process.Pid
	ticks, err := process.StartTicks(pid)
	if err != nil {
		t.Fatal(err)
	}
	// A group whose leader is gone and whose member started before the
	// recorded leader: not the recorded group.
	orphaner := exec.Command("sh", "-c", "sleep 1000 >/dev/null 2>&1 & echo $!")
	orphaner.SysProcAttr = childAttr(nil)
	outb, err := orphaner.Output()
	if err != nil {
		t.Fatal(err)
	}
	orphan, _ := strconv.Atoi(strings.TrimSpace(string(outb)))
	t.Cleanup(func() { syscall.Kill(orphan, syscall.SIGKILL) })
	orphanTicks, err := process.StartTicks(orphan)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, p pidFile) {
		if err := writePidFile(filepath.Join(s.pidFileDir(), name), p); err != nil {
			t.Fatal(err)
		}
	}
	write("reused.pid", pidFile{Pid: pid, Pgid: pid, StartTicks: ticks + 100, BootID: bootID()}) // its leader started at another time
	write("older.pid", pidFile{Pid: pid, Pgid: pid, StartTicks: ticks - 1, BootID: bootID()})    // a leader older than this process
	write("reboot.pid", pidFile{Pid: pid, Pgid: pid, StartTicks: ticks, BootID: "another-boot"})
	write("orphan.pid", pidFile{Pid: orphaner.Process.Pid, Pgid: orphaner.Process.Pid, StartTicks: orphanTicks + 1, BootID: bootID()})
	if lines := s.Sweep(); len(lines) > 0 {
		t.Fatalf("sweep ended %q", lines)
	}
	if !alive(pid) || !alive(orphan) {
		t.Fatal("sweep killed an unrelated process")
	}
	if ents, _ := os.ReadDir(s.pidFileDir()); len(ents) > 0 {
		t.Fatalf("pid files left: %v", ents)
	}
}

func TestSupervisor_NoCgroupV2(t *testing.T) {
	t.Parallel()
	fake := t.TempDir()
	if _, _, err := setupCgroups(fake, []byte("0::/a/b\n"), 1, "memory"); !errors.Is(err, errNoCgroupV2) {
		t.Fatalf("without cgroup.controllers: %v", err)
	}
	os.WriteFile(filepath.Join(fake, "cgroup.controllers"), []byte("cpu memory pids\n"), 0o644)
	os.MkdirAll(filepath.Join(fake, "a", "b"), 0o755)
	if _, _, err := setupCgroups(fake, []byte("4:memory:/x\n"), 1, "memory"); !errors.Is(err, errNoCgroupV2) {
		t.Fatalf("without a unified entry: %v", err)
	}
	cg, _, err := setupCgroups(fake, []byte("1:name=systemd:/\n0::/a/b\n"), 1, "memory")
	if err != nil {
		t.Fatal(err)
	}
	if base, want := cg.base, filepath.Join(fake, "a", "b", "mesh-modules"); base != want {
		t.Fatalf("base %q; want %q", base, want)
	}
	if fi, err := os.Stat(cg.base); err != nil || !fi.IsDir() {
		t.Fatalf("base not made: %v", err)
	}
	if !isModuleCgroup("/sys/fs/cgroup/x/mesh-modules/m") || isModuleCgroup("/sys/fs/cgroup/x") || isModuleCgroup("/etc/mesh-modules/m") {
		t.Fatal("isModuleCgroup accepts a cgroup not made for a module")
	}

	if _, err := os.Stat(filepath.Join(cgroupRoot, "cgroup.controllers")); err == nil {
		t.Skip("this host has cgroup v2: the fallback is not exercised here")
	}
	s, lb := newSup(t)
	dir := t.TempDir()
	var specs []ModuleSpec
	for _, name := range []string{"a", "b"} {
		sp := testSpec(name, dir, script(t, dir, name+".sh", "exec sleep 1000\n"))
		sp.MemoryMB = 64
		specs = append(specs, sp)
	}
	s.Apply(specs)
	waitState(t, s, "a", protocol.StateReady)
	waitState(t, s, "b", protocol.StateReady)
	if n := lb.count("no cgroup v2 here: memory_mb not enforced; modules are ended by process group and parent-death signal"); n != 1 {
		t.Fatalf("said %d times that there is no cgroup v2, want once", n)
	}
	b, _ := os.ReadFile(filepath.Join(s.StateDir, "modules", "a.pid"))
	if strings.Contains(string(b), "cgroup") {
		t.Fatalf("pid file names a cgroup: %s", b)
	}
}

func TestSupervisor_Users(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make users")
	}
	if _, err := exec.LookPath("useradd"); err != nil {
		t.Skip("no useradd")
	}
	t.Parallel()
	module := fmt.Sprintf("ut%d", time.Now().UnixNano()%1_000_000)
	name := "mesh-" + module
	if _, err := user.Lookup(name); err == nil {
		t.Fatalf("user %s exists already", name)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("userdel", name).CombinedOutput(); err != nil {
			t.Errorf("userdel %s: %v: %s", name, err, out)
		}
	})
	s, _ := newSup(t)
	s.Users = true
	dir := t.TempDir()
	if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil { // t.TempDir's parent is 0700
		t.Fatal(err)
	}
	// What it may write is given to it when its host writes its files
	// (TestRunning_AsItsOwnUser); here, that it runs as its own user.
	spec := testSpec(module, dir, script(t, dir, "run.sh", "id -u\nexec sleep 1000\n"))
	s.Apply([]ModuleSpec{spec})
	waitState(t, s, module, protocol.StateReady)

	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	if u.HomeDir != dir {
		t.Errorf("home %q, want %q", u.HomeDir, dir)
	}
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		lines, _ := s.Tail(module, 10)
		if !slices.Contains(unstamped(t, lines), u.Uid) {
			return fmt.Errorf("log %q does not show uid %s", lines, u.Uid)
		}
		return nil
	})
	if fi, err := os.Stat(filepath.Join(s.LogDir, module+".log")); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Errorf("the log is not the host's: %v", err)
	}
	s.StopAll() // before userdel, which refuses a user with processes
}

func TestSupervisor_Concurrent(t *testing.T) {
	t.Parallel()
	s, _ := newSup(t)
	dir := t.TempDir()
	run := script(t, dir, "run.sh", "echo $$ >> pids\nsleep 1000 &\nwait\n")
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 15 {
				var specs []ModuleSpec
				for _, name := range []string{"a", "b", "c"} {
					sp := testSpec(name, dir, run)
					sp.Fingerprint = strconv.Itoa((g + i) % 3)
					if (g+i)%4 != 0 || name != "c" {
						specs = append(specs, sp)
					}
				}
				s.Apply(specs)
				s.States()
			}
		})
	}
	wg.Wait()
	final := []ModuleSpec{testSpec("a", dir, run), testSpec("b", dir, run)}
	s.Apply(final)
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		sts := s.States()
		if len(sts) != 2 || sts[0].State != protocol.StateReady || sts[1].State != protocol.StateReady {
			return fmt.Errorf("states %+v, want a and b ready", sts)
		}
		return nil
	})
	s.StopAll()
	b, _ := os.ReadFile(filepath.Join(dir, "pids"))
	pids := strings.Fields(string(b))
	if len(pids) == 0 {
		t.Fatal("no run ever started")
	}
	for _, p := range pids {
		pid, _ := strconv.Atoi(p)
		if left := process.GroupMembers(pid, 0); len(left) > 0 {
			t.Fatalf("processes %v of run %d remain after StopAll", left, pid)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(s.StateDir, "modules")); len(ents) > 0 {
		t.Fatalf("pid files left: %v", ents)
	}
}

// Three applies in quick succession, the first run ignoring SIGTERM: the
// third starts only once the first has ended, so two runs never overlap.
func TestSupervisor_QuickReappliesNeverOverlap(t *testing.T) {
	t.Parallel()
	s, _ := newSup(t)
	dir := t.TempDir()
	run := script(t, dir, "run.sh", "trap '' TERM\necho $$ >> pids\nwhile :; do sleep 0.05; done\n")
	spec := func(fp string) ModuleSpec {
		sp := testSpec("m", dir, run)
		sp.Fingerprint = fp
		sp.StopGrace = 700 * time.Millisecond
		return sp
	}
	s.Apply([]ModuleSpec{spec("a")})
	waitState(t, s, "m", protocol.StateReady)
	first := s.States()[0].Pid
	s.Apply([]ModuleSpec{spec("b")})
	s.Apply([]ModuleSpec{spec("c")})
	checkFor(t, 15*time.Second, 5*time.Millisecond, func() error {
		st := s.States()[0]
		if st.Pid != 0 && st.Pid != first && alive(first) {
			t.Fatalf("run c (pid %d) started while run a (pid %d) still ran", st.Pid, first)
		}
		if st.State != protocol.StateReady || st.Pid == first {
			return fmt.Errorf("state %s pid %d", st.State, st.Pid)
		}
		return nil
	})
	s.StopAll()
}

// A port another program listens on does not make a module ready: only a
// listener of the module's own process group counts.
func TestSupervisor_ReadyPortMustBeItsOwn(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	s, _ := newSup(t)
	dir := t.TempDir()
	spec := testSpec("m", dir, script(t, dir, "run.sh", "exec sleep 1000\n"))
	spec.Ready = &protocol.Ready{Port: "http"}
	spec.Ports = map[string]int{"http": ln.Addr().(*net.TCPAddr).Port}
	s.Apply([]ModuleSpec{spec})
	// Fifteen checks of the port (every 100 ms) find someone else there.
	deadline := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(deadline) {
		if st, _ := stateOf(s, "m"); st.State == protocol.StateReady {
			t.Fatal("ready on a port another program listens on")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st, _ := stateOf(s, "m"); st.State != protocol.StateStarting || st.Pid == 0 {
		t.Fatalf("state %+v, want starting", st)
	}
	s.StopAll()
}

// A held module is stopped (its processes gone when Hold returns), is not
// started again by a crash's restart nor by an Apply that changes it, and
// starts again once released; a second hold is refused; one not running
// is held all the same and starts only when released.
func TestSupervisor_Hold(t *testing.T) {
	t.Parallel()
	s, _ := newSup(t)
	dir := t.TempDir()
	spec := testSpec("m", dir, script(t, dir, "run.sh", "echo run >> runs\nsleep 1000 &\nwait\n"))
	s.Apply([]ModuleSpec{spec})
	first := waitState(t, s, "m", protocol.StateReady)

	release, err := s.Hold("m")
	if err != nil {
		t.Fatal(err)
	}
	if left := process.GroupMembers(first.Pid, 0); len(left) > 0 {
		t.Fatalf("held, processes %v still run", left)
	}
	if _, err := s.Hold("m"); !errors.Is(err, ErrHeld) {
		t.Fatalf("a second hold: %v", err)
	}
	st := waitState(t, s, "m", protocol.StateStopped)
	if st.Detail != heldDetail || st.Pid != 0 {
		t.Fatalf("held: %+v", st)
	}
	changed := spec
	changed.Serial, changed.Fingerprint = 2, "b"
	s.Apply([]ModuleSpec{changed})
	time.Sleep(300 * time.Millisecond) // a start would be ready by now (100ms)
	if st, _ := stateOf(s, "m"); st.State != protocol.StateStopped || st.Detail != heldDetail {
		t.Fatalf("an Apply while held: %+v", st)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "runs")); string(b) != "run\n" {
		t.Fatalf("runs while held: %q", b)
	}
	release()
	release() // once is enough; twice is harmless
	if again := waitState(t, s, "m", protocol.StateReady); again.Serial != 2 || again.Pid == first.Pid {
		t.Fatalf("released: %+v", again)
	}

	// Not running yet: held, an Apply starts nothing until released.
	release, err = s.Hold("n")
	if err != nil {
		t.Fatal(err)
	}
	n := testSpec("n", dir, script(t, dir, "n.sh", "echo n >> nruns\nsleep 1000\n"))
	s.Apply([]ModuleSpec{changed, n})
	if st := waitState(t, s, "n", protocol.StateStopped); st.Detail != heldDetail {
		t.Fatalf("n held: %+v", st)
	}
	release()
	waitState(t, s, "n", protocol.StateReady)
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if b, _ := os.ReadFile(filepath.Join(dir, "nruns")); string(b) != "n\n" {
			return fmt.Errorf("n ran %q", b)
		}
		return nil
	})
}

// unstamped is a module log's lines without the time each begins with;
// a line that begins with none fails the test.
func unstamped(t testing.TB, lines []string) []string {
	t.Helper()
	out := make([]string, 0, len(lines))
	for i, l := range lines {
		stamp, text, ok := strings.Cut(l, " ")
		if _, err := time.Parse(StampLayout, stamp); !ok || err != nil || len(stamp) != len("2006-01-02T15:04:05.000Z") {
			if i == len(lines)-1 && len(l) < len(StampLayout)+1 {
				// The last line read while its write was under way (a
				// reader may see part of a write): what a retry sees whole.
				out = append(out, l)
				continue
			}
			t.Errorf("a module log line without its time: %q", l)
			out = append(out, l)
			continue
		}
		out = append(out, text)
	}
	return out
}

// Each line of a module's log begins with the time the host read it, in
// UTC to the millisecond: a line written in pieces once, at its first
// piece; the supervisor's notes too, a module's line cut by one going on
// stamped anew after it.
func TestModuleLog_StampsEachLine(t *testing.T) {
	dir := t.TempDir()
	clock := time.Date(2026, 3, 4, 5, 6, 7, 891_000_000, time.FixedZone("CET", 3600))
	l := &moduleLog{lj: &lumberjack.Logger{Filename: filepath.Join(dir, "m.log")}, now: func() time.Time { return clock }}
	defer l.close()
	tick := func() { clock = clock.Add(1500 * time.Millisecond) }
	for _, write := range []func(){
		func() { l.Write([]byte("one\ntwo\nthr")) },
		tick,
		func() { l.Write([]byte("ee\nfour")) },
		tick,
		func() { l.note("exited: %s", "exit status 1") },
		tick,
		func() { l.Write([]byte(" and more\n")) },
	} {
		write()
	}
	b, err := os.ReadFile(filepath.Join(dir, "m.log"))
	if err != nil {
		t.Fatal(err)
	}
	want := "2026-03-04T04:06:07.891Z one\n" +
		"2026-03-04T04:06:07.891Z two\n" +
		"2026-03-04T04:06:07.891Z three\n" +
		"2026-03-04T04:06:09.391Z four\n" +
		"2026-03-04T04:06:10.891Z mesh-host: exited: exit status 1\n" +
		"2026-03-04T04:06:12.391Z  and more\n"
	if string(b) != want {
		t.Fatalf("the log:\n%s\nwant:\n%s", b, want)
	}
}
