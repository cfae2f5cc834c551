package builder

// A build's command is the repository's word, so it runs in a sandbox
// (issue 28): its first process is this very program re-executed
// (sandboxArg0) as the first process of new PID, mount and IPC
// namespaces, which mounts what the build sees and then becomes the
// build command. What that gives:
//
//   - Nothing outlives the build. When the first process of a PID
//     namespace ends, the kernel kills every other process in it, and no
//     process leaves its PID namespace (setsid, double forks and nohup
//     included); the builder kills that first process when the command
//     exits, at the timeout or when the build is stopped.
//   - It runs as nobody the builder is. A root builder gives each build a
//     throw-away uid and gid of its own (no passwd entry, no groups; see
//     throwAwayID), so it can read neither the builder's files (its broker
//     credentials are 0600 or 0640 to the builder's group) nor
//     /proc/<builder>/environ. A builder that is not root runs each build in
//     a user namespace of its own instead: the kuid stays the builder's,
//     so everything the builder owns is covered (Builder.Hide, the work dir,
//     the creds' directory) and the build keeps no capability.
//   - It sees only its own: a fresh /proc (its own processes only), an
//     empty /tmp, /var/tmp and /dev/shm of its own, its build dir at
//     sandboxHome (the same path for every build), and no_new_privs, so
//     no setuid program gives it more than it has.

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// sandboxArg0 is the argv[0] the builder re-executes itself with as a
// build's first process; SandboxMain recognises it.
const sandboxArg0 = "mesh-builder-sandbox"

// sandboxEnv carries the sandbox's spec to the re-executed program; the
// build command is given its own environment, never this one.
const sandboxEnv = "MESH_BUILDER_SANDBOX"

// sandboxHome is where a build finds its dir (HOME), the checkout beneath it.
const sandboxHome = "/tmp/build"

// sandboxSpec is what the re-executed program does before it becomes the
// build command.
type sandboxSpec struct {
	// UID and GID, when set, are the throw-away user it becomes (a root
	// builder); unset, it is already the builder's user in a user
	// namespace of its own and keeps it, without capabilities.
	UID int `json:"uid,omitempty"`
	GID int `json:"gid,omitempty"`
	// Dir is the build's dir, bound at sandboxHome.
	Dir string `json:"dir"`
	// Hide are paths covered by an empty tmpfs (a directory) or an empty
	// file (anything else) before the command starts.
	Hide []string `json:"hide,omitempty"`
	// Prog, Args, Env and Cwd are the command's, paths as seen inside.
	Prog string   `json:"prog"`
	Args []string `json:"args"`
	Env  []string `json:"env"`
	Cwd  string   `json:"cwd"`
}

// SandboxMain makes this process a build's sandbox when it was started as
// one (argv[0] is sandboxArg0), and never returns then; otherwise it
// returns at once. Any program that runs builds (mesh-builder, and the
// test binaries that call Build) calls it first thing in main or TestMain.
func SandboxMain() {
	if len(os.Args) == 0 || os.Args[0] != sandboxArg0 {
		return
	}
	err := enterSandbox()
	fmt.Fprintf(os.Stderr, "%s%v\n", sandboxSaid, err)
	os.Exit(sandboxFailed)
}

// sandboxSaid begins the line the sandbox says why it failed with.
const sandboxSaid = "mesh-builder: the build's sandbox: "

// sandboxHint says what lets a builder make sandboxes.
const sandboxHint = "run the builder as root, or let unprivileged users make user namespaces (sysctl user.max_user_namespaces, kernel.unprivileged_userns_clone)"

// sandboxFailed is the status the sandbox exits with when it could not
// become the build command (a command that is not found is said earlier,
// by the builder).
const sandboxFailed = 126

// enterSandbox mounts what the build sees, becomes its user and executes
// the command; it returns only with why it could not.
func enterSandbox() error {
	runtime.LockOSThread()
	var s sandboxSpec
	if err := json.Unmarshal([]byte(os.Getenv(sandboxEnv)), &s); err != nil {
		return fmt.Errorf("read its spec: %w", err)
	}
	mount := func(source, target, fstype string, flags uintptr, data string) error {
		if err := unix.Mount(source, target, fstype, flags, data); err != nil {
			return fmt.Errorf("mount %s on %s: %w", fstype, target, err)
		}
		return nil
	}
	// The build's dir is held open: it may be beneath /tmp, which is
	// covered next.
	dir, err := unix.Open(s.Dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open the build's dir: %w", err)
	}
	// Nothing mounted here reaches the builder's namespace.
	if err := mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return err
	}
	if err := mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return err
	}
	if err := mount("tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777,size=256m"); err != nil {
		return err
	}
	if err := os.Mkdir(sandboxHome, 0o755); err != nil {
		return err
	}
	if err := mount("/proc/self/fd/"+strconv.Itoa(dir), sandboxHome, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	unix.Close(dir)
	for _, p := range []string{"/var/tmp", "/dev/shm"} {
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			if err := mount("tmpfs", p, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777,size=64m"); err != nil {
				return err
			}
		}
	}
	for _, p := range s.Hide {
		if err := hide(p); err != nil {
			return err
		}
	}
	if s.UID != 0 {
		// Groups first: once the uid is not root, they cannot be dropped.
		if err := syscall.Setgroups(nil); err != nil {
			return fmt.Errorf("drop the groups: %w", err)
		}
		if err := syscall.Setresgid(s.GID, s.GID, s.GID); err != nil {
			return fmt.Errorf("become gid %d: %w", s.GID, err)
		}
		if err := syscall.Setresuid(s.UID, s.UID, s.UID); err != nil {
			return fmt.Errorf("become uid %d: %w", s.UID, err)
		}
	} else if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		// A user that is not root in its namespace loses every other
		// capability as it executes the command.
		return fmt.Errorf("drop the capabilities it mounted with: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	// A change of user cleared it: the build still dies with the builder.
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		return fmt.Errorf("set the parent-death signal: %w", err)
	}
	if err := os.Chdir(s.Cwd); err != nil {
		return err
	}
	return syscall.Exec(s.Prog, s.Args, s.Env)
}

