package host

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"mesh-controller/app/process"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// run is one started process of a module: the leader of its own process
// group, whose pgid is its pid.
type run struct {
	cmd     *exec.Cmd // nil for a run handed over by the host's previous program
	pid     int
	started time.Time
	cred    *syscall.Credential
	cgroup  string        // its cgroup v2 dir, or ""
	exited  chan struct{} // closed once the leader has exited; it is not reaped yet
	logR    *os.File      // read end of its output pipe
	copied  chan struct{} // closed once its output is all in the log
	pidFile string
}

// childAttr is how every child starts: its own process group, killed if
// the host dies, as cred when set.
func childAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: cred}
}

// resolveCommand finds the program of a command the way ModuleSpec says:
// absolute, relative to dir when it has a '/', else on the host's PATH.
func resolveCommand(dir, name string) (string, error) {
	var p string
	switch {
	case name == "":
		return "", errors.New("no command")
	case filepath.IsAbs(name):
		p = name
	case strings.Contains(name, "/"):
		p = filepath.Join(dir, name)
	default:
		found, err := exec.LookPath(name)
		if err != nil || !filepath.IsAbs(found) {
			return "", fmt.Errorf("not found: %s", name)
		}
		p = found
	}
	fi, err := os.Stat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("not found: %s", name)
	case err != nil:
		return "", fmt.Errorf("cannot start %s: %w", name, err)
	case fi.IsDir() || fi.Mode()&0o111 == 0:
		return "", fmt.Errorf("not executable: %s", name)
	}
	return p, nil
}

// startError says in one line why the kernel refused to run name.
func startError(name string, err error) error {
	switch {
	case errors.Is(err, syscall.ENOENT):
		return fmt.Errorf("not found: %s (or its interpreter, or its directory)", name)
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.ENOEXEC):
		return fmt.Errorf("not executable: %s: %w", name, err)
	}
	return fmt.Errorf("cannot start %s: %w", name, err)
}

// start starts one run of a module, its output piped into its log.
func (s *Supervisor) start(m *supervised, lg *moduleLog) (*run, error) {
	spec := m.spec
	if len(spec.Command) == 0 {
		return nil, errors.New("no command")
	}
	path, err := resolveCommand(spec.Dir, spec.Command[0])
	if err != nil {
		return nil, err
	}
	cred, err := s.credential(spec)
	if err != nil {
		return nil, err
	}
	if err := ensureDir(s.pidFileDir(), 0o700); err != nil {
		return nil, err
	}
	// Our own pipe, not cmd's: a grandchild holding it open cannot hold up
	// Wait, and the copier is ended once the group is gone.
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("make a pipe for its output: %w", err)
	}
	env := spec.Env
	if env == nil {
		env = []string{} // nil would hand the child the host's environment
	}
	cmd := &exec.Cmd{Path: path, Args: spec.Command, Env: env, Dir: spec.Dir, Stdout: pw, Stderr: pw, SysProcAttr: childAttr(cred)}
	cg, cgfd := s.cgroupFor(spec)
	if cgfd >= 0 {
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, cgfd
	}
	err = process.Start(cmd)
	if cgfd >= 0 {
		unix.Close(cgfd)
		if err != nil && cloneIntoCgroupRefused(err) {
			// An older kernel without clone into a cgroup: go on without.
			s.logOnce("cgroup-clone", "supervisor: cannot start a module in its cgroup (%v); starting without", err)
			s.disableCgroups()
			cg = ""
			cmd = &exec.Cmd{Path: path, Args: spec.Command, Env: env, Dir: spec.Dir, Stdout: pw, Stderr: pw, SysProcAttr: childAttr(cred)}
			err = process.Start(cmd)
		}
	}
	pw.Close()
	if err != nil {
		pr.Close()
		return nil, startError(spec.Command[0], err)
	}
	r := &run{cmd: cmd, pid: cmd.Process.Pid, started: time.Now(), cred: cred, cgroup: cg,
		exited: make(chan struct{}), logR: pr, copied: make(chan struct{}),
		pidFile: filepath.Join(s.pidFileDir(), spec.Module+".pid")}
	// Read before anything waits on it: the leader cannot be reaped yet,
	// so its stat is there even if it has exited already.
	ticks, _ := process.StartTicks(r.pid)
	if err := writePidFile(r.pidFile, pidFile{Pid: r.pid, Pgid: r.pid, StartTicks: ticks, BootID: bootID(), Cgroup: cg}); err != nil {
		s.logf("module %s: %v", spec.Module, err)
	}
	lg.note("started pid %d", r.pid)
	s.watchOutput(r, lg)
	return r, nil
}

