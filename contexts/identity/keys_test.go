package identity

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"testing"
	"time"
)

// announceFake signs what a test can check: the old key and the new one
// each sign the sequence's text.
func announceFake(seq int64, old, next SigningKey, at, until time.Time) (string, string, string, error) {
	msg := []byte(at.Format(time.RFC3339) + " " + until.Format(time.RFC3339))
	return string(msg), base64.StdEncoding.EncodeToString(old.Sign(msg)), base64.StdEncoding.EncodeToString(next.Sign(msg)), nil
}

func TestStore_Rotate(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	now := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	first, _, err := s.EnsureSigningKey(ctx, now)
	if err != nil {
		t.Fatal(err)
	}
	link, err := s.Rotate(ctx, 24*time.Hour, "yearly", announceFake, now)
	if err != nil {
		t.Fatal(err)
	}
	cur, err := s.SigningKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if link.Sequence != 1 || !link.OldKey.Equal(first.Public) || !link.NewKey.Equal(cur.Public) || cur.Public.Equal(first.Public) {
		t.Fatalf("link %d from the first key %v to the current one %v", link.Sequence, link.OldKey.Equal(first.Public), link.NewKey.Equal(cur.Public))
	}
	oldSig, _ := base64.StdEncoding.DecodeString(link.OldSignature)
	newSig, _ := base64.StdEncoding.DecodeString(link.NewSignature)
	if !ed25519.Verify(first.Public, []byte(link.Announcement), oldSig) || !ed25519.Verify(cur.Public, []byte(link.Announcement), newSig) {
		t.Fatal("the announcement is not signed by both keys")
	}

	t.Run("refused while the overlap runs", func(t *testing.T) {
		_, err := s.Rotate(ctx, time.Hour, "again", announceFake, now.Add(time.Hour))
		if !errors.Is(err, ErrOverlapRunning) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("retired once the overlap ended, the old private half deleted", func(t *testing.T) {
		if got, err := s.RetireKeys(ctx, now.Add(time.Hour)); err != nil || len(got) != 0 {
			t.Fatalf("retired %d before the overlap ended, %v", len(got), err)
		}
		var keys int
		s.db.Reader.QueryRow(`SELECT count(*) FROM signing_keys`).Scan(&keys)
		if keys != 2 {
			t.Fatalf("%d signing keys kept during the overlap, not 2", keys)
		}
		got, err := s.RetireKeys(ctx, now.Add(24*time.Hour))
		if err != nil || len(got) != 1 || got[0].Sequence != 1 {
			t.Fatalf("retired %+v, %v", got, err)
		}
		s.db.Reader.QueryRow(`SELECT count(*) FROM signing_keys`).Scan(&keys)
		if keys != 1 {
			t.Fatalf("%d signing keys kept after retirement, not 1", keys)
		}
		if k, err := s.SigningKey(ctx); err != nil || !k.Public.Equal(cur.Public) {
			t.Fatalf("the current key changed by retirement: %v", err)
		}
		chain, err := s.KeyChain(ctx)
		if err != nil || len(chain) != 1 || chain[0].RetiredAt == nil || !chain[0].OldKey.Equal(first.Public) {
			t.Fatalf("chain %+v, %v", chain, err)
		}
	})
	t.Run("a second rotation chains on", func(t *testing.T) {
		link, err := s.Rotate(ctx, 0, "at once", announceFake, now.Add(48*time.Hour))
		if err != nil || link.Sequence != 2 || !link.OldKey.Equal(cur.Public) {
			t.Fatalf("link %+v, %v", link, err)
		}
		// An overlap of nothing ends at once: the next rotation may follow.
		if _, err := s.Rotate(ctx, time.Hour, "again", announceFake, now.Add(48*time.Hour)); err != nil {
			t.Fatal(err)
		}
	})
}

func TestStore_KeyAcks(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	now := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	if err := s.RecordKeyAcks(ctx, map[string]string{"web1": "aaaa", "web2": "bbbb"}, now); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordKeyRefusal(ctx, "web2", "bbbb", "link 2 is not signed by its old key", now.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordKeyAcks(ctx, map[string]string{"web1": "bbbb"}, now.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	acks, err := s.KeyAcks(ctx)
	if err != nil || len(acks) != 2 || acks[0].Key != "bbbb" || acks[1].RefusedAt == nil || acks[1].Refused == "" {
		t.Fatalf("acks %+v, %v", acks, err)
	}
	behind, err := s.KeyAcksOtherThan(ctx, "bbbb")
	if err != nil || len(behind) != 0 {
		t.Fatalf("behind %+v, %v", behind, err)
	}
	if _, err := s.ForgetNodes(ctx, []string{"web2"}, now); err != nil {
		t.Fatal(err)
	}
	if acks, _ := s.KeyAcks(ctx); len(acks) != 1 {
		t.Fatalf("a forgotten node's acknowledgement kept: %+v", acks)
	}
}

func TestStore_RenewHost(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	now := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	token, _, _, err := s.IssueToken(ctx, "web1", time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	pub := make(ed25519.PublicKey, ed25519.PublicKeySize)
	ttl := 30 * 24 * time.Hour
	out := s.JoinMany(ctx, []HostJoin{{Token: token, Host: Host{Node: "web1", HostKey: pub, AgeRecipient: "age1x", NKey: "U0"}, Expires: now.Add(ttl)}}, now)
	if out[0].Err != nil {
		t.Fatal(out[0].Err)
	}
	// Renewed every 20 days: the user before the last stays until it
	// expires, then is forgotten.
	at := now
	for i, nkey := range []string{"U1", "U2", "U3"} {
		at = at.Add(20 * 24 * time.Hour)
		h, revoked, err := s.RenewHost(ctx, "web1", nkey, at.Add(ttl), at)
		if err != nil || h.NKey != nkey || h.AgeRecipient != "age1x" || revoked != 0 {
			t.Fatalf("renewal %d: %+v, %v", i, h, err)
		}
	}
	users, err := s.HostUsers(ctx, "web1")
	if err != nil || len(users) != 2 || users[0] != "U2" || users[1] != "U3" {
		t.Fatalf("host users %q, %v", users, err)
	}
	if _, _, err := s.RenewHost(ctx, "web1", "U3", at.Add(ttl), at); !errors.Is(err, ErrNKeyUsed) {
		t.Fatalf("an nkey used again: %v", err)
	}
	if _, _, err := s.RenewHost(ctx, "web9", "U9", at.Add(ttl), at); !errors.Is(err, ErrHostUnknown) {
		t.Fatalf("an unknown node: %v", err)
	}
	hosts, _ := s.Hosts(ctx)
	if len(hosts) != 1 || hosts[0].NKey != "U3" {
		t.Fatalf("hosts %+v", hosts)
	}

	t.Run("a user from before expiry is revoked once superseded twice", func(t *testing.T) {
		token, _, _, err := s.IssueToken(ctx, "web2", time.Hour, now)
		if err != nil {
			t.Fatal(err)
		}
		if out := s.JoinMany(ctx, []HostJoin{{Token: token, Host: Host{Node: "web2", HostKey: pub, AgeRecipient: "age1x", NKey: "L0"}}}, now); out[0].Err != nil {
			t.Fatal(out[0].Err)
		}
		if _, revoked, err := s.RenewHost(ctx, "web2", "L1", now.Add(ttl), now); err != nil || revoked != 0 {
			t.Fatalf("first renewal revoked %d, %v", revoked, err)
		}
		if _, revoked, err := s.RenewHost(ctx, "web2", "L2", now.Add(ttl), now); err != nil || revoked != 1 {
			t.Fatalf("second renewal revoked %d, %v", revoked, err)
		}
		if r, _ := s.Revoked(ctx); r["L0"].IsZero() {
			t.Fatalf("the user from before expiry is not revoked: %v", r)
		}
	})
}
