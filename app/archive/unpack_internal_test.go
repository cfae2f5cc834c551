package archive

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The writing read is held to the total the judging read found: an
// archive that holds more by then (changed between the reads) is stopped
// at the entry that passes it, that entry not even opened, whatever came
// before it written (and then removed by Unpack with its temp dir).
func TestScan_WritingStopsAtTheJudgedTotal(t *testing.T) {
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "a"), []byte("0123456789"), 0o644)
	os.WriteFile(filepath.Join(src, "b"), make([]byte, 1<<20), 0o644)
	file := filepath.Join(t.TempDir(), "a.tar.zst")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Pack(f, src, []string{"a", "b"})
	f.Close()
	if err != nil || p.Unpacked != 10+1<<20 {
		t.Fatalf("Pack: %+v %v", p, err)
	}
	out := t.TempDir()
	root, err := os.OpenRoot(out)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	w := &writer{root: root, buf: make([]byte, 64<<10)}
	_, err = scan(file, 10, w.write)
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), `entry "b"`) {
		t.Fatalf("scan held to 10 bytes: %v, want b refused", err)
	}
	if b, err := os.ReadFile(filepath.Join(out, "a")); err != nil || string(b) != "0123456789" {
		t.Fatalf("a: %q %v", b, err)
	}
	if _, err := os.Lstat(filepath.Join(out, "b")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("b was written past the judged total: %v", err)
	}
}
