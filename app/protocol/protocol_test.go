package protocol

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"testing"
	"time"
)

func TestCanonical(t *testing.T) {
	a, err := Canonical(map[string]any{"z": 1, "a": map[string]any{"y": "<&>", "b": []any{2, 1}}, "n": 1.50})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"a":{"b":[2,1],"y":"<&>"},"n":1.5,"z":1}`; string(a) != want {
		t.Fatalf("got %s, want %s", a, want)
	}
	type s struct {
		Z int `json:"z"`
		A int `json:"a"`
	}
	b, _ := Canonical(s{Z: 1, A: 2})
	if string(b) != `{"a":2,"z":1}` {
		t.Fatalf("struct fields not sorted: %s", b)
	}
}

func TestSignOpen(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	otherPub, _, _ := ed25519.GenerateKey(rand.Reader)
	msg, err := Sign(priv, HeartbeatBody{SerialApplied: 7})
	if err != nil {
		t.Fatal(err)
	}
	var hb HeartbeatBody
	if err := Open(msg, pub, &hb); err != nil || hb.SerialApplied != 7 {
		t.Fatalf("got %+v, %v", hb, err)
	}
	if err := Open(msg, otherPub, &hb); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("another key: %v", err)
	}
	tampered := append([]byte(nil), msg...)
	for i := range tampered {
		if tampered[i] == '7' {
			tampered[i] = '8'
			break
		}
	}
	if err := Open(tampered, pub, &hb); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("tampered body: %v", err)
	}
}

func TestEnvelope(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	env, err := Seal(Declaration{Node: "web1", Serial: 3, Modules: []DeclaredModule{}}, func(b []byte) []byte { return ed25519.Sign(priv, b) }, "k")
	if err != nil {
		t.Fatal(err)
	}
	canon, _ := Canonical(map[string]any{"node": "web1", "serial": 3, "modules": []any{}, "mode": "", "seats": nil, "backup_lines": nil})
	if env.Declaration != string(canon) {
		t.Fatal("the envelope does not carry the canonical bytes")
	}
	d, err := env.Verify(pub)
	if err != nil || d.Node != "web1" || d.Serial != 3 {
		t.Fatalf("got %+v, %v", d, err)
	}
	env.Declaration = `{"modules":[],"node":"web1","serial":4}`
	if _, err := env.Verify(pub); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("a changed declaration verified: %v", err)
	}
}

func TestNodeOfSubject(t *testing.T) {
	for subject, want := range map[string]string{
		"mesh.node.web1.heartbeat":         "web1",
		"mesh.node.db-2.inbox.declaration": "db-2",
		"mesh.node.web1":                   "",
		"mesh.join":                        "",
		"other.node.web1.heartbeat":        "",
	} {
		if got := NodeOfSubject(subject); got != want {
			t.Errorf("NodeOfSubject(%q) = %q, want %q", subject, got, want)
		}
	}
}

// A declaration encodes to canonical JSON in one pass: every struct's fields
// stand in the order of their JSON names. A field added out of order fails here.
func TestDeclaration_EncodesCanonically(t *testing.T) {
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	d := Declaration{Node: "web1", Serial: 7, IssuedAt: at, Mode: "converged", Seats: []string{"backup"},
		BackupLines: []BackupLine{{Node: "n", Module: "m", Data: "d", Path: "/p", Precious: "costly", Cadence: "24h0m0s", LastBackup: &at}},
		Delete:      []DeclaredDeletion{{Module: "m", Kind: "data", Target: "t", Path: "/p"}},
		Modules: []DeclaredModule{{Module: "m", Version: "1.0.0", Run: &Run{Command: []string{"bin/m", "<&>"}},
			Ports: []Port{{Name: "http", Port: 80, Expose: "overlay"}}, Settings: []byte(`{"a":1,"b":{"c":"<&>"}}`),
			Data:       []DeclaredData{{Name: "d", Path: "/p", Precious: "irreplaceable"}},
			Bindings:   []DeclaredBinding{{Provision: "pg", From: "n/m", Why: "why & so", CredentialName: "c", CredentialVersion: 2, Credential: "x"}},
			Secrets:    []DeclaredSecret{{Name: "s", Version: 1, Sealed: "armor"}},
			Consumers:  []DeclaredConsumer{{Consumer: "n/m", Provision: "pg", State: "active", CredentialName: "c", CredentialVersion: 1, Credential: "y"}},
			WaitingFor: []string{"w"}}}}
	fast, err := d.Encode()
	if err != nil {
		t.Fatal(err)
	}
	slow, err := Canonical(d)
	if err != nil {
		t.Fatal(err)
	}
	if string(fast) != string(slow) {
		t.Fatalf("not canonical:\n%s\nwant\n%s", fast, slow)
	}
}