// hide covers p: a directory with an empty, read-only tmpfs, anything
// else with an empty file. A path that is not there needs no hiding.
func hide(p string) error {
	fi, err := os.Stat(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("hide %s: %w", p, err)
	}
	if fi.IsDir() {
		if err := unix.Mount("tmpfs", p, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0555,size=4k"); err != nil {
			return fmt.Errorf("hide %s: %w", p, err)
		}
		return nil
	}
	if err := unix.Mount("/dev/null", p, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("hide %s: %w", p, err)
	}
	return nil
}

// throwAwayRange is where a root builder takes its builds' uids and gids:
// 0x70000000 and the 65,536 after it, beyond what systemd gives users,
// dynamic users and containers (its UIDS-GIDS.md), and below 2^31.
const (
	throwAwayBase  = 0x70000000
	throwAwayCount = 1 << 16
)

// throwAwayID picks an id for one build: one no user or group is named by
// and no process runs as, so that sweeping the id's processes after the
// build touches nothing else.
func throwAwayID() (int, error) {
	for range 64 {
		id := throwAwayBase + rand.IntN(throwAwayCount)
		if _, err := user.LookupId(strconv.Itoa(id)); err == nil {
			continue
		}
		if _, err := user.LookupGroupId(strconv.Itoa(id)); err == nil {
			continue
		}
		if len(processesOf(id)) > 0 {
			continue
		}
		return id, nil
	}
	return 0, errors.New("no free throw-away id for the build")
}

// processesOf lists the living processes whose real or effective uid is uid.
func processesOf(uid int) []int {
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
		b, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		var state string
		var uids []string
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "State:"); ok {
				state = strings.TrimSpace(v)
			} else if v, ok := strings.CutPrefix(line, "Uid:"); ok {
				uids = strings.Fields(v)
			}
		}
		if strings.HasPrefix(state, "Z") || strings.HasPrefix(state, "X") || len(uids) < 2 {
			continue
		}
		if uids[0] == strconv.Itoa(uid) || uids[1] == strconv.Itoa(uid) {
			out = append(out, pid)
		}
	}
	return out
}

// sandbox is how one build's command is run: as which user, and what of
// the builder it must not see.
type sandbox struct {
	// id is the throw-away uid and gid (a root builder); 0 in a user
	// namespace.
	id int
	// dir is the build's dir, bound at sandboxHome inside.
	dir string
	// hide are the builder's paths covered inside.
	hide []string
}

// newSandbox prepares a sandbox for the build in dir: a root builder
// picks a throw-away id and gives it the build's dir.
func newSandbox(dir string, hide []string) (*sandbox, error) {
	s := &sandbox{dir: dir, hide: hide}
	if os.Geteuid() != 0 {
		return s, nil
	}
	id, err := throwAwayID()
	if err != nil {
		return nil, err
	}
	s.id = id
	err = filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, id, id)
	})
	if err != nil {
		return nil, fmt.Errorf("give the build its dir: %w", err)
	}
	return s, nil
}

// inside is a path beneath the build's dir as the build sees it.
func (s *sandbox) inside(p string) string {
	if rel, err := filepath.Rel(s.dir, p); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
		return filepath.Join(sandboxHome, rel)
	}
	return p
}

// command is cmd made to run in the sandbox: this program re-executed as
// the first process of new namespaces, with cmd's program, arguments,
// environment and directory as its spec.
func (s *sandbox) command(cmd *exec.Cmd) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find the builder's own program: %w", err)
	}
	spec, err := json.Marshal(sandboxSpec{UID: s.id, GID: s.id, Dir: s.dir, Hide: s.hide,
		Prog: s.inside(cmd.Path), Args: cmd.Args, Env: cmd.Env, Cwd: s.inside(cmd.Dir)})
	if err != nil {
		return nil, err
	}
	attr := &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL,
		Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWIPC}
	if s.id == 0 {
		// Its own user namespace, the builder's user alone mapped (as
		// itself), holding only what mounting takes until it executes the
		// command.
		attr.Cloneflags |= syscall.CLONE_NEWUSER
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: os.Getuid(), HostID: os.Getuid(), Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: os.Getgid(), HostID: os.Getgid(), Size: 1}}
		attr.GidMappingsEnableSetgroups = false
		attr.AmbientCaps = []uintptr{unix.CAP_SYS_ADMIN}
	}
	return &exec.Cmd{Path: self, Args: []string{sandboxArg0}, Env: []string{sandboxEnv + "=" + string(spec)},
		Stdout: cmd.Stdout, Stderr: cmd.Stderr, SysProcAttr: attr}, nil
}

// who says, for the build's log, whom the build runs as.
func (s *sandbox) who() string {
	if s.id != 0 {
		return fmt.Sprintf("as throw-away uid %d in namespaces of its own", s.id)
	}
	return "in a user namespace and namespaces of its own"
}

// sweep kills whatever still runs as the build's throw-away uid and
// returns how many are left past bound (0: none). The build's PID
// namespace ended with its first process, so nothing should: this is
// the check that nothing did.
func (s *sandbox) sweep(bound time.Duration) int {
	if s.id == 0 {
		return 0
	}
	deadline := time.Now().Add(bound)
	for {
		left := processesOf(s.id)
		if len(left) == 0 || time.Now().After(deadline) {
			return len(left)
		}
		for _, pid := range left {
			unix.Kill(pid, unix.SIGKILL)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
