package identity

import (
	"context"
	"testing"
	"time"
)

func TestStore_RevokeNodeUsers(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	now := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	for _, node := range []string{"web1", "web2"} {
		tok, _, _, err := s.IssueToken(ctx, node, time.Hour, now)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Join(ctx, tok, Host{Node: node, HostKey: make([]byte, 32), AgeRecipient: "age1x", NKey: "U" + node, HostVersion: "test"}, now); err != nil {
			t.Fatal(err)
		}
	}
	for _, u := range []IssuedUser{{Pub: "Mweb1", Kind: "module", Node: "web1", Module: "paperless"}, {Pub: "Mweb2", Kind: "module", Node: "web2", Module: "paperless"}} {
		if err := s.RecordIssuedUser(ctx, u, now); err != nil {
			t.Fatal(err)
		}
	}

	// web1's host user was never recorded as issued: it is, and revoked with its module's.
	n, err := s.RevokeNodeUsers(ctx, "web1", now.Add(time.Minute))
	if err != nil || n != 2 {
		t.Fatalf("revoked %d, %v; want web1's host and module users", n, err)
	}
	revoked, err := s.Revoked(ctx)
	if err != nil || len(revoked) != 2 || revoked["Uweb1"].IsZero() || revoked["Mweb1"].IsZero() {
		t.Fatalf("revoked: %v, %v", revoked, err)
	}
	if n, err := s.RevokeNodeUsers(ctx, "web1", now.Add(2*time.Minute)); err != nil || n != 0 {
		t.Fatalf("revoking again revoked %d, %v", n, err)
	}
	if revoked, _ = s.Revoked(ctx); !revoked["Uweb1"].Equal(now.Add(time.Minute)) {
		t.Fatalf("revoking again moved the time: %v", revoked)
	}

	t.Run("forget nodes", func(t *testing.T) {
		f, err := s.ForgetNodes(ctx, []string{"web2", "web9"}, now.Add(time.Hour))
		if err != nil || f != (NodesForgotten{Revoked: 2, Hosts: 1, Tokens: 1}) {
			t.Fatalf("forget: %+v, %v", f, err)
		}
		hosts, _ := s.Hosts(ctx)
		if len(hosts) != 1 || hosts[0].Node != "web1" {
			t.Fatalf("hosts left: %+v", hosts)
		}
		if ts, _ := s.Tokens(ctx, "web2"); len(ts) != 0 {
			t.Fatalf("tokens left: %+v", ts)
		}
		// The revocations stay: they are what the broker is told.
		if revoked, _ := s.Revoked(ctx); len(revoked) != 4 {
			t.Fatalf("revoked: %v", revoked)
		}
	})
}
