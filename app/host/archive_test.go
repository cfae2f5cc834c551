package host

import (
	"archive/tar"
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"mesh-controller/app/archive"
	"mesh-controller/app/archive/archivetest"
	"mesh-controller/app/protocol"
)

// packed makes an archive file of files (name -> content; executable when
// the name starts with bin/) with archive.Pack, and returns its path and
// what a declaration says of it.
func packed(t *testing.T, files map[string]string) (string, protocol.Archive) {
	t.Helper()
	src := t.TempDir()
	var names []string
	for name, body := range files {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if strings.HasPrefix(name, "bin/") || name == protocol.HostBinaryName {
			mode = 0o755
		}
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
	}
	out := filepath.Join(t.TempDir(), "a.tar.zst")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	p, err := archive.Pack(f, src, names)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	return out, protocol.Archive{Digest: p.Digest, Bytes: p.Bytes, UnpackedBytes: p.Unpacked}
}

// fromFiles is a fetcher over archives kept as local files by digest: the
// object store's part is tested with the live broker elsewhere; here, what
// the host does with what it fetched.
func fromFiles(t *testing.T, byDigest map[string]string) fetcher {
	return func(a protocol.Archive) (string, error) {
		f, err := os.Open(byDigest[a.Digest])
		if err != nil {
			return "", err
		}
		defer f.Close()
		path, _, err := archive.Receive(f, t.TempDir(), a.Digest, protocol.MaxArchiveBytes)
		return path, err
	}
}

// A built module's archive is unpacked into its version's directory and the
// module runs from there; the version before is kept, older ones go; a
// declaration whose archive cannot be had, or holds a climbing entry, is
// refused before any file is written.
func TestApply_Archives(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	st := &State{Node: "web1", ControllerKey: pub}
	root := t.TempDir()
	files := map[string]string{}
	decl := func(serial int, version string, a protocol.Archive) protocol.Envelope {
		return sealed(t, priv, map[string]any{"node": "web1", "serial": serial, "modules": []any{map[string]any{
			"module": "hello", "version": version, "archive": map[string]any{"digest": a.Digest, "bytes": a.Bytes},
			"run": map[string]any{"command": []any{"bin/hello"}}}}})
	}
	var last applied
	for i, v := range []string{"1.0.0", "1.0.1", "1.0.2"} {
		file, a := packed(t, map[string]string{"bin/hello": "#!/bin/sh\necho " + v + "\n", "mesh.json": `{"module":"hello","version":"` + v + `"}`})
		files[a.Digest] = file
		report, next := apply(st, root, last, decl(i+1, v, a), nil, fromFiles(t, files))
		if !report.OK {
			t.Fatalf("%s: %s", v, report.Error)
		}
		last = next
		b, err := os.ReadFile(filepath.Join(root, protocol.ModulesDir, "hello", v, "bin/hello"))
		if err != nil || !strings.Contains(string(b), v) {
			t.Fatalf("%s unpacked: %q %v", v, b, err)
		}
		sp := specs(st, root, next.Runs)
		if len(sp) != 1 || sp[0].Dir != filepath.Join(root, protocol.ModulesDir, "hello", v) {
			t.Fatalf("%s runs from %+v", v, sp)
		}
	}
	for v, want := range map[string]bool{"1.0.0": false, "1.0.1": true, "1.0.2": true} {
		if _, err := os.Stat(filepath.Join(root, protocol.ModulesDir, "hello", v)); (err == nil) != want {
			t.Errorf("version %s kept: %v, want %v", v, err == nil, want)
		}
	}

	t.Run("digest does not match", func(t *testing.T) {
		file, a := packed(t, map[string]string{"bin/hello": "#!/bin/sh\n", "mesh.json": "{}"})
		wrong := a
		wrong.Digest = strings.Repeat("ab", 32)
		report, _ := apply(st, root, last, decl(10, "2.0.0", wrong), nil, fromFiles(t, map[string]string{wrong.Digest: file}))
		if report.OK || !strings.Contains(report.Error, "refused: archive of hello 2.0.0") || !strings.Contains(report.Error, "digest does not match") {
			t.Fatalf("report %+v", report)
		}
		if _, err := os.Stat(filepath.Join(root, protocol.ModulesDir, "hello", "2.0.0")); err == nil {
			t.Fatal("a refused archive left its version directory")
		}
	})

	t.Run("an entry that climbs", func(t *testing.T) {
		var buf bytes.Buffer
		zw, _ := zstd.NewWriter(&buf)
		tw := tar.NewWriter(zw)
		tw.WriteHeader(&tar.Header{Name: "../../../../escaped", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg})
		tw.Write([]byte("x"))
		tw.Close()
		zw.Close()
		sum := sha256.Sum256(buf.Bytes())
		a := protocol.Archive{Digest: hex.EncodeToString(sum[:]), Bytes: int64(buf.Len())}
		file := filepath.Join(t.TempDir(), "evil.tar.zst")
		os.WriteFile(file, buf.Bytes(), 0o600)
		report, _ := apply(st, root, last, decl(11, "3.0.0", a), nil, fromFiles(t, map[string]string{a.Digest: file}))
		if report.OK || !strings.Contains(report.Error, "refused: archive of hello 3.0.0") {
			t.Fatalf("report %+v", report)
		}
		if _, err := os.Stat(filepath.Join(root, protocol.ModulesDir, "escaped")); err == nil {
			t.Fatal("an archive wrote outside its directory")
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(root), "escaped")); err == nil {
			t.Fatal("an archive wrote outside the root")
		}
	})
}

