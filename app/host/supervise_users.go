package host

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// userMu makes one module user at a time: useradd locks /etc/passwd and
// fails rather than waits when another holds it.
var userMu sync.Mutex

// credential is who a module runs as: nil (the host's user) unless Users is
// on and the host is root; then its own system user, made on first start.
// What it may read and write was given to it when its files were written
// (apply), through descriptors, never by path.
func (s *Supervisor) credential(spec ModuleSpec) (*syscall.Credential, error) {
	if !s.Users {
		return nil, nil
	}
	if os.Geteuid() != 0 {
		s.logOnce("users", "supervisor: not root, so modules run as the host's user, not each as its own")
		return nil, nil
	}
	name := "mesh-" + spec.Module
	uid, gid, err := moduleUser(name, spec.Dir)
	if err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// moduleUser looks up the system user name, making it when missing: no
// login shell, no home made, home set to home.
func moduleUser(name, home string) (uid, gid int, err error) {
	userMu.Lock()
	defer userMu.Unlock()
	u, err := user.Lookup(name)
	if errors.As(err, new(user.UnknownUserError)) {
		useradd, lerr := exec.LookPath("useradd")
		if lerr != nil {
			useradd = "/usr/sbin/useradd"
		}
		out, rerr := exec.Command(useradd, "--system", "--no-create-home", "--home-dir", home, "--shell", "/usr/sbin/nologin", name).CombinedOutput()
		if rerr != nil {
			return 0, 0, fmt.Errorf("make user %s: %v: %s", name, rerr, firstLine(out))
		}
		u, err = user.Lookup(name)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("look up user %s: %w", name, err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("look up user %s: ids %q, %q", name, u.Uid, u.Gid)
	}
	if uid == 0 || gid == 0 {
		return 0, 0, fmt.Errorf("user %s is root: refusing to run a module as root", name)
	}
	return uid, gid, nil
}

func firstLine(b []byte) string {
	line, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return line
}
