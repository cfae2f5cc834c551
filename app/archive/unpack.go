package archive

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// ErrRefused is matched (errors.Is) by Unpack's error for an archive it
// will not unpack because of what it holds, as opposed to a fault of the
// disk: such an archive must be rebuilt, not retried.
var ErrRefused = errors.New("archive refused")

// refusal is one entry Unpack will not write, and why.
type refusal struct{ entry, why string }

func (r *refusal) Error() string {
	return fmt.Sprintf("entry %q %s: archive refused, nothing unpacked; rebuild it", r.entry, r.why)
}

func (r *refusal) Is(target error) bool { return target == ErrRefused }

// Unpack reads a verified archive file and writes it beneath dest (which it
// creates, 0755, with any missing parents), refusing — before writing
// anything — any entry whose name is absolute, contains "..", is not
// clean, is a symlink or hard link, a device or fifo, breaks the order
// Pack writes in (strictly increasing names, so each name once), or passes
// a bound (MaxEntries, MaxFileBytes, MaxTotalBytes, MaxNameBytes). It also
// refuses a dest that exists, or whose path passes through a symlink: a
// link swapped in above dest would carry the files elsewhere. Regular
// files keep their executable bit (0755, else 0644).
//
// It writes into a new sibling temp dir, beneath which every name is
// resolved by os.Root, and renames it into place at the end, so a refused
// or failed unpack leaves dest absent, never half-written. It reads the
// archive twice (once to judge every entry, once to write), streaming
// both times.
func Unpack(archivePath, dest string) (err error) {
	abs, err := filepath.Abs(dest)
	if err != nil {
		return fmt.Errorf("unpack %s: %w", archivePath, err)
	}
	fail := func(err error) error { return fmt.Errorf("unpack %s into %s: %w", archivePath, abs, err) }
	if err := checkDest(abs); err != nil {
		return fail(err)
	}
	n, err := scan(archivePath, nil)
	if err != nil {
		return fail(err)
	}
	parent := filepath.Dir(abs)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fail(err)
	}
	if err := checkDest(abs); err != nil { // again: the parents may have been made just now
		return fail(err)
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(abs)+".unpack-*")
	if err != nil {
		return fail(err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp) // holds only what we wrote: no links to follow
		}
	}()
	root, err := os.OpenRoot(tmp)
	if err != nil {
		return fail(err)
	}
	w := &writer{root: root, buf: make([]byte, 64<<10)}
	m, err := scan(archivePath, w.write)
	root.Close()
	if err != nil {
		return fail(err)
	}
	if m != n {
		return fail(fmt.Errorf("the archive changed between reads (%d entries, then %d): receive it again", n, m))
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fail(err)
	}
	if err := syncFS(tmp); err != nil {
		return fail(err)
	}
	if err := renameNew(tmp, abs); err != nil {
		return fail(err)
	}
	syncDir(parent)
	return nil
}

// checkDest refuses a dest that exists or whose existing ancestors
// include a symlink or something that is not a directory.
func checkDest(abs string) error {
	parts := strings.Split(strings.TrimPrefix(abs, "/"), "/")
	p := "/"
	for i, part := range parts {
		p = filepath.Join(p, part)
		info, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil // nothing below it exists either
		}
		if err != nil {
			return err
		}
		if i == len(parts)-1 {
			return fmt.Errorf("%s already exists: unpack into a new directory", p)
		}
		if info.Mode().Type() == fs.ModeSymlink {
			resolved, _ := filepath.EvalSymlinks(p)
			return fmt.Errorf("%s is a symlink (to %s): give a destination whose path has no links", p, resolved)
		}
		if !info.IsDir() {
			return fmt.Errorf("%s is not a directory: give a destination beneath directories", p)
		}
	}
	return nil
}

// scan reads the archive from the start, judges every entry and hands
// each to visit (when not nil) with the tar reader positioned at its
// bytes; it returns how many entries there were.
func scan(archivePath string, visit func(*tar.Header, io.Reader) error) (int, error) {
	f, err := os.Open(archivePath)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	// One goroutine, low memory, and no window past what Pack uses: the
	// decoder's memory is bounded whatever the archive says of itself.
	zr, err := zstd.NewReader(f, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
		zstd.WithDecoderMaxWindow(windowSize))
	if err != nil {
		return 0, fmt.Errorf("start the decompressor: %w", err)
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	var j judge
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return j.entries, nil
		}
		if err != nil {
			return 0, fmt.Errorf("read the archive after %d entries: %w: receive it again or rebuild it", j.entries, err)
		}
		if err := j.entry(hdr); err != nil {
			return 0, err
		}
		if visit != nil {
			if err := visit(hdr, tr); err != nil {
				return 0, err
			}
		}
	}
}

