package identity

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"os"
	"testing"
	"time"

	"mesh-controller/embedded/sqlite/sqlitetest"
)

func newStore(t *testing.T) (*Store, string) {
	db, path := sqlitetest.Open(t, "identity")
	return NewStore(db), path
}

func TestStore_SigningKey(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	if _, err := s.SigningKey(ctx); err == nil {
		t.Fatal("a fresh store has a key")
	}
	k, made, err := s.EnsureSigningKey(ctx, time.Now())
	if err != nil || !made {
		t.Fatalf("made=%v, %v", made, err)
	}
	again, made, err := s.EnsureSigningKey(ctx, time.Now())
	if err != nil || made || !bytes.Equal(again.Public, k.Public) {
		t.Fatalf("second ensure: made=%v, same=%v, %v", made, bytes.Equal(again.Public, k.Public), err)
	}
	read, err := s.SigningKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	msg := []byte("declaration")
	if !ed25519.Verify(k.Public, msg, read.Sign(msg)) {
		t.Fatal("the stored key does not sign for its public half")
	}
	if fp := k.Fingerprint(); len(fp) != 19 || fp != read.Fingerprint() {
		t.Fatalf("fingerprint %q", fp)
	}
}

func TestStore_IssueToken(t *testing.T) {
	s, path := newStore(t)
	ctx := context.Background()
	now := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	first, _, revoked, err := s.IssueToken(ctx, "web1", time.Hour, now)
	if err != nil || revoked != 0 {
		t.Fatalf("revoked=%d, %v", revoked, err)
	}
	if len(first) > 64 {
		t.Fatalf("token is %d characters, more than 64", len(first))
	}
	second, tok, revoked, err := s.IssueToken(ctx, "web1", 2*time.Hour, now.Add(time.Minute))
	if err != nil || revoked != 1 || second == first {
		t.Fatalf("revoked=%d, same=%v, %v", revoked, second == first, err)
	}
	if !tok.ExpiresAt.Equal(now.Add(time.Minute + 2*time.Hour)) {
		t.Fatalf("expires %v", tok.ExpiresAt)
	}
	ts, err := s.Tokens(ctx, "web1")
	if err != nil || len(ts) != 2 {
		t.Fatalf("got %d tokens, %v", len(ts), err)
	}
	at := now.Add(2 * time.Minute)
	if ts[0].State(at) != "usable" || ts[1].State(at) != "revoked" {
		t.Fatalf("states %s, %s", ts[0].State(at), ts[1].State(at))
	}
	if ts[0].State(now.Add(3*time.Hour)) != "expired" {
		t.Fatal("an old token is not expired")
	}
	t.Run("never stored in plaintext", func(t *testing.T) {
		s.db.Writer.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`)
		for _, f := range []string{path, path + "-wal"} {
			b, err := os.ReadFile(f)
			if err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
			for _, tok := range []string{first, second} {
				if bytes.Contains(b, []byte(tok)) || bytes.Contains(b, []byte(tok[len(tokenPrefix):])) {
					t.Fatalf("%s holds a token in plaintext", f)
				}
			}
		}
		var n int
		s.db.Reader.QueryRow(`SELECT count(*) FROM join_tokens WHERE hash = ?`, hashToken(second)).Scan(&n)
		if n != 1 {
			t.Fatal("the token's hash is not what is kept")
		}
	})
}

func TestStore_JoinRevokesEarlierHosts(t *testing.T) {
	db, _ := sqlitetest.Open(t, "identity")
	s := NewStore(db)
	ctx := context.Background()
	now := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	host := func(nkey string) Host {
		return Host{Node: "web1", HostKey: make([]byte, 32), AgeRecipient: "age1x", NKey: nkey, HostVersion: "test"}
	}
	join := func(nkey string) (int, error) {
		t.Helper()
		tok, _, _, err := s.IssueToken(ctx, "web1", time.Hour, now)
		if err != nil {
			t.Fatal(err)
		}
		now = now.Add(time.Minute)
		return s.Join(ctx, tok, host(nkey), now)
	}
	if n, err := join("UFIRST"); err != nil || n != 0 {
		t.Fatalf("first join: %d, %v", n, err)
	}
	revoked, _ := s.Revoked(ctx)
	if len(revoked) != 0 {
		t.Fatalf("revoked after the first join: %v", revoked)
	}
	if n, err := join("USECOND"); err != nil || n != 1 {
		t.Fatalf("second join: %d revoked, %v", n, err)
	}
	revoked, _ = s.Revoked(ctx)
	if _, ok := revoked["UFIRST"]; !ok || len(revoked) != 1 {
		t.Fatalf("revoked: %v", revoked)
	}
	t.Run("an nkey issued before is refused", func(t *testing.T) {
		if _, err := join("UFIRST"); !errors.Is(err, ErrNKeyUsed) {
			t.Fatalf("got %v", err)
		}
		if hs, _ := s.Hosts(ctx); len(hs) != 1 || hs[0].NKey != "USECOND" {
			t.Fatalf("hosts: %+v", hs)
		}
	})
	t.Run("a host that joined before hosts were recorded", func(t *testing.T) {
		if _, err := db.Writer.ExecContext(ctx, `INSERT INTO hosts (node, host_key, age_recipient, nkey, host_version, joined_at) VALUES ('web2', ?, 'age1x', 'UOLD', 'old', '2026-01-01T00:00:00.000Z')`, make([]byte, 32)); err != nil {
			t.Fatal(err)
		}
		tok, _, _, _ := s.IssueToken(ctx, "web2", time.Hour, now)
		h := host("UNEW")
		h.Node = "web2"
		if n, err := s.Join(ctx, tok, h, now); err != nil || n != 1 {
			t.Fatalf("join: %d, %v", n, err)
		}
		if revoked, _ := s.Revoked(ctx); revoked["UOLD"].IsZero() {
			t.Fatalf("the old host was not revoked: %v", revoked)
		}
	})
}

// A host whose answer did not reach it asks again with the same request:
// it is answered again, nothing recorded anew and no reuse counted; the
// same token with any other keys, after another machine joined as the
// node, or past AskedAgainWithin, is refused as used.
func TestStore_JoinAskedAgain(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	now := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	key := func(b byte) []byte { k := make([]byte, 32); k[0] = b; return k }
	host := Host{Node: "web1", HostKey: key(1), AgeRecipient: "age1x", NKey: "UA", HostVersion: "test"}
	tok, _, _, err := s.IssueToken(ctx, "web1", time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	ask := func(h Host, at time.Time) Joined {
		t.Helper()
		return s.JoinMany(ctx, []HostJoin{{Token: tok, Host: h, Expires: at.Add(time.Hour)}}, at)[0]
	}
	if j := ask(host, now); j.Err != nil || j.Again {
		t.Fatalf("first ask: %+v", j)
	}
	if j := ask(host, now.Add(time.Minute)); j.Err != nil || !j.Again || j.Revoked != 0 {
		t.Fatalf("asked again: %+v", j)
	}
	if n, _ := s.NodeTokenReuses(ctx, "web1"); n != 0 {
		t.Fatalf("asking again counted as a reuse: %d", n)
	}
	if revoked, _ := s.Revoked(ctx); len(revoked) != 0 {
		t.Fatalf("asking again revoked %v", revoked)
	}
	for name, h := range map[string]Host{
		"another host key":      {Node: "web1", HostKey: key(2), AgeRecipient: "age1x", NKey: "UA"},
		"another age recipient": {Node: "web1", HostKey: key(1), AgeRecipient: "age1y", NKey: "UA"},
		"another nkey":          {Node: "web1", HostKey: key(1), AgeRecipient: "age1x", NKey: "UB"},
	} {
		if j := ask(h, now.Add(time.Minute)); !errors.Is(j.Err, ErrTokenUsed) {
			t.Errorf("%s: %+v", name, j)
		}
	}
	if j := ask(host, now.Add(AskedAgainWithin+time.Second)); !errors.Is(j.Err, ErrTokenUsed) {
		t.Errorf("past AskedAgainWithin: %+v", j)
	}
	// Another machine joins as web1: the first one's request is refused.
	tok2, _, _, _ := s.IssueToken(ctx, "web1", time.Hour, now)
	other := Host{Node: "web1", HostKey: key(3), AgeRecipient: "age1z", NKey: "UC", HostVersion: "test"}
	if n, err := s.Join(ctx, tok2, other, now.Add(2*time.Minute)); err != nil || n != 1 {
		t.Fatalf("another machine's join: %d revoked, %v", n, err)
	}
	if j := ask(host, now.Add(2*time.Minute)); !errors.Is(j.Err, ErrTokenUsed) {
		t.Errorf("after another machine joined: %+v", j)
	}
}

// A batch of joins is judged one by one, in order, each exactly as Join
// judges it: a token presented twice is refused the second time, an nkey
// never admitted twice, and a refusal leaves the others standing.
func TestStore_JoinMany(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	now := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	tokens := map[string]string{}
	for _, node := range []string{"web1", "web2"} {
		tok, _, _, err := s.IssueToken(ctx, node, time.Hour, now)
		if err != nil {
			t.Fatal(err)
		}
		tokens[node] = tok
	}
	ask := func(node, token, nkey string) HostJoin {
		return HostJoin{Token: token, Host: Host{Node: node, HostKey: make([]byte, 32), AgeRecipient: "age1x", NKey: nkey, HostVersion: "test"}}
	}
	out := s.JoinMany(ctx, []HostJoin{
		ask("web1", tokens["web1"], "UA"),
		ask("web1", tokens["web1"], "UB"),
		ask("web2", tokens["web2"], "UA"),
		ask("web3", "not-a-token", "UD"),
		ask("web2", tokens["web2"], "UC"),
	}, now)
	for i, want := range []error{nil, ErrTokenUsed, ErrNKeyUsed, ErrTokenUnknown, nil} {
		if !errors.Is(out[i].Err, want) || (want == nil && out[i].Err != nil) {
			t.Errorf("join %d: got %v, want %v", i, out[i].Err, want)
		}
	}
	hs, err := s.Hosts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != 2 || hs[0].NKey != "UA" || hs[1].NKey != "UC" {
		t.Fatalf("hosts: %+v", hs)
	}
	if _, err := s.Join(ctx, tokens["web2"], ask("web2", "", "UE").Host, now); !errors.Is(err, ErrTokenUsed) {
		t.Fatalf("web2's token after the batch: %v", err)
	}
}
