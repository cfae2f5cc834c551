package host

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"mesh-controller/app/protocol"
)

// ErrNotBeneath means a path built from a declaration would not stay
// beneath the host's root: absolute, not clean, or with a ".." in it.
var ErrNotBeneath = errors.New("not a path beneath the root")

// ErrSymlink means a path beneath the root passes through, or ends at, a
// symbolic link, which the host never follows.
var ErrSymlink = errors.New("a symbolic link, and the host follows no link beneath its root")

// root is the directory a host applies declarations beneath, and the one
// place through which every path built from a declaration is opened,
// written, made or removed.
//
// Every path is walked one name at a time from an open directory, each name
// opened with O_NOFOLLOW (openat), and every write, mkdir, rename and
// unlink is made relative to the directory so opened. A ".." is refused
// before any walk, and a symbolic link anywhere below the root is refused
// rather than followed; the check and the use are the same system call, so
// a module swapping a directory for a link while the host works leaves no
// window. Why not os.Root: it cannot escape the root, but it follows links
// that stay inside it, and an Lstat of each component before using it
// through os.Root leaves exactly that window (a swapped link could redirect
// a deletion onto another module's data). Why not openat2 with
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS: it gives the same guarantee for one
// open, but needs Linux 5.6 and is refused by some container seccomp
// profiles, and mkdir, rename and remove need the parent's descriptor
// anyway. The path to the root itself is the administrator's and is
// resolved as usual.
type root struct {
	dir string
}

// split judges a slash-separated path relative to the root and returns its
// names; the root itself is not a path beneath it.
func split(rel string) ([]string, error) {
	if rel == "" || path.IsAbs(rel) || path.Clean(rel) != rel || strings.ContainsRune(rel, 0) {
		return nil, fmt.Errorf("%q is %w", rel, ErrNotBeneath)
	}
	names := strings.Split(rel, "/")
	for _, n := range names {
		if n == "" || n == "." || n == ".." {
			return nil, fmt.Errorf("%q is %w", rel, ErrNotBeneath)
		}
	}
	return names, nil
}

// dataRel is a data set's absolute path as a path beneath the root:
// /var/lib/x is var/lib/x. A path that is not absolute and clean is refused.
func dataRel(p string) (string, error) {
	if !protocol.ValidDataPath(p) {
		return "", fmt.Errorf("data path %q is %w", p, ErrNotBeneath)
	}
	return strings.TrimPrefix(p, "/"), nil
}

// openRoot opens the root directory itself.
func (r root) openRoot() (int, error) {
	fd, err := unix.Open(r.dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open the root %s: %w", r.dir, err)
	}
	return fd, nil
}

// openDir opens the directory made of names beneath the root, never through
// a link; with create, missing directories are made with perm. The caller
// closes the descriptor.
func (r root) openDir(names []string, create bool, perm uint32) (int, error) {
	fd, err := r.openRoot()
	if err != nil {
		return -1, err
	}
	for i, name := range names {
		next, err := openChildDir(fd, name)
		if create && errors.Is(err, unix.ENOENT) {
			if err = unix.Mkdirat(fd, name, perm); err == nil || errors.Is(err, unix.EEXIST) {
				next, err = openChildDir(fd, name)
			}
		}
		unix.Close(fd)
		if err != nil {
			return -1, pathError(names[:i+1], err)
		}
		fd = next
	}
	return fd, nil
}

// openChildDir opens the directory name inside dirfd, refusing a link.
func openChildDir(dirfd int, name string) (int, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		if isLink(dirfd, name) {
			return -1, ErrSymlink
		}
	}
	return fd, err
}

// isLink says whether name inside dirfd is a symbolic link.
func isLink(dirfd int, name string) bool {
	var st unix.Stat_t
	return unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK
}

// pathError names the path (relative to the root) at which err happened.
func pathError(names []string, err error) error {
	rel := strings.Join(names, "/")
	if errors.Is(err, ErrSymlink) {
		return fmt.Errorf("%s is %w", rel, err)
	}
	return fmt.Errorf("%s: %w", rel, err)
}