// judge holds what judging an entry needs of the entries before it.
type judge struct {
	entries int
	total   int64
	prev    string
}

// entry judges one header; it refuses with a *refusal.
func (j *judge) entry(hdr *tar.Header) error {
	name := hdr.Name
	if hdr.Typeflag == tar.TypeDir {
		name = strings.TrimSuffix(name, "/")
	}
	refuse := func(format string, a ...any) error {
		return &refusal{entry: hdr.Name, why: fmt.Sprintf(format, a...)}
	}
	j.entries++
	if j.entries > MaxEntries {
		return refuse("is past the bound of %d entries", MaxEntries)
	}
	switch {
	case len(name) > MaxNameBytes:
		return refuse("has a name longer than %d bytes", MaxNameBytes)
	case strings.HasPrefix(name, "/"):
		return refuse("is absolute")
	case slices.Contains(strings.Split(name, "/"), ".."):
		return refuse("climbs out with \"..\"")
	case !localName(name):
		return refuse("is not a clean relative path")
	}
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeDir:
	case tar.TypeSymlink:
		return refuse("is a symlink (to %q): an archive carries no links", hdr.Linkname)
	case tar.TypeLink:
		return refuse("is a hard link (to %q): an archive carries no links", hdr.Linkname)
	case tar.TypeChar, tar.TypeBlock:
		return refuse("is a device: an archive carries only files and directories")
	case tar.TypeFifo:
		return refuse("is a fifo: an archive carries only files and directories")
	default:
		return refuse("has tar type %q: an archive carries only files and directories", hdr.Typeflag)
	}
	if name <= j.prev && j.prev != "" {
		return refuse("comes after %q: names must strictly increase, each once, as Pack writes them", j.prev)
	}
	j.prev = name
	if hdr.Typeflag == tar.TypeReg {
		if hdr.Size < 0 || hdr.Size > MaxFileBytes {
			return refuse("is %d bytes, past the bound of %d for one file", hdr.Size, MaxFileBytes)
		}
		j.total += hdr.Size
		if j.total > MaxTotalBytes {
			return refuse("takes the archive past the bound of %d bytes unpacked", MaxTotalBytes)
		}
	}
	return nil
}

// writer writes judged entries beneath its root.
type writer struct {
	root *os.Root
	buf  []byte
}

func (w *writer) write(hdr *tar.Header, r io.Reader) error {
	if hdr.Typeflag == tar.TypeDir {
		name := strings.TrimSuffix(hdr.Name, "/")
		if err := w.root.MkdirAll(name, 0o755); err != nil {
			return err
		}
		return w.root.Chmod(name, 0o755) // whatever the umask
	}
	if dir := filepath.Dir(hdr.Name); dir != "." {
		if err := w.root.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	perm := fs.FileMode(0o644)
	if hdr.Mode&0o111 != 0 {
		perm = 0o755
	}
	f, err := w.root.OpenFile(hdr.Name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	n, err := io.CopyBuffer(f, r, w.buf)
	if err == nil && n != hdr.Size {
		err = fmt.Errorf("%s: %d bytes of %d: receive the archive again", hdr.Name, n, hdr.Size)
	}
	if err == nil {
		err = f.Chmod(perm)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// syncFS flushes the file system holding dir once, rather than each file:
// the rename that follows must not name files that a crash would lose.
func syncFS(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// syncDir makes a rename in dir durable; a failure here loses nothing
// that is not already on its way to disk, so it is not an error.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

// renameNew renames from to to, refusing to replace anything at to.
func renameNew(from, to string) error {
	err := unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EEXIST):
		return fmt.Errorf("%s already exists: unpack into a new directory", to)
	case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOSYS):
		// A file system without RENAME_NOREPLACE: check, then rename.
		if _, err := os.Lstat(to); err == nil {
			return fmt.Errorf("%s already exists: unpack into a new directory", to)
		}
		return os.Rename(from, to)
	}
	return fmt.Errorf("rename into place: %w", err)
}
