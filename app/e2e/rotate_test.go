package e2e

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"mesh-controller/app"
	"mesh-controller/app/protocol"
)

// acknowledged is a check that identity show names exactly notYet (by
// node) as not verifying with the current key.
func (m *testMesh) acknowledged(notYet ...string) func() error {
	return func() error {
		v, err := m.c.IdentityShow(context.Background())
		if err != nil {
			return err
		}
		var names []string
		for _, n := range v.NotAcknowledged {
			names = append(names, n.Node)
		}
		if !slices.Equal(names, notYet) {
			return fmt.Errorf("not acknowledging %s: %+v, not %q", v.Fingerprint, v.NotAcknowledged, notYet)
		}
		return nil
	}
}

// The signing key rotated while one host of three is away: the two online
// follow the announcement and apply declarations signed by the new key;
// once the overlap ends the old key is retired (its private half gone,
// refused by the hosts that heard the rotation) and the host still on it is
// named by a condition; back, that host follows the chain and applies its
// latest declaration. A host handed a forged chain refuses it and says so.
func TestRotate_OneHostOfThreeAway(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := newTestMesh(t)
	m.join("r1")
	m.join("r2")
	r3 := m.join("r3")
	st, err := m.c.Stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	first, err := st.Identity.SigningKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	checkFor(t, settle, m.acknowledged())
	r3.stop()

	const overlap = 3 * time.Second
	rot, err := m.c.IdentityRotate(ctx, app.RotateRequest{Why: "yearly", Overlap: overlap})
	if err != nil {
		t.Fatal(err)
	}
	if !rot.Announced || rot.Old.Fingerprint != first.Fingerprint() || rot.New.Fingerprint == rot.Old.Fingerprint {
		t.Fatalf("rotation %+v", rot)
	}
	if _, err := m.c.IdentityRotate(ctx, app.RotateRequest{Why: "again", Overlap: overlap}); err == nil || !strings.Contains(err.Error(), "overlap has not ended") {
		t.Fatalf("a second rotation within the overlap: %v", err)
	}
	// The two online acknowledge at once; r3, away, is named.
	checkFor(t, settle, m.acknowledged("r3"))
	v, err := m.c.IdentityShow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v.Previous == nil || v.Previous.Fingerprint != first.Fingerprint() || v.Chain != 2 || v.NotAcknowledged[0].Key != first.Fingerprint() {
		t.Fatalf("identity show after the rotation: %+v", v)
	}
	status, err := m.c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(status.OutOfDate, func(o app.OutOfDate) bool {
		return o.Name == "r3" && strings.Contains(o.Why, "verifies with signing key "+first.Fingerprint())
	}) {
		t.Fatalf("status does not say r3 is on the old key: %+v", status.OutOfDate)
	}

	// Declarations from now on are signed by the new key, and applied.
	for _, node := range []string{"r1", "r2", "r3"} {
		m.declare(node, moduleBody("one", "/srv/one"))
	}
	checkFor(t, settle, allOf(m.upToDate("r1"), m.upToDate("r2")))
	for _, node := range []string{"r1", "r3"} {
		if d, err := st.Inventory.LatestDeclaration(ctx, node); err != nil || d.Key != rot.New.Fingerprint {
			t.Fatalf("%s's latest declaration is signed by %q, not the new key (%v)", node, d.Key, err)
		}
	}

	// The overlap ends: the self-check retires the old key.
	time.Sleep(time.Until(rot.OverlapUntil))
	if !m.openAfterCheck(t, "node.retired-key/r3") {
		t.Fatalf("node.retired-key/r3 is not open; open: %q", m.openKeys(t))
	}
	var keys int
	if err := st.DB("identity").Reader.QueryRow(`SELECT count(*) FROM signing_keys`).Scan(&keys); err != nil || keys != 1 {
		t.Fatalf("%d signing keys kept after retirement (%v), not the current one alone", keys, err)
	}
	if v, _ := m.c.IdentityShow(ctx); v.Previous != nil || v.NotAcknowledged[0].Node != "r3" || !v.NotAcknowledged[0].Retired {
		t.Fatalf("identity show after retirement: %+v", v)
	}

	nc, err := m.c.DialBroker(ctx, st.Identity)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	lastError := func(node string) func() string {
		return func() string {
			if a := m.node(node).LastApply; a != nil && !a.OK {
				return a.Error
			}
			return ""
		}
	}
	t.Run("the retired key is refused by a host that heard the rotation", func(t *testing.T) {
		applied := m.node("r1").SerialApplied
		env, err := protocol.SealBody(map[string]any{"node": "r1", "serial": applied + 10, "issued_at": time.Now(), "modules": []any{}},
			first.Sign, first.Fingerprint())
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(env)
		nc.Publish(protocol.DeclarationInbox("r1"), b)
		checkFor(t, settle, saysFunc(lastError("r1"), "retired controller key "+first.Fingerprint()))
		if m.node("r1").SerialApplied != applied {
			t.Fatal("a declaration signed by the retired key was applied")
		}
	})

	t.Run("a forged chain is refused and reported", func(t *testing.T) {
		_, forger, _ := ed25519.GenerateKey(nil)
		forged, err := protocol.NewKeyLink(protocol.KeyAnnouncement{Sequence: 2, OldKey: rot.New.PublicKey,
			NewKey: base64.StdEncoding.EncodeToString(forger.Public().(ed25519.PublicKey)), At: time.Now(), OverlapUntil: time.Now().Add(time.Hour)},
			func(b []byte) []byte { return ed25519.Sign(forger, b) }, func(b []byte) []byte { return ed25519.Sign(forger, b) })
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(protocol.KeyNotice{Links: []protocol.KeyLink{forged}})
		nc.Publish(protocol.NodeSubject("r2", protocol.KeyInbox), b)
		checkFor(t, settle, func() error {
			acks, err := st.Identity.KeyAcks(ctx)
			if err != nil {
				return err
			}
			for _, a := range acks {
				if a.Node == "r2" && a.RefusedAt != nil && strings.Contains(a.Refused, "not signed by its old key") {
					return nil
				}
			}
			return fmt.Errorf("r2 has not reported the forged chain refused: %+v", acks)
		})
		if !m.openAfterCheck(t, "node.key-refused/r2") {
			t.Fatalf("node.key-refused/r2 is not open; open: %q", m.openKeys(t))
		}
		if err := m.acknowledged("r3")(); err != nil {
			t.Fatalf("r2 took the forged key on: %v", err)
		}
	})

	// r3 comes back: its latest declaration is signed by a key it does not
	// know; it follows the chain (signed link by link) and applies it.
	r3.start()
	checkFor(t, settle, allOf(m.upToDate("r3"), m.acknowledged()))
	if m.openAfterCheck(t, "node.retired-key/r3") {
		t.Fatal("node.retired-key/r3 is still open")
	}
	b, err := os.ReadFile(filepath.Join(r3.state.Dir, "controller-keys.json"))
	if err != nil || !strings.Contains(string(b), rot.New.PublicKey) {
		t.Fatalf("r3 keeps no new key in its state dir: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(r3.state.Dir, "controller-keys.json")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("controller-keys.json: %v %v", fi.Mode(), err)
	}
	if !strings.Contains(m.logs.String(), "signing key rotated: announced to every host") {
		t.Fatal("the serving controller did not say it announced the key")
	}
}

// saysFunc is a check that what says holds s.
func saysFunc(what func() string, s string) func() error {
	return func() error {
		if got := what(); !strings.Contains(got, s) {
			return fmt.Errorf("%q does not say %q", got, s)
		}
		return nil
	}
}

// A host's credential expires and its host renews it before then, on its
// own connection and token-free, and goes on being heard; the credential
// it replaced is refused by the broker once expired. A host away past its
// credential's expiry renews through the join path when it is back. The
// store keeps a node's last users only.
func TestRenew_HostCredentials(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := newTestMesh(t)
	m.stop()
	const ttl = 6 * time.Second
	m.opts.HostCredentials = ttl
	m.start()
	h, away := m.join("c1"), m.join("c2")
	first := h.state.Creds
	checkFor(t, settle, m.beating("c2"))
	firstJWT, err := jwt.ParseDecoratedJWT([]byte(first))
	if err != nil {
		t.Fatal(err)
	}
	uc, err := jwt.DecodeUserClaims(firstJWT)
	if err != nil || uc.Expires == 0 || time.Unix(uc.Expires, 0).Sub(time.Unix(uc.IssuedAt, 0)) != ttl {
		t.Fatalf("the join's credential expires at %d (issued %d), not %s after (%v)", uc.Expires, uc.IssuedAt, ttl, err)
	}
	away.stop()

	credsFile := filepath.Join(h.state.Dir, "nats.creds")
	renewed := func() error {
		b, err := os.ReadFile(credsFile)
		if err != nil || string(b) == first {
			return fmt.Errorf("c1's credential is not renewed yet (%v)", err)
		}
		return nil
	}
	checkFor(t, settle, renewed)
	// Heard and applying on its new user.
	beats := m.node("c1").LastHeard
	m.declare("c1", moduleBody("one", "/srv/one"))
	checkFor(t, settle, allOf(m.upToDate("c1"), func() error {
		if n := m.node("c1"); n.LastHeard == nil || !n.LastHeard.After(*beats) {
			return errors.New("c1 has not beaten since it renewed")
		}
		return nil
	}))

	// The credential it replaced dies at its expiry.
	time.Sleep(time.Until(time.Unix(uc.Expires, 0).Add(time.Second)))
	seed, err := jwt.ParseDecoratedNKey([]byte(first))
	if err != nil {
		t.Fatal(err)
	}
	s, _ := seed.Seed()
	if nc, err := nats.Connect(m.url, nats.UserJWTAndSeed(firstJWT, string(s)), nats.NoReconnect()); err == nil {
		nc.Close()
		t.Fatal("the expired credential still connects")
	}
	users, err := m.c.St.Identity.HostUsers(ctx, "c1")
	if err != nil || len(users) > 3 {
		t.Fatalf("c1 has %d host users recorded (%v): the superseded are not forgotten", len(users), err)
	}

	t.Run("a renewal through the join path not signed by the node's host key is refused", func(t *testing.T) {
		nc, _ := m.anonymous(t)
		_, other, _ := ed25519.GenerateKey(nil)
		body, _ := protocol.Sign(other, protocol.RenewBody{Node: "c2", NKey: "UNOTUSED", At: time.Now().UTC()})
		req, _ := json.Marshal(protocol.JoinRequest{Node: "c2", NKey: "UNOTUSED", Renew: body})
		msg, err := nc.Request(protocol.JoinSubject, req, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var reply protocol.JoinReply
		if err := json.Unmarshal(msg.Data, &reply); err != nil || reply.OK || reply.Error != protocol.JoinRefused || reply.Sealed != "" {
			t.Fatalf("answer %+v (%v)", reply, err)
		}
		if !m.logs.logged("renewal refused", "node", "c2", "reason", "renewal not signed by the host key") {
			t.Fatalf("the refusal is not logged:\n%s", lastLines(m.logs.String(), 5))
		}
	})

	// c2 was away past its credential's expiry: back, it renews through
	// the join path (no token) and is heard again.
	heard := m.node("c2").LastHeard
	away.start()
	checkFor(t, settle, func() error {
		if n := m.node("c2"); n.LastHeard == nil || heard == nil || !n.LastHeard.After(*heard) {
			return errors.New("c2 has not been heard since it came back")
		}
		return nil
	})
	if !m.logs.logged("host credential renewed through the join path (it had expired)", "node", "c2") {
		t.Fatalf("c2 was not renewed through the join path:\n%s", lastLines(m.logs.String(), 20))
	}
}