// check walks rel as far as it exists and refuses a link anywhere on it,
// its last name included, or a file where a directory must be. Applying
// checks every path it will touch first, so a planted link refuses the
// declaration before any file is written; the walks that act refuse links
// again, race-free.
func (r root) check(rel string) error {
	return r.atParent(rel, func(fd int, name string, names []string) error {
		if isLink(fd, name) {
			return pathError(names, ErrSymlink)
		}
		return nil
	})
}

// atParent opens the directory holding rel beneath the root, never through
// a link, and calls act with it and rel's last name. A parent that is not
// there means there is nothing to check or remove: act is not called.
func (r root) atParent(rel string, act func(dirfd int, name string, names []string) error) error {
	names, err := split(rel)
	if err != nil {
		return err
	}
	fd, err := r.openDir(names[:len(names)-1], false, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return act(fd, names[len(names)-1], names)
}

// mkdirAll makes the directory rel and its parents beneath the root, with perm.
func (r root) mkdirAll(rel string, perm uint32) error {
	names, err := split(rel)
	if err != nil {
		return err
	}
	fd, err := r.openDir(names, true, perm)
	if err != nil {
		return err
	}
	return unix.Close(fd)
}

// writeFile writes rel beneath the root (0600), making its missing parent
// directories with dirPerm. A link where the file goes is refused: rename
// would replace it rather than follow it, but a planted link is news the
// declaration's report should carry.
func (r root) writeFile(rel string, b []byte, dirPerm uint32) error {
	return r.writeFileAs(rel, b, dirPerm, access{perm: 0o600, gid: -1})
}

// access is who may read a file the host writes: its mode, and the group
// (a module's own, or -1 for none) that may read it and, when groupDir, the
// directory it is in — never write either: a module that could write in
// its files' directory could plant a link there and stop its node's
// declarations.
type access struct {
	perm     uint32
	gid      int
	groupDir bool
}

// writeFileAs writes rel as writeFile does, with the file's mode and group
// (and its directory's group, 0750) set on the descriptors, before the file
// is renamed into place: nothing is chowned by path.
func (r root) writeFileAs(rel string, b []byte, dirPerm uint32, a access) error {
	names, err := split(rel)
	if err != nil {
		return err
	}
	dir, name := names[:len(names)-1], names[len(names)-1]
	fd, err := r.openDir(dir, true, dirPerm)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if isLink(fd, name) {
		return pathError(names, ErrSymlink)
	}
	if a.gid >= 0 && a.groupDir {
		if err := unix.Fchown(fd, -1, a.gid); err != nil {
			return pathError(dir, err)
		}
		if err := unix.Fchmod(fd, 0o750); err != nil {
			return pathError(dir, err)
		}
	}
	if err := writeAtAs(fd, name, b, a); err != nil {
		return pathError(names, err)
	}
	return nil
}

// mkdirData makes a data set's directory beneath the root: its parents
// 0755 (a module's user must pass through them), itself 0750. It says
// whether it made the directory itself; given an owner (uid >= 0) it makes
// the directory that module's, through its descriptor, only when owned
// says the host made it: a path that was there before (/etc/cron.d, say)
// is never handed to a module.
func (r root) mkdirData(rel string, uid, gid int, owned bool) (made bool, err error) {
	names, err := split(rel)
	if err != nil {
		return false, err
	}
	parent, name := names[:len(names)-1], names[len(names)-1]
	pfd, err := r.openDir(parent, true, 0o755)
	if err != nil {
		return false, err
	}
	defer unix.Close(pfd)
	switch err := unix.Mkdirat(pfd, name, 0o750); {
	case err == nil:
		made = true
	case !errors.Is(err, unix.EEXIST):
		return false, pathError(names, err)
	}
	fd, err := openChildDir(pfd, name)
	if err != nil {
		return made, pathError(names, err)
	}
	defer unix.Close(fd)
	if uid >= 0 && (made || owned) {
		if err := unix.Fchown(fd, uid, gid); err != nil {
			return made, pathError(names, err)
		}
	}
	return made, nil
}

// writeAt writes name inside the open directory dirfd so that a crash
// leaves the old content or the new, never half: a temporary file with a
// random name, made exclusively (never an existing file, never through a
// link), written, synced, renamed over name, and the directory synced.
func writeAt(dirfd int, name string, b []byte, perm uint32) error {
	return writeAtAs(dirfd, name, b, access{perm: perm, gid: -1})
}

// writeAtAs is writeAt with the file's group set (when a.gid >= 0) on its
// descriptor before the rename.
func writeAtAs(dirfd int, name string, b []byte, a access) error {
	perm := a.perm
	var (
		tmp string
		fd  int
		err error
	)
	for range 10 {
		tmp = "." + name + "." + rand.Text() + ".tmp"
		fd, err = unix.Openat(dirfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm)
		if !errors.Is(err, unix.EEXIST) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("make a temporary file: %w", err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	if a.gid >= 0 {
		err = unix.Fchown(fd, -1, a.gid)
	}
	if err == nil {
		// The umask must not narrow what a module's group may read.
		err = unix.Fchmod(fd, perm)
	}
	if err == nil {
		_, err = f.Write(b)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(dirfd, tmp, dirfd, name)
	}
	if err != nil {
		unix.Unlinkat(dirfd, tmp, 0)
		return err
	}
	return unix.Fsync(dirfd)
}

// removeFile removes the file rel beneath the root, if it is there. A link
// found in its place is removed as a link (unlink never follows one); a
// link on the way to it is refused.
func (r root) removeFile(rel string) error {
	return r.atParent(rel, func(fd int, name string, names []string) error {
		if err := unix.Unlinkat(fd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return pathError(names, err)
		}
		return nil
	})
}

// openParent opens the directory holding rel beneath the root, never
// through a link, and returns rel's names; the caller closes it.
func (r root) openParent(rel string) (int, []string, error) {
	names, err := split(rel)
	if err != nil {
		return -1, nil, err
	}
	fd, err := r.openDir(names[:len(names)-1], false, 0)
	return fd, names, err
}

// removeEmptyDir removes the directory rel beneath the root if it is empty.
func (r root) removeEmptyDir(rel string) error {
	fd, names, err := r.openParent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Unlinkat(fd, names[len(names)-1], unix.AT_REMOVEDIR)
}

// removeAll removes rel beneath the root and everything in it, if it is
// there. Inside it, links are removed as links, never followed. A link at
// rel itself, or on the way to it, is refused: removing the link would
// report data deleted that stays wherever the link points.
func (r root) removeAll(rel string) error {
	return r.atParent(rel, func(fd int, name string, names []string) error {
		if isLink(fd, name) {
			return pathError(names, ErrSymlink)
		}
		if err := removeAllAt(fd, name); err != nil {
			return pathError(names, err)
		}
		return nil
	})
}

// removeAllAt removes name inside dirfd: a file or link by unlinking it, a
// directory by emptying it (entries opened relative to it, O_NOFOLLOW) and
// removing it.
func removeAllAt(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return err
	}
	// Entries made while emptying it make the removal fail with ENOTEMPTY;
	// emptying it again a few times lets a quiet writer lose, not hang us.
	for range 3 {
		fd, err := openChildDir(dirfd, name)
		if err != nil {
			if errors.Is(err, unix.ENOENT) {
				return nil
			}
			return err
		}
		d := os.NewFile(uintptr(fd), name)
		entries, err := d.Readdirnames(-1)
		for _, e := range entries {
			if err == nil {
				err = removeAllAt(fd, e)
			}
		}
		d.Close()
		if err != nil {
			return err
		}
		err = unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST) {
			return err
		}
	}
	return fmt.Errorf("%s: %w", name, unix.ENOTEMPTY)
}

// size adds up the regular files under the directory rel beneath the root,
// following no link; a path it cannot walk counts 0.
func (r root) size(rel string) int64 {
	_, bytes := r.tally(rel)
	return bytes
}

// tally counts the regular files under the directory rel beneath the root
// and adds up their sizes, following no link; a path it cannot walk counts
// 0.
func (r root) tally(rel string) (files, bytes int64) {
	names, err := split(rel)
	if err != nil {
		return 0, 0
	}
	fd, err := r.openDir(names, false, 0)
	if err != nil {
		return 0, 0
	}
	return tallyAt(fd)
}

// tallyAt counts and adds up the regular files under the open directory
// fd, and closes it.
func tallyAt(fd int) (files, total int64) {
	d := os.NewFile(uintptr(fd), "")
	defer d.Close()
	for {
		entries, err := d.Readdirnames(1024)
		for _, e := range entries {
			var st unix.Stat_t
			if unix.Fstatat(fd, e, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
				continue
			}
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFREG:
				files++
				total += st.Size
			case unix.S_IFDIR:
				if sub, err := openChildDir(fd, e); err == nil {
					f, b := tallyAt(sub)
					files, total = files+f, total+b
				}
			}
		}
		if err == io.EOF || len(entries) == 0 || err != nil {
			return files, total
		}
	}
}

