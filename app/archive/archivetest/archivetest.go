// Package archivetest gives tests of archives what they need of the real
// machine: a small file system of its own to fill, and archives that
// unpack far larger than they are. Only tests import it.
package archivetest

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"mesh-controller/app/archive"
)

// SmallDisk mounts a tmpfs of size bytes on a new directory and returns
// it; it is unmounted when the test ends. tmpfs takes memory only for
// what is written to it, so a test may give it far more than it fills.
// Mounting needs root: without it the test is skipped.
// Each of opts is one more tmpfs mount option ("nr_inodes=50").
func SmallDisk(t testing.TB, size int64, opts ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "small-disk")
	MountSmallDisk(t, dir, size, opts...)
	return dir
}

// MountSmallDisk mounts a tmpfs of size bytes on dir (made if missing,
// with its parents), as SmallDisk does: for a test whose disk must be at
// a given place, such as a host's modules directory.
func MountSmallDisk(t testing.TB, dir string, size int64, opts ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small file system needs root")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	data := strings.Join(append([]string{"size=" + strconv.FormatInt(size, 10), "mode=0755"}, opts...), ",")
	if err := unix.Mount("mesh-test", dir, "tmpfs", 0, data); err != nil {
		t.Fatalf("mount a tmpfs (%s) on %s: %v", data, dir, err)
	}
	// Registered after the TempDir holding dir, so it runs before that is
	// removed; detached, so a process still in it does not keep it.
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
}

// Free is the space free on the file system holding dir, as Unpack reads it.
func Free(t testing.TB, dir string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

// Zeros packs, with archive.Pack, a module tree of a mesh.json and an
// executable bin/zeros of size zero bytes (a sparse file: written in no
// time, read as zeros), into a new file; it returns its path and what
// Pack said of it. zstd makes a few KiB of a GiB of zeros.
func Zeros(t testing.TB, module, version string, size int64) (string, archive.Packed) {
	t.Helper()
	src := t.TempDir()
	if err := os.Mkdir(filepath.Join(src, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "mesh.json"), []byte(`{"module":"`+module+`","version":"`+version+`"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	zeros, err := os.OpenFile(filepath.Join(src, "bin", "zeros"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	err = zeros.Truncate(size)
	if cerr := zeros.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "zeros.tar.zst")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p, err := archive.Pack(f, src, []string{"bin/", "mesh.json"})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return file, p
}
