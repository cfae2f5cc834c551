package protocol

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"
)

// chainOf makes n rotations from a first key: the keys (keys[0] the first)
// and the links, each signed by the key before it and by its own.
func chainOf(t *testing.T, n int) ([]ed25519.PrivateKey, []KeyLink) {
	t.Helper()
	keys := []ed25519.PrivateKey{newKey(t)}
	var links []KeyLink
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := 1; i <= n; i++ {
		next := newKey(t)
		links = append(links, link(t, int64(i), keys[i-1], next, keys[i-1], at))
		keys = append(keys, next)
	}
	return keys, links
}

func newKey(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func pubOf(k ed25519.PrivateKey) ed25519.PublicKey { return k.Public().(ed25519.PublicKey) }

// link is announcement seq from old to next, its old half signed by signer.
func link(t *testing.T, seq int64, old, next, signer ed25519.PrivateKey, at time.Time) KeyLink {
	t.Helper()
	l, err := NewKeyLink(KeyAnnouncement{Sequence: seq, OldKey: base64.StdEncoding.EncodeToString(pubOf(old)),
		NewKey: base64.StdEncoding.EncodeToString(pubOf(next)), At: at, OverlapUntil: at.Add(7 * 24 * time.Hour)},
		func(b []byte) []byte { return ed25519.Sign(signer, b) }, func(b []byte) []byte { return ed25519.Sign(next, b) })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestFollow(t *testing.T) {
	keys, links := chainOf(t, 3)
	t.Run("from the first key", func(t *testing.T) {
		got, err := Follow(pubOf(keys[0]), links)
		if err != nil || len(got) != 3 || !got[2].Key.Equal(pubOf(keys[3])) || got[2].Sequence != 3 {
			t.Fatalf("followed %d links, err %v", len(got), err)
		}
	})
	t.Run("from a key part way, the chain given whole", func(t *testing.T) {
		got, err := Follow(pubOf(keys[2]), links)
		if err != nil || len(got) != 1 || !got[0].Key.Equal(pubOf(keys[3])) {
			t.Fatalf("followed %d links, err %v", len(got), err)
		}
	})
	t.Run("from the latest key: nothing to follow", func(t *testing.T) {
		got, err := Follow(pubOf(keys[3]), links)
		if err != nil || len(got) != 0 {
			t.Fatalf("followed %d links, err %v", len(got), err)
		}
	})
	t.Run("a forged link is refused", func(t *testing.T) {
		// Someone without key 1 hands over from it to a key of their own.
		forger := newKey(t)
		forged := append(links[:1:1], link(t, 2, keys[1], forger, forger, time.Now()))
		_, err := Follow(pubOf(keys[0]), forged)
		if !errors.Is(err, ErrBadChain) || !strings.Contains(err.Error(), "link 2 is not signed by its old key") {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("a link signed by no key before it is refused", func(t *testing.T) {
		// Signed right by its own keys, but handing over from a key the
		// chain never made current.
		other := newKey(t)
		bad := append(links[:1:1], link(t, 2, other, newKey(t), other, time.Now()))
		_, err := Follow(pubOf(keys[0]), bad)
		if !errors.Is(err, ErrBadChain) || !strings.Contains(err.Error(), "hands over from") {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("a gap is refused", func(t *testing.T) {
		_, err := Follow(pubOf(keys[0]), []KeyLink{links[0], links[2]})
		if !errors.Is(err, ErrBadChain) || !strings.Contains(err.Error(), "link 3 follows link 1") {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("a chain that never reaches the key known is refused", func(t *testing.T) {
		_, err := Follow(newKey(t).Public().(ed25519.PublicKey), links)
		if !errors.Is(err, ErrBadChain) || !errors.Is(err, ErrNotFromKey) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("a declaration is not an announcement", func(t *testing.T) {
		env, err := Seal(Declaration{Node: "web1", Serial: 1}, func(b []byte) []byte { return ed25519.Sign(keys[0], b) }, "")
		if err != nil {
			t.Fatal(err)
		}
		_, _, _, err = KeyLink{Announcement: env.Declaration, OldSignature: env.Signature, NewSignature: env.Signature}.Open()
		if !errors.Is(err, ErrBadChain) {
			t.Fatalf("err %v", err)
		}
	})
}
