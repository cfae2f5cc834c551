package archive

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
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

// ErrNoRoom is matched (errors.Is) by Unpack's error for an archive that
// does not fit the free space of the file system it would unpack into,
// with Margin: nothing was written, and it may be unpacked once there is
// room.
var ErrNoRoom = errors.New("not enough free disk")

// Unpack unpacks a verified archive whose unpacked size is not declared
// (one built before declarations carried it): UnpackSized with 0.
func Unpack(archivePath, dest string) error { return UnpackSized(archivePath, dest, 0) }

// UnpackSized reads a verified archive file and writes it beneath dest
// (which it creates, 0755, with any missing parents), refusing — before
// writing anything — any entry whose name is absolute, contains "..", is
// not clean, is a symlink or hard link, a device or fifo, breaks the order
// Pack writes in (strictly increasing names, so each name once), or passes
// a bound (MaxEntries, MaxFileBytes, MaxTotalBytes, MaxNameBytes). It also
// refuses a dest that exists, or whose path passes through a symlink: a
// link swapped in above dest would carry the files elsewhere. Regular
// files keep their executable bit (0755, else 0644).
//
// unpacked is the size its declaration says it unpacks to (Pack's
// Unpacked), 0 when the declaration says none. A declared size that does
// not fit dest's file system with Margin is refused (ErrNoRoom) before
// the archive is read; an archive whose entries add up past it is refused
// at the header of the entry that passes it, before writing anything, and
// one whose entries add up to less, once read (either way its builder
// declared what it did not pack). Without a declared size the total of
// the entries' headers, learnt without writing, is held to the same
// room. While writing, no more bytes are written than the entries judged
// add up to.
//
// It writes into a new sibling temp dir, beneath which every name is
// resolved by os.Root, and renames it into place at the end, so a refused
// or failed unpack leaves dest absent, never half-written. It reads the
// archive twice (once to judge every entry, once to write), streaming
// both times.
func UnpackSized(archivePath, dest string, unpacked int64) (err error) {
	abs, err := filepath.Abs(dest)
	if err != nil {
		return fmt.Errorf("unpack %s: %w", archivePath, err)
	}
	fail := func(err error) error { return fmt.Errorf("unpack %s into %s: %w", archivePath, abs, err) }
	if err := checkDest(abs); err != nil {
		return fail(err)
	}
	limit := MaxTotalBytes
	if unpacked < 0 || unpacked > MaxTotalBytes {
		return fail(fmt.Errorf("its declaration says it unpacks to %d bytes, outside 0..%d: %w; rebuild it", unpacked, MaxTotalBytes, ErrRefused))
	}
	if unpacked > 0 {
		// Judged on what the declaration says before reading a byte of
		// the archive: one that cannot fit is not even decompressed.
		if err := room(abs, unpacked, 0); err != nil {
			return fail(err)
		}
		limit = unpacked
	}
	sum, err := scan(archivePath, limit, nil)
	if err != nil {
		return fail(err)
	}
	if unpacked > 0 && sum.total != unpacked {
		return fail(fmt.Errorf("its files hold %d bytes, not the %d its declaration says: %w, nothing unpacked; rebuild it", sum.total, unpacked, ErrRefused))
	}
	// Again with the entries counted, each of which takes a block and an
	// inode whatever its size.
	if err := room(abs, sum.total, sum.entries); err != nil {
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
	// The second read is held to the total the first one judged: an
	// archive that changed in between is stopped at the entry that takes
	// it past, not after filling the disk.
	again, err := scan(archivePath, sum.total, w.write)
	root.Close()
	if err != nil {
		return fail(err)
	}
	if again != sum {
		return fail(fmt.Errorf("the archive changed between reads (%d entries of %d bytes, then %d of %d): receive it again",
			sum.entries, sum.total, again.entries, again.total))
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

// Margin is the free space an archive of size bytes unpacked, in entries
// files and directories, needs beyond its size: a tenth of the size, for
// the blocks large files fill in part and the file system's own records
// of them; a block (4 KiB) per entry, since each file and directory takes
// one and an inode whatever its size (100,000 empty files sum to 0 bytes
// but take 400 MiB); and 64 MiB, so that an archive that fits leaves the
// host and the modules room to write their state, logs and the next
// declaration, rather than a disk full to the last block.
func Margin(size int64, entries int) int64 {
	return size/10 + int64(entries)*4<<10 + 64<<20
}

// room refuses (ErrNoRoom) an archive of size bytes in entries entries
// that does not fit, with Margin, the space free to unprivileged users
// (the blocks kept for root are the host's own reserve) of the file
// system dest would be made on, or whose entries outnumber its free
// inodes.
func room(dest string, size int64, entries int) error {
	dir := filepath.Dir(dest)
	for {
		if _, err := os.Lstat(dir); err == nil || dir == "/" {
			break
		}
		dir = filepath.Dir(dir)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("learn the free space of %s: %w", dir, err)
	}
	free := int64(min(st.Bavail, uint64(math.MaxInt64)/max(uint64(st.Bsize), 1))) * st.Bsize
	margin := Margin(size, entries)
	if size+margin > free {
		return fmt.Errorf("%w: it unpacks to %s and needs %s more to spare, but %s has %s free: free space there, or give the module a node with more disk",
			ErrNoRoom, humanBytes(size), humanBytes(margin), dir, humanBytes(free))
	}
	// A file system that counts no inodes (btrfs says 0) is not short of them.
	if st.Files > 0 && uint64(entries) > st.Ffree {
		return fmt.Errorf("%w: it holds %d files and directories, but %s has %d inodes free: free some there, or give the module a node with more disk",
			ErrNoRoom, entries, dir, st.Ffree)
	}
	return nil
}

// humanBytes says a size in bytes as a person reads it, exact below a KiB.
func humanBytes(n int64) string {
	const unit = 1 << 10
	if n < unit {
		return fmt.Sprintf("%d bytes", n)
	}
	v, u := float64(n)/unit, 0
	for ; v >= unit && u < 4; u++ {
		v /= unit
	}
	return fmt.Sprintf("%.1f %s", v, []string{"KiB", "MiB", "GiB", "TiB", "PiB"}[u])
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

// summary is what a scan found: how many entries, and the sum of the
// regular files' sizes.
type summary struct {
	entries int
	total   int64
}

// scan reads the archive from the start, judges every entry (their sizes
// adding up to no more than limit) and hands each to visit (when not nil)
// with the tar reader positioned at its bytes; it returns what it found.
func scan(archivePath string, limit int64, visit func(*tar.Header, io.Reader) error) (summary, error) {
	f, err := os.Open(archivePath)
	if err != nil {
		return summary{}, err
	}
	defer f.Close()
	// One goroutine, low memory, and no window past what Pack uses: the
	// decoder's memory is bounded whatever the archive says of itself.
	zr, err := zstd.NewReader(f, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
		zstd.WithDecoderMaxWindow(windowSize))
	if err != nil {
		return summary{}, fmt.Errorf("start the decompressor: %w", err)
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	j := judge{limit: limit}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return j.summary, nil
		}
		if err != nil {
			return summary{}, fmt.Errorf("read the archive after %d entries: %w: receive it again or rebuild it", j.entries, err)
		}
		if err := j.entry(hdr); err != nil {
			return summary{}, err
		}
		if visit != nil {
			if err := visit(hdr, tr); err != nil {
				return summary{}, err
			}
		}
	}
}

// judge holds what judging an entry needs of the entries before it.
type judge struct {
	summary
	// limit bounds total: MaxTotalBytes, or less when the archive's size
	// is declared or was judged in a first read.
	limit int64
	prev  string
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
		switch {
		case j.total > j.limit && j.limit == MaxTotalBytes:
			return refuse("takes the archive past the bound of %d bytes unpacked", MaxTotalBytes)
		case j.total > j.limit:
			// Judged on the header, before its bytes are read, let alone
			// written: the tar reader yields exactly hdr.Size of them.
			return refuse("of %d bytes takes the archive to %d, past the %d it was declared to unpack to", hdr.Size, j.total, j.limit)
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
	// Never more than the header judged, whatever the reader yields.
	n, err := io.CopyBuffer(f, io.LimitReader(r, hdr.Size), w.buf)
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
