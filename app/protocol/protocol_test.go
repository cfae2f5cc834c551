package protocol

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"filippo.io/age"
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

// A beat says what its host is applying only while it applies: between
// applies the key is not there at all, as from a host that predates it,
// and a controller that predates it opens a beat that carries it.
func TestHeartbeat_Applying(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	since := time.Date(2026, 12, 3, 12, 0, 3, 0, time.UTC)
	msg, err := Sign(priv, HeartbeatBody{SerialApplied: 6, Applying: &Applying{Serial: 7, Since: since, Phase: "archives"}})
	if err != nil {
		t.Fatal(err)
	}
	var hb HeartbeatBody
	if err := Open(msg, pub, &hb); err != nil || hb.Applying == nil || *hb.Applying != (Applying{Serial: 7, Since: since, Phase: "archives"}) {
		t.Fatalf("got %+v, %v", hb.Applying, err)
	}
	var older struct {
		SerialApplied int64 `json:"serial_applied"`
		UptimeS       int64 `json:"uptime_s"`
	}
	if err := Open(msg, pub, &older); err != nil || older.SerialApplied != 6 {
		t.Fatalf("a controller that predates applying: %+v, %v", older, err)
	}
	idle, _ := json.Marshal(HeartbeatBody{SerialApplied: 7})
	if strings.Contains(string(idle), "applying") {
		t.Fatalf("a beat between applies says %s", idle)
	}
}

func TestEnvelope(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	env, err := Seal(Declaration{Node: "web1", Serial: 3, Modules: []DeclaredModule{}}, func(b []byte) []byte { return ed25519.Sign(priv, b) }, "k")
	if err != nil {
		t.Fatal(err)
	}
	canon, _ := Canonical(map[string]any{"node": "web1", "serial": 3, "modules": []any{}, "mode": "", "seats": nil, "backup_lines": nil, "protocol": Version})
	if env.Declaration != string(canon) {
		t.Fatal("the envelope does not carry the canonical bytes")
	}
	if env.Protocol != Version {
		t.Fatalf("the envelope says protocol %q, want %q", env.Protocol, Version)
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
		// an answer lies under its host's own subjects
		AnswerSubject("web1", "Xq3kP9"): "web1",
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
		Networks: []string{"10.0.0.0/8"}, PublicDomain: "example.org", Protocol: "1.1",
		BackupLines: []BackupLine{{Node: "n", Module: "m", Data: "d", Path: "/p", Precious: "costly", Cadence: "24h0m0s", LastBackup: &at}},
		Delete:      []DeclaredDeletion{{Module: "m", Kind: "data", Target: "t", Path: "/p"}},
		Host:        &DeclaredHost{Version: "v0.3.1 <&>", Archive: &Archive{Digest: "d", Bytes: 2, UnpackedBytes: 3}},
		Modules: []DeclaredModule{{Module: "m", Version: "1.0.0", Run: &Run{Command: []string{"bin/m", "<&>"}},
			Ports: []Port{{Name: "http", Port: 80, Expose: "overlay"}}, Settings: []byte(`{"a":1,"b":{"c":"<&>"}}`),
			Data:       []DeclaredData{{Name: "d", Path: "/p", Precious: "irreplaceable"}},
			Bindings:   []DeclaredBinding{{Provision: "pg", From: "n/m", Why: "why & so", CredentialName: "c", CredentialVersion: 2, Credential: "x"}},
			Secrets:    []DeclaredSecret{{Name: "s", Version: 1, Sealed: "armor"}},
			Consumers:  []DeclaredConsumer{{Consumer: "n/m", Provision: "pg", State: "active", CredentialName: "c", CredentialVersion: 1, Credential: "y"}},
			WaitingFor: []string{"w"}, Prepare: &Prepare{Command: []string{"bin/m", "migrate"}, Timeout: "90s"}, WithoutSnapshot: true}}}
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

func TestJoinGrant(t *testing.T) {
	id, _ := age.GenerateX25519Identity()
	other, _ := age.GenerateX25519Identity()
	g := JoinGrant{Node: "web1", Creds: "jwt", ControllerKey: "key", BrokerURLs: []string{"nats://a:4222"}}
	sealed, err := SealJoinGrant(g, id.Recipient().String())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(sealed, "jwt") || !strings.HasPrefix(sealed, "-----BEGIN AGE ENCRYPTED FILE-----") {
		t.Fatalf("not sealed: %s", sealed)
	}
	got, err := OpenJoinGrant(sealed, id, "web1")
	if err != nil || got.Creds != "jwt" || got.BrokerURLs[0] != "nats://a:4222" {
		t.Fatalf("got %+v, %v", got, err)
	}
	t.Run("another identity", func(t *testing.T) {
		if _, err := OpenJoinGrant(sealed, other, "web1"); err == nil {
			t.Fatal("opened with another identity")
		}
	})
	t.Run("another node", func(t *testing.T) {
		if _, err := OpenJoinGrant(sealed, id, "web2"); err == nil || !strings.Contains(err.Error(), `for node "web1"`) {
			t.Fatalf("opened for web2: %v", err)
		}
	})
	t.Run("not a recipient", func(t *testing.T) {
		if _, err := SealJoinGrant(g, "age1nope"); err == nil {
			t.Fatal("sealed to a bad recipient")
		}
	})
}

func TestOpenAlert(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	sign := func(k ed25519.PrivateKey) func([]byte) []byte {
		return func(b []byte) []byte { return ed25519.Sign(k, b) }
	}
	seal := func(body map[string]any, k ed25519.PrivateKey) []byte {
		env, err := SealBody(body, sign(k), "key")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(env)
		return b
	}
	alert := map[string]any{"type": AlertType, "event": "raised", "condition": map[string]any{"key": "node.silent/web1"}, "at": "2026-11-29T14:00:00Z"}
	a, err := OpenAlert(seal(alert, priv), pub)
	if err != nil || a.Event != "raised" || !strings.Contains(string(a.Condition), "node.silent/web1") {
		t.Fatalf("got %+v, %v", a, err)
	}
	for what, msg := range map[string][]byte{
		"plain JSON":            []byte(`{"event":"raised","condition":{"key":"node.silent/web1"}}`),
		"signed by another key": seal(alert, other),
	} {
		if _, err := OpenAlert(msg, pub); !errors.Is(err, ErrBadSignature) {
			t.Errorf("%s: %v", what, err)
		}
	}
	// A declaration the controller signed is not an alert.
	if _, err := OpenAlert(seal(map[string]any{"node": "web1", "serial": 3}, priv), pub); !errors.Is(err, ErrNotAlert) {
		t.Errorf("a declaration: %v", err)
	}
	// nor an alert a declaration
	var env Envelope
	json.Unmarshal(seal(alert, priv), &env)
	if d, err := env.Verify(pub); err == nil && (d.Node != "" || d.Serial != 0) {
		t.Errorf("an alert read as a declaration: %+v", d)
	}
}
