// Package archive owns module archives: a tar of a module's build outputs
// and its mesh.json, compressed with zstd and named by the sha256 of the
// compressed bytes. It packs, receives (verifying the digest) and unpacks
// them (judging first whether what they unpack to fits the disk), always
// streaming: no archive or file is ever held whole in memory, whatever
// its size.
package archive

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/klauspost/compress/zstd"

	"mesh-controller/app/protocol"
)

// Bounds on what one archive may hold. Pack refuses to make an archive
// past them and Unpack refuses one, before writing anything, so an
// archive that is packed can be unpacked and a hostile one cannot fill a
// host's disk or inode table.
const (
	// MaxEntries bounds the files and directories of one archive: a
	// module of a hundred thousand files is already far past any real one.
	MaxEntries = 100_000
	// MaxFileBytes bounds one file of an archive (16 GiB): large model
	// weights fit, a runaway output does not.
	MaxFileBytes int64 = 16 << 30
	// MaxTotalBytes bounds the unpacked size of one archive (32 GiB), as
	// a declaration may say it.
	MaxTotalBytes int64 = protocol.MaxUnpackedBytes
	// MaxNameBytes bounds one entry's name (Linux's PATH_MAX).
	MaxNameBytes = 4096
)

// windowSize is the zstd window Pack compresses with, and the most Unpack
// accepts: the window is what both sides hold in memory, so it, not the
// archive's size, bounds their memory.
const windowSize = 4 << 20

// modTime is the time every entry carries, so that the same tree packs to
// the same bytes (and so the same digest) whenever it is packed.
var modTime = time.Unix(0, 0).UTC()

// ErrDigest is returned by Receive when the bytes received do not have the
// sha256 they were named by.
var ErrDigest = errors.New("archive digest does not match: fetch it again, or rebuild the module")

// ErrTooLarge is returned by Receive when more bytes arrive than allowed.
var ErrTooLarge = errors.New("archive is larger than allowed: raise the bound or rebuild with fewer outputs")

// entry is one file or directory to pack: a few words each, since Pack
// holds the list of every entry (up to MaxEntries) to sort it.
type entry struct {
	name     string // slash-separated, relative to the packed dir, no trailing slash
	dir      bool
	dev, ino uint64 // which file was listed, from Lstat
}

// newEntry records name as listed.
func newEntry(name string, info fs.FileInfo) entry {
	e := entry{name: name, dir: info.IsDir()}
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		e.dev, e.ino = uint64(st.Dev), uint64(st.Ino)
	}
	return e
}

// is says whether info is the file e was listed as.
func (e entry) is(info fs.FileInfo) bool {
	st, ok := info.Sys().(*syscall.Stat_t)
	return ok && uint64(st.Dev) == e.dev && uint64(st.Ino) == e.ino
}

// Pack writes a tar archive, zstd-compressed, of the given relative paths
// beneath dir (directories recursively; regular files and directories
// only — a symlink inside the tree is refused with an error naming it,
// since an archive must not carry links out), in a deterministic order
// (sorted, fixed mtimes, uid/gid 0, mode normalised to 0644/0755 keeping
// the executable bit), streaming to w; it returns what it packed: the
// sha256 (hex) of the compressed bytes, their length, and the size the
// archive unpacks to. A path may end in "/"; the parent directories of a
// path are packed too, so the archive unpacks whole.
func Pack(w io.Writer, dir string, paths []string) (Packed, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return Packed{}, fmt.Errorf("pack %s: %w", dir, err)
	}
	defer root.Close()
	entries, err := list(root, paths)
	if err != nil {
		return Packed{}, fmt.Errorf("pack %s: %w", dir, err)
	}
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(w, h)}
	// One encoder goroutine and a fixed window: the output depends only on
	// the input, so the digest is stable, and memory stays near the window
	// (about 4.5 MiB measured with the lower-memory mode, 16 MiB without).
	zw, err := zstd.NewWriter(cw, zstd.WithEncoderConcurrency(1), zstd.WithWindowSize(windowSize),
		zstd.WithLowerEncoderMem(true), zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderCRC(true))
	if err != nil {
		return Packed{}, fmt.Errorf("pack %s: start the compressor: %w", dir, err)
	}
	defer zw.Close()
	tw := tar.NewWriter(zw)
	buf := make([]byte, 64<<10)
	var unpacked int64
	for _, e := range entries {
		n, err := writeEntry(tw, root, e, buf)
		if err != nil {
			return Packed{}, fmt.Errorf("pack %s: %w", dir, err)
		}
		if unpacked += n; unpacked > MaxTotalBytes {
			return Packed{}, fmt.Errorf("pack %s: the outputs hold more than %d bytes, the most an archive may unpack to: pack fewer outputs", dir, MaxTotalBytes)
		}
	}
	if err := tw.Close(); err != nil {
		return Packed{}, fmt.Errorf("pack %s: finish the tar: %w", dir, err)
	}
	if err := zw.Close(); err != nil {
		return Packed{}, fmt.Errorf("pack %s: finish compressing: %w", dir, err)
	}
	if cw.err != nil {
		return Packed{}, fmt.Errorf("pack %s: write the archive: %w", dir, cw.err)
	}
	return Packed{Digest: hex.EncodeToString(h.Sum(nil)), Bytes: cw.n, Unpacked: unpacked}, nil
}

// Packed is what Pack made of a tree.
type Packed struct {
	// Digest is the sha256 (hex) of the compressed bytes; Bytes is their
	// length.
	Digest string
	Bytes  int64
	// Unpacked is the sum of the sizes of the regular files packed: the
	// bytes of content unpacking writes, exactly what Unpack counts
	// against it. Directories, tar headers and the file system's own
	// blocks and inodes are not counted: the host's margin (Margin)
	// allows for them.
	Unpacked int64
}

