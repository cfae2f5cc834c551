package host

// cgroup v2 for modules, where the host may make cgroups: each module in
// <host's cgroup>/mesh-modules/<module>, its memory.max from MemoryMB, and
// ended by cgroup.kill. Under systemd, the unit's Delegate=yes makes its
// cgroup the host's: the host moves itself into <unit's cgroup>/mesh-host
// so that mesh-modules, beside it, can be given the memory controller. Where it cannot, modules are still ended by process
// group and parent-death signal; only memory_mb goes unenforced, and a
// grandchild outliving a SIGKILLed host waits for the next Sweep.

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// cgroupRoot is where the cgroup v2 hierarchy is mounted.
const cgroupRoot = "/sys/fs/cgroup"

// errNoCgroupV2 is a host without a cgroup v2 hierarchy at cgroupRoot.
var errNoCgroupV2 = errors.New("no cgroup v2 here")

// cgroups is where modules get their cgroups.
type cgroups struct {
	base   string // <host's cgroup>/mesh-modules
	memory bool   // the memory controller is enabled beneath base
}

// hostLeaf is the cgroup the host moves itself into, beside mesh-modules,
// when it is alone in its own cgroup: a unit with Delegate=yes, whose
// cgroup is the host's to arrange. cgroup v2 gives a cgroup's children a
// controller only while no process lives in it ("no internal processes"):
// with the host in its unit's cgroup, memory.max could not be given to
// its modules' cgroups.
const hostLeaf = "mesh-host"

// setupCgroups arranges, beneath the cgroup that holds the host, the
// cgroups of its modules: <that cgroup>/mesh-modules, with controller
// (memory) enabled for the modules' cgroups where the kernel lets it.
// fsRoot is the cgroup v2 mount; selfCgroup is the content of
// /proc/self/cgroup; pid is the host's. Where the host is alone in its
// cgroup it moves itself into <its cgroup>/mesh-host first, and says so;
// a host found there already (re-executed after its upgrade, the same
// pid) arranges the same cgroups beneath its parent.
func setupCgroups(fsRoot string, selfCgroup []byte, pid int, controller string) (*cgroups, []string, error) {
	if _, err := os.Stat(filepath.Join(fsRoot, "cgroup.controllers")); err != nil {
		return nil, nil, errNoCgroupV2
	}
	var own string
	for _, line := range strings.Split(string(selfCgroup), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			own = p
		}
	}
	if !strings.HasPrefix(own, "/") {
		return nil, nil, fmt.Errorf("%w: no unified entry in /proc/self/cgroup", errNoCgroupV2)
	}
	var notes []string
	ownDir := filepath.Join(fsRoot, filepath.Clean(own))
	unit := ownDir
	if filepath.Base(ownDir) == hostLeaf && ownDir != fsRoot {
		unit = filepath.Dir(ownDir)
	} else if procs := cgroupProcs(ownDir); len(procs) == 1 && procs[0] == pid {
		leaf := filepath.Join(ownDir, hostLeaf)
		if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			notes = append(notes, fmt.Sprintf("the host stays in its cgroup: make %s: %v", leaf, err))
		} else if err := writeCgroupFile(leaf, "cgroup.procs", strconv.Itoa(pid)); err != nil {
			notes = append(notes, fmt.Sprintf("the host stays in its cgroup: move into %s: %v", leaf, err))
		} else {
			notes = append(notes, fmt.Sprintf("the host moved itself into %s, beside its modules' cgroups, so that they can be given %s", leaf, controller))
		}
	}
	base := filepath.Join(unit, "mesh-modules")
	if err := os.Mkdir(base, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, notes, fmt.Errorf("make %s: %w", base, err)
	}
	// The host's own cgroup refuses while a process lives in it (cgroup v2
	// has no controllers where processes live): then mesh-modules cannot
	// offer the controller either, and memory_mb goes unenforced.
	writeCgroupFile(unit, "cgroup.subtree_control", "+"+controller)
	return &cgroups{base: base, memory: writeCgroupFile(base, "cgroup.subtree_control", "+"+controller) == nil}, notes, nil
}

// cgroupsHere finds out once whether modules can have cgroups; nil means not.
func (s *Supervisor) cgroupsHere() *cgroups {
	s.cgOnce.Do(func() {
		self, _ := os.ReadFile("/proc/self/cgroup")
		cg, notes, err := setupCgroups(cgroupRoot, self, os.Getpid(), "memory")
		for _, n := range notes {
			s.logf("%s", n)
		}
		if errors.Is(err, errNoCgroupV2) {
			s.logf("no cgroup v2 here: memory_mb not enforced; modules are ended by process group and parent-death signal")
			return
		}
		if err != nil {
			s.logf("no cgroup for modules (%v): memory_mb not enforced; modules are ended by process group and parent-death signal", err)
			return
		}
		if !cg.memory {
			s.logf("cgroup v2 without the memory controller for modules: memory_mb not enforced (under systemd, the host's unit needs Delegate=yes)")
		}
		s.mu.Lock()
		s.cg = cg
		s.mu.Unlock()
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cg
}

// disableCgroups stops placing modules in cgroups.
func (s *Supervisor) disableCgroups() {
	s.mu.Lock()
	s.cg = nil
	s.mu.Unlock()
}

// cgroupFor makes a module's cgroup with its memory limit and opens it for
// cloning into; it returns "", -1 where there is none.
func (s *Supervisor) cgroupFor(spec ModuleSpec) (string, int) {
	cg := s.cgroupsHere()
	if cg == nil {
		return "", -1
	}
	dir := filepath.Join(cg.base, spec.Module)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		s.logf("module %s: no cgroup: %v", spec.Module, err)
		return "", -1
	}
	if cg.memory {
		limit := "max"
		if spec.MemoryMB > 0 {
			limit = strconv.FormatInt(spec.MemoryMB<<20, 10)
		}
		if err := writeCgroupFile(dir, "memory.max", limit); err != nil {
			s.logf("module %s: memory_mb not enforced: %v", spec.Module, err)
		}
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		s.logf("module %s: no cgroup: %v", spec.Module, err)
		return "", -1
	}
	return dir, fd
}

// isModuleCgroup guards Sweep: it writes cgroup.kill only in a module's
// cgroup the host made.
func isModuleCgroup(dir string) bool {
	return filepath.IsAbs(dir) && strings.HasPrefix(dir, cgroupRoot+"/") &&
		filepath.Base(filepath.Dir(filepath.Clean(dir))) == "mesh-modules"
}

// killCgroup ends every process in a cgroup (cgroup.kill, or one by one on
// kernels before 5.14), waits a little for it to empty, and returns how
// many there were.
func killCgroup(dir string) int {
	pids := cgroupProcs(dir)
	if writeCgroupFile(dir, "cgroup.kill", "1") != nil {
		for _, pid := range pids {
			unix.Kill(pid, unix.SIGKILL)
		}
	}
	deadline := time.Now().Add(2 * time.Second)
	for len(cgroupProcs(dir)) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	return len(pids)
}

func cgroupProcs(dir string) []int {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range bytes.Fields(b) {
		if pid, err := strconv.Atoi(string(f)); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

func writeCgroupFile(dir, name, value string) error {
	return os.WriteFile(filepath.Join(dir, name), []byte(value), 0)
}

// cloneIntoCgroupRefused reports whether a start failed because the kernel
// cannot clone into a cgroup (no clone3, or no CLONE_INTO_CGROUP), not
// because of the program.
func cloneIntoCgroupRefused(err error) bool {
	return errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.E2BIG) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP)
}
