package host

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"mesh-controller/app/protocol"
)

// A host takes on a rotated key from a link signed by the key it holds,
// accepts both until the overlap ends and the new one alone after, keeps
// them in its state dir (0600), and refuses a forged link, changing
// nothing.
func TestState_KeysAcrossRotation(t *testing.T) {
	st := savedState(t)
	_, oldPriv, _ := ed25519.GenerateKey(rand.Reader)
	st.ControllerKey = oldPriv.Public().(ed25519.PublicKey)
	newPub, newPriv, _ := ed25519.GenerateKey(rand.Reader)
	now := time.Now()
	until := now.Add(time.Hour)
	link := func(signer ed25519.PrivateKey, next ed25519.PrivateKey) protocol.KeyLink {
		l, err := protocol.NewKeyLink(protocol.KeyAnnouncement{Sequence: 1, OldKey: base64.StdEncoding.EncodeToString(st.ControllerKey),
			NewKey: base64.StdEncoding.EncodeToString(next.Public().(ed25519.PublicKey)), At: now, OverlapUntil: until},
			func(b []byte) []byte { return ed25519.Sign(signer, b) }, func(b []byte) []byte { return ed25519.Sign(next, b) })
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	signed := func(k ed25519.PrivateKey) protocol.Envelope {
		env, err := protocol.Seal(protocol.Declaration{Node: "web1", Serial: 1},
			func(b []byte) []byte { return ed25519.Sign(k, b) }, protocol.KeyID(k.Public().(ed25519.PublicKey)))
		if err != nil {
			t.Fatal(err)
		}
		return env
	}
	var unknown *UnknownKeyError
	if _, err := st.Verify(signed(newPriv)); !errors.As(err, &unknown) {
		t.Fatalf("a key not handed over to yet: %v", err)
	}

	t.Run("a forged link changes nothing", func(t *testing.T) {
		_, forger, _ := ed25519.GenerateKey(rand.Reader)
		if _, err := st.Adopt([]protocol.KeyLink{link(forger, newPriv)}, now); !errors.Is(err, protocol.ErrBadChain) {
			t.Fatalf("err %v", err)
		}
		if _, err := os.Stat(filepath.Join(st.Dir, fileKeys)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("keys written for a forged link: %v", err)
		}
		if _, err := st.Verify(signed(oldPriv)); err != nil {
			t.Fatal(err)
		}
	})

	genuine := link(oldPriv, newPriv)
	followed, err := st.Adopt([]protocol.KeyLink{genuine}, now)
	if err != nil || len(followed) != 1 || !followed[0].Key.Equal(newPub) {
		t.Fatalf("followed %d, %v", len(followed), err)
	}
	if st.KeyID() != protocol.KeyID(newPub) {
		t.Fatalf("the host says it verifies with %s", st.KeyID())
	}
	for _, k := range []ed25519.PrivateKey{oldPriv, newPriv} {
		if _, err := st.Verify(signed(k)); err != nil {
			t.Fatalf("during the overlap: %v", err)
		}
	}
	if _, err := st.keyFor(protocol.KeyID(oldPriv.Public().(ed25519.PublicKey)), until); !errors.Is(err, ErrRetiredKey) {
		t.Fatalf("the old key once the overlap ended: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(st.Dir, fileKeys)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("%s: %v", fileKeys, err)
	}

	// Read back as the host reads its state dir when it starts.
	again, err := Load(st.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if !again.ControllerKey.Equal(newPub) || again.KeyID() != protocol.KeyID(newPub) {
		t.Fatal("the state dir does not hold the new key as the newest")
	}
	if _, err := again.Verify(signed(oldPriv)); err != nil {
		t.Fatalf("the old key read back: %v", err)
	}
	// Following the same link again does nothing.
	if fs, err := again.Adopt([]protocol.KeyLink{genuine}, now); err != nil || len(fs) != 0 {
		t.Fatalf("followed again: %d, %v", len(fs), err)
	}
}