// An archive is judged against the free space of the disk its host
// unpacks it into, by the unpacked size its declaration signs: one that
// does not fit is refused before a byte is written, saying the sizes; one
// that declares less than it holds is stopped with nothing left behind;
// one declared by a controller from before the size was kept is judged by
// its own headers; one that fits applies.
func TestApply_ArchiveRoom(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	st := &State{Node: "web1", ControllerKey: pub}
	root := archivetest.SmallDisk(t, 128<<20)
	files := map[string]string{}
	decl := func(serial int, version string, a protocol.Archive) protocol.Envelope {
		return sealed(t, priv, map[string]any{"node": "web1", "serial": serial, "modules": []any{map[string]any{
			"module": "zeros", "version": version, "archive": map[string]any{"digest": a.Digest, "bytes": a.Bytes, "unpacked_bytes": a.UnpackedBytes},
			"run": map[string]any{"command": []any{"bin/zeros"}}}}})
	}
	zeros := func(version string, size int64) protocol.Archive {
		file, p := archivetest.Zeros(t, "zeros", version, size)
		files[p.Digest] = file
		return protocol.Archive{Digest: p.Digest, Bytes: p.Bytes, UnpackedBytes: p.Unpacked}
	}
	free := archivetest.Free(t, root)
	untouched := func(t *testing.T, version string) {
		t.Helper()
		if _, err := os.Lstat(filepath.Join(root, protocol.ModulesDir, "zeros", version)); err == nil {
			t.Fatalf("a refused archive left its version directory")
		}
		if got := archivetest.Free(t, root); got != free {
			t.Fatalf("free space %d after a refused archive, %d before", got, free)
		}
	}

	big := zeros("2.0.0", 256<<20)
	t.Run("declared, does not fit", func(t *testing.T) {
		report, _ := apply(st, root, applied{}, decl(1, "2.0.0", big), nil, fromFiles(t, files))
		if report.OK || !strings.Contains(report.Error, "refused: archive of zeros 2.0.0") ||
			!strings.Contains(report.Error, "not enough free disk: it unpacks to 256.0 MiB") || strings.Contains(report.Error, "\n") {
			t.Fatalf("report %+v", report)
		}
		t.Log(report.Error)
		untouched(t, "2.0.0")
	})
	t.Run("declared small, unpacks large", func(t *testing.T) {
		lie := big
		lie.UnpackedBytes = 1 << 20
		report, _ := apply(st, root, applied{}, decl(2, "2.0.0", lie), nil, fromFiles(t, files))
		if report.OK || !strings.Contains(report.Error, "past the 1048576 it was declared to unpack to") {
			t.Fatalf("report %+v", report)
		}
		untouched(t, "2.0.0")
	})
	t.Run("not declared, does not fit", func(t *testing.T) {
		old := big
		old.UnpackedBytes = 0
		report, _ := apply(st, root, applied{}, decl(3, "2.0.0", old), nil, fromFiles(t, files))
		if report.OK || !strings.Contains(report.Error, "not enough free disk: it unpacks to 256.0 MiB") {
			t.Fatalf("report %+v", report)
		}
		untouched(t, "2.0.0")
	})
	t.Run("fits", func(t *testing.T) {
		report, _ := apply(st, root, applied{}, decl(4, "1.0.0", zeros("1.0.0", 16<<20)), nil, fromFiles(t, files))
		if !report.OK {
			t.Fatalf("report %+v", report)
		}
		fi, err := os.Stat(filepath.Join(root, protocol.ModulesDir, "zeros", "1.0.0", "bin/zeros"))
		if err != nil || fi.Size() != 16<<20 {
			t.Fatalf("unpacked: %v %v", fi, err)
		}
	})
}