// mkdirNew makes the directory rel beneath the root, 0700, where nothing
// is: its parent must be there (never through a link), and something
// already in its place is refused (EEXIST).
func (r root) mkdirNew(rel string) error {
	fd, names, err := r.openParent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Mkdirat(fd, names[len(names)-1], 0o700); err != nil {
		return pathError(names, err)
	}
	return nil
}

// dirState says what rel beneath the root is: absent, an empty directory,
// or a directory with something in it; anything else (a file, a link) is
// refused.
func (r root) dirState(rel string) (exists, empty bool, err error) {
	names, err := split(rel)
	if err != nil {
		return false, false, err
	}
	fd, err := r.openDir(names, false, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return false, false, nil
	}
	if err != nil {
		return false, false, err
	}
	d := os.NewFile(uintptr(fd), rel)
	defer d.Close()
	entries, err := d.Readdirnames(1)
	if err != nil && err != io.EOF {
		return true, false, pathError(names, err)
	}
	return true, len(entries) == 0, nil
}

// rename moves from to to, both beneath the root, each parent opened
// without following a link: never over anything at to (renameat2's
// RENAME_NOREPLACE; where the filesystem has none, to is looked at first).
// Both must be on one filesystem.
func (r root) rename(from, to string) error {
	ffd, fnames, err := r.openParent(from)
	if err != nil {
		return err
	}
	defer unix.Close(ffd)
	tfd, tnames, err := r.openParent(to)
	if err != nil {
		return err
	}
	defer unix.Close(tfd)
	fname, tname := fnames[len(fnames)-1], tnames[len(tnames)-1]
	if isLink(ffd, fname) {
		return pathError(fnames, ErrSymlink)
	}
	err = unix.Renameat2(ffd, fname, tfd, tname, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		var st unix.Stat_t
		if unix.Fstatat(tfd, tname, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
			return pathError(tnames, unix.EEXIST)
		}
		err = unix.Renameat(ffd, fname, tfd, tname)
	}
	if err != nil {
		return fmt.Errorf("move %s to %s: %w", from, to, err)
	}
	return nil
}

