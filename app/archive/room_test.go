package archive_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"mesh-controller/app/archive"
	"mesh-controller/app/archive/archivetest"
)

// An archive that unpacks far larger than it is is judged against the
// free space of the file system it unpacks into, with the margin, before
// anything is written: declared honestly, it is refused before it is even
// read; declared not at all, once its headers are read; declared small,
// at the header that passes what it declared. One that fits unpacks.
func TestUnpack_Room(t *testing.T) {
	disk := archivetest.SmallDisk(t, 128<<20)
	dest := filepath.Join(disk, "modules/m/1.0.0")
	free := archivetest.Free(t, disk)
	// nothing is what a refused unpack must leave: the disk as it was.
	nothing := func(t *testing.T) {
		t.Helper()
		if l := listing(t, disk); !slices.Equal(l, []string{". drwxr-xr-x"}) {
			t.Fatalf("a refused unpack left %q", l)
		}
		if got := archivetest.Free(t, disk); got != free {
			t.Fatalf("free space %d after a refused unpack, %d before", got, free)
		}
	}
	const big = 256 << 20
	file, p := archivetest.Zeros(t, "m", "1.0.0", big)
	if want := int64(big + len(`{"module":"m","version":"1.0.0"}`)); p.Unpacked != want {
		t.Fatalf("Pack says it unpacks to %d bytes, want %d", p.Unpacked, want)
	}
	if p.Bytes > 64<<10 {
		t.Fatalf("an archive of 256 MiB of zeros is %d bytes: the test wants one far smaller than it unpacks", p.Bytes)
	}
	t.Logf("%d bytes unpacking to %d, on a tmpfs with %d free", p.Bytes, p.Unpacked, free)

	t.Run("declared, too large", func(t *testing.T) {
		err := archive.UnpackSized(file, dest, p.Unpacked)
		if !errors.Is(err, archive.ErrNoRoom) || errors.Is(err, archive.ErrRefused) ||
			!strings.Contains(err.Error(), "unpacks to 256.0 MiB") || !strings.Contains(err.Error(), "128.0 MiB free") ||
			!strings.Contains(err.Error(), "give the module a node with more disk") || strings.Contains(err.Error(), "\n") {
			t.Fatalf("UnpackSized: %v, want one line saying it does not fit, with the sizes", err)
		}
		nothing(t)
		// Refused on what is declared, before the archive is read: one
		// that is not there is refused alike.
		err = archive.UnpackSized(filepath.Join(t.TempDir(), "absent.tar.zst"), dest, p.Unpacked)
		if !errors.Is(err, archive.ErrNoRoom) {
			t.Fatalf("UnpackSized of an absent archive declared too large: %v, want ErrNoRoom before reading", err)
		}
	})

	t.Run("not declared, too large", func(t *testing.T) {
		err := archive.Unpack(file, dest)
		if !errors.Is(err, archive.ErrNoRoom) || !strings.Contains(err.Error(), "unpacks to 256.0 MiB") {
			t.Fatalf("Unpack: %v, want it refused for room once its headers are read", err)
		}
		nothing(t)
	})

	t.Run("declared small, unpacks large", func(t *testing.T) {
		err := archive.UnpackSized(file, dest, 1<<10)
		if !errors.Is(err, archive.ErrRefused) || !strings.Contains(err.Error(), `entry "bin/zeros"`) ||
			!strings.Contains(err.Error(), "past the 1024 it was declared to unpack to") {
			t.Fatalf("UnpackSized: %v, want the entry that passes the declared size refused", err)
		}
		nothing(t)
	})

	t.Run("declared larger than it unpacks", func(t *testing.T) {
		err := archive.UnpackSized(file, dest, p.Unpacked+1)
		if !errors.Is(err, archive.ErrNoRoom) {
			t.Fatalf("UnpackSized: %v", err)
		}
		small, sp := archivetest.Zeros(t, "m", "1.0.0", 1<<10)
		err = archive.UnpackSized(small, dest, sp.Unpacked+1)
		if !errors.Is(err, archive.ErrRefused) || !strings.Contains(err.Error(), "not the") {
			t.Fatalf("UnpackSized: %v, want a size that is not the files' refused", err)
		}
		nothing(t)
	})

	t.Run("declared outside the bounds", func(t *testing.T) {
		for _, n := range []int64{-1, archive.MaxTotalBytes + 1} {
			if err := archive.UnpackSized(file, dest, n); !errors.Is(err, archive.ErrRefused) || !strings.Contains(err.Error(), "outside 0..") {
				t.Fatalf("UnpackSized declared %d: %v, want it refused", n, err)
			}
		}
		nothing(t)
	})

	t.Run("fits but not with the margin", func(t *testing.T) {
		// 100 MiB of 128 fits, but not with 10 MiB and 64 MiB to spare.
		mid, mp := archivetest.Zeros(t, "m", "1.0.0", 100<<20)
		err := archive.UnpackSized(mid, dest, mp.Unpacked)
		if !errors.Is(err, archive.ErrNoRoom) || !strings.Contains(err.Error(), "needs 74.0 MiB more to spare") {
			t.Fatalf("UnpackSized: %v, want it refused for the margin", err)
		}
		nothing(t)
	})

	t.Run("fits", func(t *testing.T) {
		small, sp := archivetest.Zeros(t, "m", "1.0.0", 32<<20)
		if err := archive.UnpackSized(small, dest, sp.Unpacked); err != nil {
			t.Fatalf("UnpackSized of one that fits: %v", err)
		}
		fi, err := os.Stat(filepath.Join(dest, "bin/zeros"))
		if err != nil || fi.Size() != 32<<20 {
			t.Fatalf("unpacked: %v %v", fi, err)
		}
	})
}

// An archive of more files than the file system has inodes free is
// refused before anything is written, however few bytes they hold.
func TestUnpack_Inodes(t *testing.T) {
	disk := archivetest.SmallDisk(t, 128<<20, "nr_inodes=50")
	src := t.TempDir()
	var paths []string
	for i := range 100 {
		name := fmt.Sprintf("f%03d", i)
		writeFile(t, filepath.Join(src, name), "x", 0o644)
		paths = append(paths, name)
	}
	file, _, _ := packFile(t, src, paths...)
	err := archive.Unpack(file, filepath.Join(disk, "m/1.0.0"))
	if !errors.Is(err, archive.ErrNoRoom) || !strings.Contains(err.Error(), "it holds 100 files and directories") {
		t.Fatalf("Unpack: %v, want it refused for inodes", err)
	}
	if l := listing(t, disk); !slices.Equal(l, []string{". drwxr-xr-x"}) {
		t.Fatalf("a refused unpack left %q", l)
	}
}

// Margin is what the refusals say it is.
func TestMargin(t *testing.T) {
	for _, c := range []struct {
		size    int64
		entries int
		want    int64
	}{
		{0, 0, 64 << 20},
		{100 << 20, 0, 74 << 20},
		{0, 100_000, 64<<20 + 100_000*4096},
	} {
		if got := archive.Margin(c.size, c.entries); got != c.want {
			t.Errorf("Margin(%d, %d) = %d, want %d", c.size, c.entries, got, c.want)
		}
	}
}
