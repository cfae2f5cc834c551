package host

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCgroups_Delegated: a host alone in its cgroup (its unit's, with
// Delegate=yes) moves itself into <unit>/mesh-host, so that the memory
// controller can be enabled for mesh-modules beside it; found in that
// leaf again (re-executed after its upgrade), it arranges the same
// cgroups; a host sharing its cgroup with other processes moves nothing.
// The files are a stand-in tree: the kernel's part is
// TestCgroups_DelegatedKernel.
func TestCgroups_Delegated(t *testing.T) {
	t.Parallel()
	fs := t.TempDir()
	os.WriteFile(filepath.Join(fs, "cgroup.controllers"), []byte("cpu memory pids\n"), 0o644)
	unit := filepath.Join(fs, "system.slice", "mesh-host.service")
	os.MkdirAll(unit, 0o755)
	os.WriteFile(filepath.Join(unit, "cgroup.procs"), []byte("4242\n"), 0o644)

	cg, notes, err := setupCgroups(fs, []byte("0::/system.slice/mesh-host.service\n"), 4242, "memory")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(unit, "mesh-modules"); cg.base != want {
		t.Fatalf("base %s, want %s", cg.base, want)
	}
	if b, _ := os.ReadFile(filepath.Join(unit, "mesh-host", "cgroup.procs")); string(b) != "4242" {
		t.Fatalf("the host did not move itself into mesh-host: %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(unit, "cgroup.subtree_control")); string(b) != "+memory" {
		t.Fatalf("memory not enabled beneath the unit's cgroup: %q", b)
	}
	if len(notes) != 1 || !strings.Contains(notes[0], "moved itself into "+filepath.Join(unit, "mesh-host")) {
		t.Fatalf("notes %q", notes)
	}

	// re-executed: the same pid, found in the leaf
	again, notes, err := setupCgroups(fs, []byte("0::/system.slice/mesh-host.service/mesh-host\n"), 4242, "memory")
	if err != nil || again.base != cg.base || len(notes) != 0 {
		t.Fatalf("again: %+v %q %v; want base %s and nothing moved", again, notes, err, cg.base)
	}
	if _, err := os.Stat(filepath.Join(unit, "mesh-host", "mesh-host")); err == nil {
		t.Fatal("the host nested a leaf in its leaf")
	}

	// not alone: nothing moved
	shared := filepath.Join(fs, "user.slice", "session-1.scope")
	os.MkdirAll(shared, 0o755)
	os.WriteFile(filepath.Join(shared, "cgroup.procs"), []byte("4242\n17\n"), 0o644)
	cg, notes, err = setupCgroups(fs, []byte("0::/user.slice/session-1.scope\n"), 4242, "memory")
	if err != nil || cg.base != filepath.Join(shared, "mesh-modules") || len(notes) != 0 {
		t.Fatalf("shared: %+v %q %v", cg, notes, err)
	}
	if _, err := os.Stat(filepath.Join(shared, "mesh-host")); err == nil {
		t.Fatal("a host sharing its cgroup moved itself")
	}
}

// TestCgroups_DelegatedKernel runs the same on the machine's cgroup v2
// hierarchy: a host process started alone in a new cgroup (as systemd
// starts a unit's) moves itself into its leaf for real, and arranges
// mesh-modules beside it, twice the same. Skipped where there is no
// writable cgroup v2 hierarchy (not root, or none mounted).
func TestCgroups_DelegatedKernel(t *testing.T) {
	t.Parallel()
	var fs string
	for _, m := range []string{cgroupRoot, cgroupRoot + "/unified"} {
		if _, err := os.Stat(filepath.Join(m, "cgroup.controllers")); err == nil {
			fs = m
			break
		}
	}
	if fs == "" || os.Geteuid() != 0 {
		t.Skip("no cgroup v2 hierarchy this test may write to (it needs root and cgroup v2)")
	}
	unit := filepath.Join(fs, "mesh-host-test-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(unit, 0o755); err != nil {
		t.Skipf("cannot make a cgroup here: %v", err)
	}
	t.Cleanup(func() {
		for _, d := range []string{"mesh-modules", "mesh-host", ""} {
			if err := unix.Rmdir(filepath.Join(unit, d)); err != nil {
				t.Logf("rmdir %s: %v", filepath.Join(unit, d), err)
			}
		}
	})
	fd, err := unix.Open(unit, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	cmd := exec.Command(os.Args[0], "-test.run=^TestSupervisorHelperProcess$")
	cmd.Env = append(os.Environ(), "MESH_SUPERVISE_HELPER=cgroup", "MESH_CGROUP_FS="+fs)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the host: %v\n%s", err, out)
	}
	rel := strings.TrimPrefix(unit, fs)
	want := "base " + rel + "/mesh-modules\n" +
		"note the host moved itself into " + unit + "/mesh-host, beside its modules' cgroups, so that they can be given memory\n" +
		"base " + rel + "/mesh-modules\n" +
		"in " + rel + "/mesh-host\n"
	if string(out) != want {
		t.Fatalf("the host said\n%s\nwant\n%s", out, want)
	}
}