// settle makes a restored tree, the directory rel beneath the root, fit to
// hand a module: no set-user or set-group id bit is left on anything in
// it, no device file is let in (a repository's snapshot, made by whoever
// holds its password, could hold the machine's disk as a file), and, when
// uid >= 0, everything in it is that user's and group's. Links are changed
// as links, never followed.
func (r root) settle(rel string, uid, gid int) error {
	names, err := split(rel)
	if err != nil {
		return err
	}
	fd, err := r.openDir(names, false, 0)
	if err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return pathError(names, err)
	}
	if uid >= 0 {
		if err := unix.Fchown(fd, uid, gid); err != nil {
			unix.Close(fd)
			return pathError(names, err)
		}
	}
	if err := unix.Fchmod(fd, st.Mode&0o1777); err != nil {
		unix.Close(fd)
		return pathError(names, err)
	}
	return settleAt(fd, rel, uid, gid)
}

// settleAt settles what is in the open directory fd (at rel), and closes it.
func settleAt(fd int, rel string, uid, gid int) error {
	d := os.NewFile(uintptr(fd), rel)
	defer d.Close()
	for {
		entries, err := d.Readdirnames(1024)
		for _, e := range entries {
			var st unix.Stat_t
			if err := unix.Fstatat(fd, e, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return fmt.Errorf("%s/%s: %w", rel, e, err)
			}
			kind := st.Mode & unix.S_IFMT
			if kind == unix.S_IFBLK || kind == unix.S_IFCHR {
				return fmt.Errorf("%s/%s is a device file: refused", rel, e)
			}
			if uid >= 0 {
				if err := unix.Fchownat(fd, e, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
					return fmt.Errorf("%s/%s: %w", rel, e, err)
				}
			}
			switch kind {
			case unix.S_IFREG:
				if st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
					if err := unix.Fchmodat(fd, e, st.Mode&0o1777, 0); err != nil {
						return fmt.Errorf("%s/%s: %w", rel, e, err)
					}
				}
			case unix.S_IFDIR:
				sub, err := openChildDir(fd, e)
				if err != nil {
					return fmt.Errorf("%s/%s: %w", rel, e, err)
				}
				if err := unix.Fchmod(sub, st.Mode&0o1777); err != nil {
					unix.Close(sub)
					return fmt.Errorf("%s/%s: %w", rel, e, err)
				}
				if err := settleAt(sub, rel+"/"+e, uid, gid); err != nil {
					return err
				}
			}
		}
		if err == io.EOF || len(entries) == 0 {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
	}
}

