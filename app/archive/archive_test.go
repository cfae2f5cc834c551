package archive_test

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"mesh-controller/app/archive"
)

// writeFile writes a file, making its directory.
func writeFile(t *testing.T, name, content string, perm fs.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, []byte(content), perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(name, perm); err != nil { // whatever the umask
		t.Fatal(err)
	}
}

// tree makes a small module tree: an executable, a data file, mesh.json,
// and a file that must not be packed.
func tree(t *testing.T) string {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "bin/hello"), "#!/bin/sh\necho hi\n", 0o700)
	writeFile(t, filepath.Join(dir, "share/doc/readme.txt"), "read me\n", 0o600)
	writeFile(t, filepath.Join(dir, "mesh.json"), `{"module":"hello","version":"1.0.0"}`, 0o644)
	writeFile(t, filepath.Join(dir, "src/main.c"), "not packed", 0o644)
	return dir
}

// packFile packs paths beneath dir into a new file and checks that the
// digest and size Pack returns are those of the bytes written.
func packFile(t *testing.T, dir string, paths ...string) (file, digest string, size int64) {
	t.Helper()
	file = filepath.Join(t.TempDir(), "a.tar.zst")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	p, err := archive.Pack(f, dir, paths)
	if err != nil {
		t.Fatalf("Pack: %v", err)
	}
	digest, size = p.Digest, p.Bytes
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	got, n := fileDigest(t, file)
	if got != digest || n != size {
		t.Fatalf("Pack said %s (%d bytes), the file is %s (%d bytes)", digest, size, got, n)
	}
	return file, digest, size
}

// fileDigest is a file's sha256 and size, read streaming.
func fileDigest(t *testing.T, name string) (string, int64) {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil)), n
}