// watchOutput copies a run's output into its log, and closes r.exited
// once its leader has exited.
func (s *Supervisor) watchOutput(r *run, lg *moduleLog) {
	go func() {
		defer close(r.copied)
		buf := make([]byte, 32<<10)
		for {
			n, err := r.logR.Read(buf)
			if n > 0 {
				lg.Write(buf[:n]) // a full disk loses output, never blocks the module
			}
			if err != nil {
				return // closed, or a deadline: handed over (handOff)
			}
		}
	}()
	go func() {
		process.WaitExit(r.pid)
		close(r.exited)
	}()
}

// reap ends a run whose leader has exited: the rest of its group is killed,
// the leader reaped, its output drained, its pid file removed. It returns
// how the leader ended.
func (s *Supervisor) reap(r *run) string {
	unix.Kill(-r.pid, unix.SIGKILL) // the leader is a zombie: the group id is still ours
	if r.cgroup != "" {
		killCgroup(r.cgroup)
	}
	waitGroupGone(r.pid, 2*time.Second)
	exit := "exited"
	if r.cmd != nil {
		r.cmd.Wait()
		if r.cmd.ProcessState != nil {
			exit = r.cmd.ProcessState.String()
		}
	} else {
		// Handed over: a child of this process all the same, reaped as
		// exec.Cmd would, and said as os.ProcessState says.
		var ws unix.WaitStatus
		for {
			_, err := unix.Wait4(r.pid, &ws, 0, nil)
			if err != unix.EINTR {
				if err == nil {
					exit = waitStatusString(ws)
				}
				break
			}
		}
	}
	select {
	case <-r.copied:
	case <-time.After(time.Second):
		// Something outside its group (it called setsid) holds the pipe:
		// stop reading rather than wait for it.
	}
	r.logR.Close()
	<-r.copied
	os.Remove(r.pidFile)
	return exit
}

// stopRun stops a run on purpose: SIGTERM to its group, SIGKILL to what is
// left of it after the grace.
func (s *Supervisor) stopRun(m *supervised, r *run) string {
	grace := s.stopGrace(m.spec)
	lg := s.logFor(m.spec.Module)
	lg.note("stopping: SIGTERM to its process group, SIGKILL after %s", grace)
	unix.Kill(-r.pid, unix.SIGTERM)
	deadline := time.Now().Add(grace)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-r.exited:
		// The leader is gone; its group may still be finishing within the
		// grace (a shell's children get the same SIGTERM).
		waitGroupGone(r.pid, time.Until(deadline))
	case <-t.C:
		lg.note("still running after %s: SIGKILL", grace)
		unix.Kill(-r.pid, unix.SIGKILL)
		<-r.exited
	}
	exit := s.reap(r)
	if r.cgroup != "" {
		os.Remove(r.cgroup) // empty now; made again if it starts again
	}
	lg.note("stopped: %s", exit)
	return exit
}