// hostsOwn is the deepest directory above rel beneath the root (the root
// itself being ".") that, with every directory above it, is this
// process's own and no one else may write in, on the filesystem rel's
// parent is on: in a directory a module could write in, a link could be
// swapped in beneath a path another program (restic) is given by name.
func (r root) hostsOwn(rel string) (string, error) {
	names, err := split(rel)
	if err != nil {
		return "", err
	}
	fd, err := r.openRoot()
	if err != nil {
		return "", err
	}
	type dir struct {
		rel string
		dev uint64
	}
	var safe []dir
	for i := 0; ; i++ {
		var st unix.Stat_t
		err := unix.Fstat(fd, &st)
		if err != nil || int(st.Uid) != os.Geteuid() || st.Mode&0o022 != 0 {
			break
		}
		safe = append(safe, dir{strings.Join(names[:i], "/"), st.Dev})
		if i == len(names)-1 {
			break
		}
		next, err := openChildDir(fd, names[i])
		unix.Close(fd)
		if err != nil {
			return "", pathError(names[:i+1], err)
		}
		fd = next
	}
	// fd is rel's parent, or the first directory not the host's alone.
	var parent unix.Stat_t
	if len(safe) == len(names) {
		parent.Dev = safe[len(safe)-1].dev
	} else if err := r.statParent(names, &parent); err != nil {
		unix.Close(fd)
		return "", err
	}
	unix.Close(fd)
	for i := len(safe) - 1; i >= 0; i-- {
		if safe[i].dev == parent.Dev {
			if safe[i].rel == "" {
				return ".", nil
			}
			return safe[i].rel, nil
		}
	}
	return "", fmt.Errorf("no directory above %s on its filesystem is the host's alone", rel)
}

// statParent stats the directory holding the path of names.
func (r root) statParent(names []string, st *unix.Stat_t) error {
	fd, err := r.openDir(names[:len(names)-1], false, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fstat(fd, st)
}

// digest is a cheap digest of the tree rel beneath the root: every
// entry's path, kind and mode, size and modification time, following no
// link; "" when nothing is there. Anything written, made, removed or
// renamed in the tree changes it (a directory's time moves with what is
// made or removed in it); no file is read.
func (r root) digest(rel string) (string, error) {
	names, err := split(rel)
	if err != nil {
		return "", err
	}
	fd, err := r.openDir(names, false, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	h := sha256.New()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return "", pathError(names, err)
	}
	fmt.Fprintf(h, ".\x00%o\x00%d\x00%d\n", st.Mode, st.Size, st.Mtim.Nano())
	if err := digestAt(fd, ".", h); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// digestAt writes what is in the open directory fd (at rel) to h, in
// name order, and closes it.
func digestAt(fd int, rel string, h io.Writer) error {
	d := os.NewFile(uintptr(fd), rel)
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	sort.Strings(names)
	for _, e := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, e, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("%s/%s: %w", rel, e, err)
		}
		fmt.Fprintf(h, "%s/%s\x00%o\x00%d\x00%d\n", rel, e, st.Mode, st.Size, st.Mtim.Nano())
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			sub, err := openChildDir(fd, e)
			if err != nil {
				return fmt.Errorf("%s/%s: %w", rel, e, err)
			}
			if err := digestAt(sub, rel+"/"+e, h); err != nil {
				return err
			}
		}
	}
	return nil
}
