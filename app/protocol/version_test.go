package protocol

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// withVersion runs f with this build speaking v.
func withVersion(t *testing.T, v string, f func()) {
	t.Helper()
	was := Version
	Version = v
	defer func() { Version = was }()
	f()
}

func TestParseVersion(t *testing.T) {
	for in, want := range map[string]Ver{"": {1, 0}, "1.0": {1, 0}, "1.1": {1, 1}, "2.13": {2, 13}, "0.9": {0, 9}} {
		if got, err := ParseVersion(in); err != nil || got != want {
			t.Errorf("ParseVersion(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"1", "1.", ".1", "a.b", "1.1.1", "-1.0", "1.-1", "1.0 ", strings.Repeat("1", 20) + ".0"} {
		if _, err := ParseVersion(in); !errors.Is(err, ErrNotAVersion) {
			t.Errorf("ParseVersion(%q) = %v, want ErrNotAVersion", in, err)
		}
	}
}

// The controller speaks to hosts of its major within one minor of its
// own, and refuses the rest in one line naming both and what to do.
func TestSpeaks(t *testing.T) {
	withVersion(t, "1.3", func() {
		for _, ok := range []string{"1.2", "1.3", "1.4"} {
			if err := Speaks(ok); err != nil {
				t.Errorf("Speaks(%q): %v", ok, err)
			}
		}
		for theirs, want := range map[string]string{
			"":         "the host speaks protocol 1.0, this controller 1.3 (it speaks 1.2 to 1.4): upgrade the host",
			"1.1":      "the host speaks protocol 1.1, this controller 1.3 (it speaks 1.2 to 1.4): upgrade the host",
			"1.5":      "the host speaks protocol 1.5, this controller 1.3 (it speaks 1.2 to 1.4): upgrade the controller",
			"2.3":      "the host speaks protocol 2.3, this controller 1.3 (it speaks 1.2 to 1.4): upgrade the controller",
			"0.3":      "the host speaks protocol 0.3, this controller 1.3 (it speaks 1.2 to 1.4): upgrade the host",
			"x\n.1":    `the host speaks protocol x\n.1, this controller 1.3 (it speaks 1.2 to 1.4): upgrade the host`,
			"1.1\x1b[": `the host speaks protocol 1.1\x1b[, this controller 1.3 (it speaks 1.2 to 1.4): upgrade the host`,
		} {
			err := Speaks(theirs)
			var m *MismatchError
			if !errors.As(err, &m) || err.Error() != want {
				t.Errorf("Speaks(%q) = %v\nwant %s", theirs, err, want)
			}
		}
	})
	withVersion(t, "1.1", func() {
		// A message that carries no version is 1.0: every host before
		// versions were carried is spoken to by the first controller that
		// carries them.
		if err := Speaks(""); err != nil {
			t.Errorf("a 1.1 controller refuses an unversioned host: %v", err)
		}
		if err := Speaks("1.3"); err == nil || !strings.Contains(err.Error(), "(it speaks 1.0 to 1.2): upgrade the controller") {
			t.Errorf("Speaks(1.3) = %v", err)
		}
	})
	withVersion(t, "2.0", func() {
		if err := Speaks("1.9"); err == nil || err.Error() != "the host speaks protocol 1.9, this controller 2.0 (it speaks 2.0 to 2.1): upgrade the host" {
			t.Errorf("Speaks(1.9) under 2.0 = %v", err)
		}
	})
}

// A host reads every declaration of its major or older, a newer minor
// included, and refuses a newer major.
func TestReads(t *testing.T) {
	withVersion(t, "1.1", func() {
		for _, ok := range []string{"", "1.0", "1.1", "1.2", "1.99", "0.5"} {
			if err := Reads(ok); err != nil {
				t.Errorf("Reads(%q): %v", ok, err)
			}
		}
		err := Reads("2.0")
		if err == nil || err.Error() != "declaration speaks protocol 2.0; this host reads 1.x: upgrade the host" {
			t.Errorf("Reads(2.0) = %v", err)
		}
		if err := Reads("two"); err == nil {
			t.Error("a declaration whose protocol is not a version was read")
		}
	})
}

// Every host message carries the protocol beside what is signed: a
// controller that predates it opens the message as before, and one that
// reads it learns it; a message without one is 1.0.
func TestSigned_Protocol(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	msg, err := Sign(priv, HeartbeatBody{SerialApplied: 3})
	if err != nil {
		t.Fatal(err)
	}
	var hb HeartbeatBody
	if v, err := OpenVersioned(msg, pub, &hb); err != nil || v != Version || hb.SerialApplied != 3 {
		t.Fatalf("got %q, %+v, %v", v, hb, err)
	}
	var old struct {
		Body      json.RawMessage `json:"body"`
		Signature string          `json:"signature"`
	}
	if err := json.Unmarshal(msg, &old); err != nil {
		t.Fatal(err)
	}
	unversioned, _ := json.Marshal(old)
	if v, err := OpenVersioned(unversioned, pub, &hb); err != nil || v != Unversioned {
		t.Fatalf("a message without a protocol: %q, %v", v, err)
	}
}

// A declaration written in a newer major is refused by Verify with its
// node and serial, nothing else read; a newer minor is read, what it adds
// ignored.
func TestEnvelope_Protocol(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	sign := func(b []byte) []byte { return ed25519.Sign(priv, b) }
	env, err := SealBody(map[string]any{"node": "web1", "serial": 5, "protocol": "2.0", "modules": "read differently in 2.0"}, sign, "k")
	if err != nil {
		t.Fatal(err)
	}
	d, err := env.Verify(pub)
	var m *MismatchError
	if !errors.As(err, &m) || d.Serial != 5 || d.Node != "web1" {
		t.Fatalf("a 2.0 declaration: %+v, %v", d, err)
	}
	env, _ = SealBody(map[string]any{"node": "web1", "serial": 6, "protocol": "1.9", "modules": []any{}, "something_new": true}, sign, "k")
	if d, err := env.Verify(pub); err != nil || d.Serial != 6 || d.Protocol != "1.9" {
		t.Fatalf("a 1.9 declaration: %+v, %v", d, err)
	}
}