// waitGroupGone waits up to d for a process group to have no living member.
// It scans /proc, so it is used only while stopping.
func waitGroupGone(pgid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if len(process.GroupMembers(pgid, 0)) == 0 {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitGone waits up to d for processes to be dead (zombies are dead).
func waitGone(pids []int, d time.Duration) {
	deadline := time.Now().Add(d)
	for _, pid := range pids {
		for {
			st, err := process.ReadStat(pid)
			if err != nil || st.Dead() || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// pidFile is what the host remembers of a running module, so that a host
// that died can end what its modules left.
type pidFile struct {
	Pid        int    `json:"pid"`
	Pgid       int    `json:"pgid"`
	StartTicks uint64 `json:"start_ticks"`
	BootID     string `json:"boot_id,omitempty"`
	Cgroup     string `json:"cgroup,omitempty"`
}

// writePidFile writes a pid file whole (temp then rename), mode 0600.
func writePidFile(name string, p pidFile) error {
	b, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("write pid file: %w", err)
	}
	tmp := name + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("write pid file: %w", err)
	}
	if err := os.Rename(tmp, name); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write pid file: %w", err)
	}
	return nil
}

// bootID names this boot; pid files of another boot describe nothing alive.
func bootID() string {
	b, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return strings.TrimSpace(string(b))
}

// Sweep ends what modules of a previous life of the host left running, from
// the pid files in StateDir/modules, and removes those files. Call it when
// the host starts, before the first Apply. It returns one line per process
// or cgroup it ended.
//
// An unrelated process is never ended. Only members of the recorded process
// group that started no earlier than the recorded leader are; none at all if
// the file is from another boot, or if the leader's pid now belongs to a
// process that started at another time: Linux keeps a group's id while any
// member lives, so a reused id means the module's group is gone.
func (s *Supervisor) Sweep() []string {
	dir := s.pidFileDir()
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	s.mu.Lock()
	running := map[string]bool{}
	for name := range s.mods {
		running[name] = true
	}
	s.mu.Unlock()
	boot := bootID()
	var lines []string
	for _, e := range ents {
		name := e.Name()
		file := filepath.Join(dir, name)
		if strings.HasSuffix(name, ".tmp") {
			os.Remove(file)
			continue
		}
		module, ok := strings.CutSuffix(name, ".pid")
		if !ok || running[module] {
			continue
		}
		var p pidFile
		b, err := os.ReadFile(file)
		if err == nil {
			err = json.Unmarshal(b, &p)
		}
		if err != nil || p.Pgid <= 1 || (p.BootID != "" && p.BootID != boot) {
			os.Remove(file)
			continue
		}
		if leader, err := process.ReadStat(p.Pgid); err != nil || leader.Start == p.StartTicks {
			var ended []int
			for _, pid := range process.GroupMembers(p.Pgid, p.StartTicks) {
				if killIfStill(pid, p.Pgid, p.StartTicks) {
					ended = append(ended, pid)
					lines = append(lines, fmt.Sprintf("ended pid %d of module %s, left by a previous run of the host", pid, module))
				}
			}
			waitGone(ended, 2*time.Second)
			for _, pid := range ended {
				// One handed over by the host's previous program and not
				// adopted is this process's child: reaped, not left a zombie.
				unix.Wait4(pid, nil, unix.WNOHANG, nil)
			}
		}
		if p.Cgroup != "" && isModuleCgroup(p.Cgroup) {
			if n := killCgroup(p.Cgroup); n > 0 {
				lines = append(lines, fmt.Sprintf("ended cgroup %s of module %s (%d processes)", p.Cgroup, module, n))
			}
			os.Remove(p.Cgroup)
		}
		os.Remove(file)
	}
	return lines
}

// killIfStill SIGKILLs pid only if it is still in group pgid and started no
// earlier than minStart: through a pidfd, so a pid reused between the scan
// and the kill is never hit.
func killIfStill(pid, pgid int, minStart uint64) bool {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	// Checked after opening: if pid was reused since, the pidfd names the
	// process that was there at open, and signalling it fails harmlessly.
	st, err := process.ReadStat(pid)
	if err != nil || st.Pgid != pgid || st.Start < minStart {
		return false
	}
	return unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) == nil
}

// waitStatusString says how a process ended as os.ProcessState.String
// does: "exit status 1", "signal: killed".
func waitStatusString(ws unix.WaitStatus) string {
	switch {
	case ws.Exited():
		return "exit status " + strconv.Itoa(ws.ExitStatus())
	case ws.Signaled():
		s := "signal: " + ws.Signal().String()
		if ws.CoreDump() {
			s += " (core dumped)"
		}
		return s
	}
	return "exited"
}