// list finds every entry the paths name, refusing links and special
// files, and returns them sorted by name, each once.
func list(root *os.Root, paths []string) ([]entry, error) {
	seen := map[string]bool{}
	var out []entry
	add := func(name string, info fs.FileInfo) error {
		if seen[name] {
			return nil
		}
		if len(out) >= MaxEntries {
			return fmt.Errorf("more than %d files and directories: pack fewer outputs", MaxEntries)
		}
		if len(name) > MaxNameBytes {
			return fmt.Errorf("%.60s…: name longer than %d bytes", name, MaxNameBytes)
		}
		seen[name] = true
		out = append(out, newEntry(name, info))
		return nil
	}
	for _, p := range paths {
		name := strings.TrimSuffix(p, "/")
		if !localName(name) {
			return nil, fmt.Errorf("%q is not a clean relative path beneath the packed dir", p)
		}
		// The parents first: each must be a real directory, not a link.
		parts := strings.Split(name, "/")
		for i := 1; i < len(parts); i++ {
			parent := strings.Join(parts[:i], "/")
			info, err := root.Lstat(parent)
			if err != nil {
				return nil, err
			}
			if err := packable(parent, info); err != nil {
				return nil, err
			}
			if !info.IsDir() {
				return nil, fmt.Errorf("%s is not a directory", parent)
			}
			if err := add(parent, info); err != nil {
				return nil, err
			}
		}
		if err := walk(root, name, add); err != nil {
			return nil, err
		}
	}
	// Sorting names without their trailing slash puts every directory
	// before what it holds.
	slices.SortFunc(out, func(a, b entry) int { return strings.Compare(a.name, b.name) })
	return out, nil
}

// walk adds name and, for a directory, everything beneath it.
func walk(root *os.Root, name string, add func(string, fs.FileInfo) error) error {
	info, err := root.Lstat(name)
	if err != nil {
		return err
	}
	if err := packable(name, info); err != nil {
		return err
	}
	if err := add(name, info); err != nil {
		return err
	}
	if !info.IsDir() {
		return nil
	}
	d, err := root.Open(name)
	if err != nil {
		return err
	}
	defer d.Close()
	for {
		// In chunks: a directory of millions of names is refused at
		// MaxEntries, not read whole first.
		des, err := d.ReadDir(1024)
		for _, de := range des {
			if err := walk(root, name+"/"+de.Name(), add); err != nil {
				return err
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read directory %s: %w", name, err)
		}
	}
}

// packable refuses what an archive may not carry.
func packable(name string, info fs.FileInfo) error {
	switch t := info.Mode().Type(); {
	case t == fs.ModeSymlink:
		return fmt.Errorf("%s is a symlink: an archive carries no links, make the build copy the file instead", name)
	case t != 0 && t != fs.ModeDir:
		return fmt.Errorf("%s is a %s, not a regular file or directory: an archive carries only those", name, kind(t))
	}
	return nil
}

// kind names a special file's type for an error.
func kind(t fs.FileMode) string {
	switch {
	case t&fs.ModeNamedPipe != 0:
		return "fifo"
	case t&fs.ModeSocket != 0:
		return "socket"
	case t&fs.ModeCharDevice != 0:
		return "character device"
	case t&fs.ModeDevice != 0:
		return "device"
	}
	return "special file"
}

// writeEntry writes one entry's header and, for a file, its bytes; it
// returns how many bytes of content it packed (a directory's are none).
func writeEntry(tw *tar.Writer, root *os.Root, e entry, buf []byte) (int64, error) {
	hdr := &tar.Header{Name: e.name, ModTime: modTime, Mode: 0o644}
	if e.dir {
		hdr.Typeflag, hdr.Name, hdr.Mode = tar.TypeDir, e.name+"/", 0o755
		return 0, tw.WriteHeader(hdr)
	}
	f, err := root.Open(e.name)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	// The file open must be the one listed: a file swapped for a link or a
	// device since is refused, not followed.
	info, err := f.Stat()
	if err != nil {
		return 0, err
	}
	if !info.Mode().IsRegular() || !e.is(info) {
		return 0, fmt.Errorf("%s changed while packing: pack when the build has finished", e.name)
	}
	if info.Size() > MaxFileBytes {
		return 0, fmt.Errorf("%s is %d bytes, more than %d allowed in an archive", e.name, info.Size(), MaxFileBytes)
	}
	hdr.Typeflag, hdr.Size = tar.TypeReg, info.Size()
	if info.Mode().Perm()&0o111 != 0 {
		hdr.Mode = 0o755
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return 0, err
	}
	n, err := io.CopyBuffer(tw, io.LimitReader(f, hdr.Size), buf)
	if err != nil {
		return 0, fmt.Errorf("copy %s: %w", e.name, err)
	}
	if n != hdr.Size {
		return 0, fmt.Errorf("%s shrank while packing: pack when the build has finished", e.name)
	}
	return n, nil
}

// localName says whether name is a clean, relative, slash-separated path
// that stays beneath its root: not empty, not ".", no ".." component.
func localName(name string) bool {
	return name != "" && name != "." && path.Clean(name) == name && filepath.IsLocal(name) &&
		!strings.ContainsRune(name, 0) && !strings.ContainsRune(name, '\\')
}

// countWriter counts what it writes and keeps the first error.
type countWriter struct {
	w   io.Writer
	n   int64
	err error
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	if err != nil && c.err == nil {
		c.err = err
	}
	return n, err
}
