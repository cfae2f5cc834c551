package protocol

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"filippo.io/age"
)

func TestSecret_Redacted(t *testing.T) {
	s := NewSecret([]byte("hunter2-value"))
	for _, out := range []string{fmt.Sprint(s), fmt.Sprintf("%v %+v %#v %s %q %x", s, s, s, s, s, s), s.String()} {
		if strings.Contains(out, "hunter2") || strings.Contains(out, "68756e746572") {
			t.Fatalf("printed: %s", out)
		}
	}
	if b, _ := s.MarshalJSON(); string(b) != `"[REDACTED]"` {
		t.Fatalf("json: %s", b)
	}
	if string(s.Reveal()) != "hunter2-value" {
		t.Fatal("Reveal lost the value")
	}
}

func TestSealOpen(t *testing.T) {
	node, _ := age.GenerateX25519Identity()
	op, _ := age.GenerateX25519Identity()
	other, _ := age.GenerateX25519Identity()
	l := Label{Node: "web1", Module: "paperless", Name: "ocr_licence", Version: 3}
	sealed, err := SealSecret(NewSecret([]byte("the value")), l, node.Recipient(), op.Recipient())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(sealed, "-----BEGIN AGE ENCRYPTED FILE-----") || strings.Contains(sealed, "the value") {
		t.Fatalf("sealed: %s", sealed)
	}
	for name, id := range map[string]age.Identity{"node": node, "operator": op} {
		v, got, err := OpenSealed(sealed, l, id)
		if err != nil || string(v.Reveal()) != "the value" || got != l {
			t.Fatalf("%s: %v %v", name, got, err)
		}
	}
	if _, _, err := OpenSealed(sealed, l, other); err == nil {
		t.Fatal("opened with a key it is not sealed to")
	}
	moved := l
	moved.Name = "admin_password"
	if _, _, err := OpenSealed(sealed, moved, node); !errors.Is(err, ErrWrongLabel) {
		t.Fatalf("a copy moved to another name: %v", err)
	}
	older := l
	older.Version = 2
	if _, _, err := OpenSealed(sealed, older, node); !errors.Is(err, ErrWrongLabel) {
		t.Fatalf("another version: %v", err)
	}
	// A tampered copy does not open.
	lines := strings.Split(sealed, "\n")
	b := []byte(lines[2])
	b[5] ^= 0x01
	lines[2] = string(b)
	if _, _, err := OpenSealed(strings.Join(lines, "\n"), l, node); err == nil {
		t.Fatal("a tampered copy opened")
	}
}

// The plain age command opens a copy to the exact value with the operator
// key file: break-glass works without this program.
func TestSealed_OpensWithTheAgeCommand(t *testing.T) {
	op, _ := age.GenerateX25519Identity()
	node, _ := age.GenerateX25519Identity()
	dir := t.TempDir()
	value := "exact\x00bytes\nwith a newline\n"
	sealed, err := SealSecret(NewSecret([]byte(value)), Label{Node: "n", Module: "m", Name: "s", Version: 1}, node.Recipient(), op.Recipient())
	if err != nil {
		t.Fatal(err)
	}
	key, copyFile := filepath.Join(dir, "operator.key"), filepath.Join(dir, "copy.age")
	os.WriteFile(key, []byte(op.String()+"\n"), 0o600)
	os.WriteFile(copyFile, []byte(sealed), 0o600)
	out, err := exec.Command("go", "tool", "age", "-d", "-i", key, copyFile).Output()
	if err != nil {
		t.Fatalf("age -d: %v", err)
	}
	if string(out) != value {
		t.Fatalf("age -d gave %q", out)
	}
}

// BenchmarkSealSecret seals a 43-byte value to a node and the operator.
//
//	go test -run '^$' -bench 'Seal|Open' ./app/protocol/
func BenchmarkSealSecret(b *testing.B) {
	node, _ := age.GenerateX25519Identity()
	op, _ := age.GenerateX25519Identity()
	v := NewSecret([]byte(strings.Repeat("x", 43)))
	l := Label{Node: "web1", Module: "paperless", Name: "admin_password", Version: 1}
	for i := 0; i < b.N; i++ {
		if _, err := SealSecret(v, l, node.Recipient(), op.Recipient()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkOpenSealed opens one, as a host does.
func BenchmarkOpenSealed(b *testing.B) {
	node, _ := age.GenerateX25519Identity()
	op, _ := age.GenerateX25519Identity()
	l := Label{Node: "web1", Module: "paperless", Name: "admin_password", Version: 1}
	sealed, err := SealSecret(NewSecret([]byte(strings.Repeat("x", 43))), l, node.Recipient(), op.Recipient())
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, _, err := OpenSealed(sealed, l, node); err != nil {
			b.Fatal(err)
		}
	}
}