// listing is every path beneath dir with its type and permissions, and
// each file's content: what "nothing else was written" is checked against.
func listing(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		line := fmt.Sprintf("%s %v", rel, info.Mode())
		if info.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			line += " " + string(b)
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestPack_RoundTrip(t *testing.T) {
	src := tree(t)
	file, digest, size := packFile(t, src, "bin/", "share/doc/readme.txt", "mesh.json")

	tmp := t.TempDir()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got, n, err := archive.Receive(f, tmp, digest, size)
	if err != nil {
		t.Fatalf("Receive: %v", err)
	}
	if n != size || filepath.Dir(got) != tmp {
		t.Fatalf("Receive = %s, %d; want a file in %s of %d bytes", got, n, tmp, size)
	}
	dest := filepath.Join(t.TempDir(), "modules/hello/1.0.0")
	if err := archive.Unpack(got, dest); err != nil {
		t.Fatalf("Unpack: %v", err)
	}
	want := []string{
		". drwxr-xr-x",
		"bin drwxr-xr-x",
		"bin/hello -rwxr-xr-x #!/bin/sh\necho hi\n",
		"mesh.json -rw-r--r-- " + `{"module":"hello","version":"1.0.0"}`,
		"share drwxr-xr-x",
		"share/doc drwxr-xr-x",
		"share/doc/readme.txt -rw-r--r-- read me\n",
	}
	if l := listing(t, dest); !slices.Equal(l, want) {
		t.Errorf("unpacked:\n%s\nwant:\n%s", strings.Join(l, "\n"), strings.Join(want, "\n"))
	}
	// What Pack says it unpacks to is the files' bytes, counted as Unpack
	// counts them.
	p, err := archive.Pack(io.Discard, src, []string{"bin/", "share/doc/readme.txt", "mesh.json"})
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(len("#!/bin/sh\necho hi\n") + len(`{"module":"hello","version":"1.0.0"}`) + len("read me\n")); p.Unpacked != want {
		t.Errorf("Pack says it unpacks to %d bytes, want %d", p.Unpacked, want)
	}
	// No temp dir is left beside dest.
	if des, _ := os.ReadDir(filepath.Dir(dest)); len(des) != 1 {
		t.Errorf("beside dest: %v, want only dest", des)
	}

	t.Run("dest exists", func(t *testing.T) {
		err := archive.Unpack(got, dest)
		if err == nil || !strings.Contains(err.Error(), "already exists") {
			t.Fatalf("Unpack onto an existing dest: %v, want already exists", err)
		}
	})
}

func TestPack_Deterministic(t *testing.T) {
	src := tree(t)
	_, d1, _ := packFile(t, src, "mesh.json", "bin", "share/")
	// Other times, other permission bits of the same class, other order:
	// the same archive.
	later := time.Now().Add(time.Hour)
	for _, p := range []string{"bin/hello", "share/doc/readme.txt", "mesh.json", "bin"} {
		if err := os.Chtimes(filepath.Join(src, p), later, later); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(filepath.Join(src, "bin/hello"), 0o755)
	os.Chmod(filepath.Join(src, "share/doc/readme.txt"), 0o640)
	_, d2, _ := packFile(t, src, "share/", "bin/", "mesh.json", "bin/hello")
	if d1 != d2 {
		t.Fatalf("packed twice: %s then %s", d1, d2)
	}
	os.Chmod(filepath.Join(src, "bin/hello"), 0o644)
	if _, d3, _ := packFile(t, src, "share/", "bin/", "mesh.json"); d3 == d1 {
		t.Fatalf("losing the executable bit did not change the digest")
	}
}

func TestPack_Refuses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(dir string) error
		paths []string
		want  string
	}{
		{"symlink inside", func(dir string) error { return os.Symlink("/etc/passwd", filepath.Join(dir, "bin/passwd")) },
			[]string{"bin/"}, "bin/passwd is a symlink"},
		{"symlink to a sibling", func(dir string) error { return os.Symlink("hello", filepath.Join(dir, "bin/hi")) },
			[]string{"bin/"}, "bin/hi is a symlink"},
		{"symlinked parent", func(dir string) error { return os.Symlink("bin", filepath.Join(dir, "lib")) },
			[]string{"lib/hello"}, "lib is a symlink"},
		{"fifo", func(dir string) error { return syscall.Mkfifo(filepath.Join(dir, "bin/pipe"), 0o644) },
			[]string{"bin"}, "bin/pipe is a fifo"},
		{"climbs", nil, []string{"../x"}, "not a clean relative path"},
		{"absolute", nil, []string{"/etc"}, "not a clean relative path"},
		{"missing", nil, []string{"nope/"}, "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := tree(t)
			if tc.setup != nil {
				if err := tc.setup(dir); err != nil {
					t.Fatal(err)
				}
			}
			_, err := archive.Pack(io.Discard, dir, tc.paths)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Pack: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

func TestReceive(t *testing.T) {
	src := tree(t)
	file, digest, size := packFile(t, src, "bin/")
	receive := func(want string, max int64) (string, int64, error) {
		f, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		tmp := t.TempDir()
		p, n, err := archive.Receive(f, tmp, want, max)
		if err != nil {
			if des, _ := os.ReadDir(tmp); len(des) != 0 {
				t.Errorf("after a refusal %s holds %v, want nothing", tmp, des)
			}
		}
		return p, n, err
	}
	t.Run("wrong digest", func(t *testing.T) {
		wrong := strings.Repeat("0", 64)
		if _, _, err := receive(wrong, size); !errors.Is(err, archive.ErrDigest) {
			t.Fatalf("Receive with a wrong digest: %v, want ErrDigest", err)
		}
	})
	t.Run("too large", func(t *testing.T) {
		if _, _, err := receive(digest, size-1); !errors.Is(err, archive.ErrTooLarge) {
			t.Fatalf("Receive past max: %v, want ErrTooLarge", err)
		}
	})
	t.Run("exactly max", func(t *testing.T) {
		if _, n, err := receive(strings.ToUpper(digest), size); err != nil || n != size {
			t.Fatalf("Receive at exactly max: %d, %v", n, err)
		}
	})
	t.Run("not a digest", func(t *testing.T) {
		if _, _, err := receive("abc", size); err == nil || !strings.Contains(err.Error(), "not a sha256") {
			t.Fatalf("Receive with a malformed digest: %v", err)
		}
	})
}

// smallWindow is the zstd window of hand-made archives: within what
// Unpack accepts, so that what is refused is refused for its entries.
var smallWindow = zstd.WithWindowSize(1 << 20)

// handMade writes an archive of the given headers the way a hostile
// builder could; a regular file's content is its name.
func handMade(t *testing.T, hdrs ...*tar.Header) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "evil.tar.zst")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	zw, err := zstd.NewWriter(f, smallWindow)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(zw)
	for _, h := range hdrs {
		if h.Typeflag == tar.TypeReg && h.Size == 0 {
			h.Size = int64(len(h.Name))
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("write header %q: %v", h.Name, err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write([]byte(h.Name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return file
}

func TestUnpack_Refuses(t *testing.T) {
	base := t.TempDir()
	sentinel := filepath.Join(base, "sentinel")
	if err := os.Mkdir(sentinel, 0o755); err != nil {
		t.Fatal(err)
	}
	// dest's parent does not exist yet: a refusal must not make it either.
	dest := filepath.Join(base, "modules/m/1.0.0")
	reg := func(name string) *tar.Header { return &tar.Header{Name: name, Typeflag: tar.TypeReg} }
	ok := reg("a-ok") // written first, so a refusal after it proves nothing was written early
	for _, tc := range []struct {
		name string
		hdrs []*tar.Header
		want string
	}{
		{"absolute", []*tar.Header{ok, reg(filepath.Join(sentinel, "abs"))}, "is absolute"},
		{"dot dot", []*tar.Header{ok, reg("../../../sentinel/x")}, `climbs out with ".."`},
		{"dot dot inside", []*tar.Header{ok, reg("a/../../x")}, `climbs out with ".."`},
		{"dot dot dir", []*tar.Header{ok, {Name: "../", Typeflag: tar.TypeDir}}, `climbs out with ".."`},
		{"not clean", []*tar.Header{ok, reg("b//c")}, "is not a clean relative path"},
		{"dot slash", []*tar.Header{ok, reg("./b")}, "is not a clean relative path"},
		{"symlink out", []*tar.Header{ok, {Name: "etc", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"}}, "is a symlink"},
		{"symlink to sibling", []*tar.Header{ok, {Name: "b", Typeflag: tar.TypeSymlink, Linkname: "a-ok"}}, "is a symlink"},
		{"symlink to sentinel", []*tar.Header{ok, {Name: "s", Typeflag: tar.TypeSymlink, Linkname: "../../../sentinel"}, reg("s/x")}, "is a symlink"},
		{"hard link", []*tar.Header{ok, {Name: "h", Typeflag: tar.TypeLink, Linkname: "a-ok"}}, "is a hard link"},
		{"char device", []*tar.Header{ok, {Name: "null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}}, "is a device"},
		{"block device", []*tar.Header{ok, {Name: "sda", Typeflag: tar.TypeBlock, Devmajor: 8}}, "is a device"},
		{"fifo", []*tar.Header{ok, {Name: "p", Typeflag: tar.TypeFifo}}, "is a fifo"},
		{"twice", []*tar.Header{ok, reg("a-ok")}, "names must strictly increase"},
		{"file then dir of its name", []*tar.Header{ok, {Name: "a-ok/", Typeflag: tar.TypeDir}}, "names must strictly increase"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := listing(t, base)
			file := handMade(t, tc.hdrs...)
			err := archive.Unpack(file, dest)
			if err == nil || !errors.Is(err, archive.ErrRefused) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Unpack: %v, want a refusal saying %q", err, tc.want)
			}
			if after := listing(t, base); !slices.Equal(before, after) {
				t.Fatalf("a refused unpack wrote:\nbefore %q\nafter  %q", before, after)
			}
		})
	}

	t.Run("file past the bound", func(t *testing.T) {
		// Only the header is written: the refusal comes before any byte is read.
		file := filepath.Join(t.TempDir(), "big.tar.zst")
		f, _ := os.Create(file)
		zw, _ := zstd.NewWriter(f, smallWindow)
		tw := tar.NewWriter(zw)
		tw.WriteHeader(&tar.Header{Name: "big", Typeflag: tar.TypeReg, Mode: 0o644, Size: archive.MaxFileBytes + 1})
		zw.Close()
		f.Close()
		err := archive.Unpack(file, dest)
		if !errors.Is(err, archive.ErrRefused) || !strings.Contains(err.Error(), "past the bound") {
			t.Fatalf("Unpack: %v, want a refusal for the size", err)
		}
		if _, err := os.Lstat(filepath.Join(base, "modules")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("dest's parent was made by a refused unpack: %v", err)
		}
	})

	t.Run("too many entries", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "many.tar.zst")
		f, _ := os.Create(file)
		zw, _ := zstd.NewWriter(f, smallWindow)
		tw := tar.NewWriter(zw)
		for i := range archive.MaxEntries + 1 {
			tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("f%06d", i), Typeflag: tar.TypeReg, Mode: 0o644})
		}
		tw.Close()
		zw.Close()
		f.Close()
		err := archive.Unpack(file, dest)
		if !errors.Is(err, archive.ErrRefused) || !strings.Contains(err.Error(), "entries") {
			t.Fatalf("Unpack: %v, want a refusal for the count", err)
		}
		if _, err := os.Lstat(filepath.Join(base, "modules")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("dest's parent was made by a refused unpack: %v", err)
		}
	})

	t.Run("window too large", func(t *testing.T) {
		// A decoder holds the whole window: one past what Pack uses is refused.
		file := filepath.Join(t.TempDir(), "wide.tar.zst")
		f, _ := os.Create(file)
		zw, _ := zstd.NewWriter(f, zstd.WithWindowSize(64<<20), zstd.WithEncoderConcurrency(1))
		tw := tar.NewWriter(zw)
		tw.WriteHeader(&tar.Header{Name: "big", Typeflag: tar.TypeReg, Mode: 0o644, Size: 80 << 20})
		io.CopyN(tw, rand.NewChaCha8([32]byte{2}), 80<<20)
		tw.Close()
		zw.Close()
		f.Close()
		err := archive.Unpack(file, dest)
		if err == nil || !strings.Contains(err.Error(), "window size exceeded") {
			t.Fatalf("Unpack: %v, want the window refused", err)
		}
		if _, err := os.Lstat(filepath.Join(base, "modules")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("dest's parent was made by a refused unpack: %v", err)
		}
	})

	t.Run("corrupt", func(t *testing.T) {
		good := handMade(t, ok)
		b, err := os.ReadFile(good)
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)/2] ^= 0xff
		file := filepath.Join(t.TempDir(), "corrupt.tar.zst")
		os.WriteFile(file, b, 0o644)
		if err := archive.Unpack(file, dest); err == nil {
			t.Fatal("a corrupt archive unpacked")
		}
		if _, err := os.Lstat(filepath.Join(base, "modules")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("dest's parent was made by a refused unpack: %v", err)
		}
	})
}

func TestUnpack_SymlinkAboveDest(t *testing.T) {
	base := t.TempDir()
	real := filepath.Join(base, "elsewhere")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	// modules/m was swapped for a link to elsewhere.
	if err := os.MkdirAll(filepath.Join(base, "modules"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, filepath.Join(base, "modules/m")); err != nil {
		t.Fatal(err)
	}
	file, _, _ := packFile(t, tree(t), "bin/")
	err := archive.Unpack(file, filepath.Join(base, "modules/m/1.0.0"))
	if err == nil || !strings.Contains(err.Error(), "is a symlink") {
		t.Fatalf("Unpack through a symlink: %v, want a refusal", err)
	}
	if des, _ := os.ReadDir(real); len(des) != 0 {
		t.Fatalf("written through the symlink: %v", des)
	}
}

// TestPack_LargeStreams packs and unpacks a 50 MB archive and checks the
// Go heap stays small all along: archives are streamed, never held whole.
func TestPack_LargeStreams(t *testing.T) {
	const size = 50 << 20
	const heapBound = 32 << 20
	src := t.TempDir()
	// Random bytes do not compress: the archive is as large as the file.
	big := filepath.Join(src, "bin/big")
	os.MkdirAll(filepath.Dir(big), 0o755)
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.NewChaCha8([32]byte{1})
	if _, err := io.CopyN(f, rng, size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	writeFile(t, filepath.Join(src, "mesh.json"), `{}`, 0o644)
	wantSum, _ := fileDigest(t, big)

	runtime.GC()
	var peak uint64
	var mu sync.Mutex
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			mu.Lock()
			peak = max(peak, ms.HeapInuse)
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()

	start := time.Now()
	file, digest, n := packFile(t, src, "bin/", "mesh.json")
	packed := time.Since(start)
	if n < size {
		t.Fatalf("archive of %d bytes, want at least %d (random bytes do not compress)", n, size)
	}
	start = time.Now()
	af, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := archive.Receive(af, t.TempDir(), digest, n)
	af.Close()
	if err != nil {
		t.Fatal(err)
	}
	received := time.Since(start)
	start = time.Now()
	dest := filepath.Join(t.TempDir(), "m/1.0.0")
	if err := archive.Unpack(got, dest); err != nil {
		t.Fatal(err)
	}
	unpacked := time.Since(start)
	close(stop)
	<-sampled

	if sum, _ := fileDigest(t, filepath.Join(dest, "bin/big")); sum != wantSum {
		t.Fatalf("unpacked file differs from the packed one")
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("50 MiB: pack %v, receive %v, unpack %v; archive %d bytes; peak Go heap in use %.1f MiB",
		packed.Round(time.Millisecond), received.Round(time.Millisecond), unpacked.Round(time.Millisecond), n, float64(peak)/(1<<20))
	if peak > heapBound {
		t.Fatalf("peak Go heap in use %d bytes, want under %d: something holds the archive whole", peak, heapBound)
	}
}

// The listing helper must see what it is meant to compare.
func TestListingSeesFiles(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "x"), "y", 0o644)
	if l := listing(t, dir); len(l) != 2 || !bytes.Contains([]byte(l[1]), []byte("x -rw-r--r-- y")) {
		t.Fatalf("listing: %q", l)
	}
}
