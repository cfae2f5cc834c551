package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"mesh-controller/app/host/roottest"
	"mesh-controller/app/protocol"
)

// Issue 11 items 4 and 5, end to end: the real daemon and a real host. A
// hostile declaration signed with the controller's own key, and a link
// planted in the host's root before a legitimate declaration, are refused
// and reported, and nothing outside the host's root changes.
func TestMesh_HostStaysBeneathItsRoot(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	h := m.join("web1")
	m.declare("web1", moduleBody("paperless", "/var/lib/paperless/media"))
	checkFor(t, settle, m.applied("web1", 1))

	// Beside the root (and the host's state dir) lies what an escape would
	// reach: a file, and a directory shaped like a provider's consumers.
	base := filepath.Dir(h.root)
	outside := filepath.Join(base, "outside")
	for rel, content := range map[string]string{"file": "untouched", "victim/consumers/web2_wiki/keep": "not the host's"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(outside, rel)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(outside, rel), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	lastError := func() string {
		if n := m.node("web1"); n.LastApply != nil && !n.LastApply.OK {
			return n.LastApply.Error
		}
		return ""
	}

	t.Run("a hostile declaration signed with the controller key", func(t *testing.T) {
		before := roottest.Tree(t, base)
		// A secret whose name climbs from etc/mesh/modules/paperless/secrets/
		// out of the root, sealed to this host so it would open, and a
		// deletion whose module name climbs to the outside consumers. It is
		// published directly, as a controller with a bug would, under a
		// serial the controller never made, so that no later declaration is
		// taken for a replay of it.
		name := "../../../../../../outside/pwned"
		sealed, err := protocol.SealSecret(protocol.NewSecret([]byte("s3cret")), protocol.Label{Node: "web1", Module: "paperless", Name: name, Version: 1},
			h.state.Age.Recipient())
		if err != nil {
			t.Fatal(err)
		}
		body := map[string]any{"node": "web1", "serial": 99, "issued_at": time.Now().UTC().Format(time.RFC3339), "mode": "adopted",
			"modules": []any{map[string]any{"module": "paperless", "version": "1.0.0",
				"secrets": []any{map[string]any{"name": name, "version": 1, "sealed": sealed}}}},
			"delete": []any{map[string]any{"module": "../../../../outside/victim", "kind": "consumer", "target": "web2/wiki"}}}
		m.declareSigned(t, body)
		checkFor(t, settle, m.answered("web1", 99))
		roottest.Unchanged(t, "", before, roottest.Tree(t, base))
		if e := lastError(); !strings.HasPrefix(e, "refused: ") || !strings.Contains(e, "modules[0].secrets[0].name") || !strings.Contains(e, "delete[0].module") {
			t.Fatalf("want a refusal naming the secret and the deletion, got %q", e)
		}
		if n := m.node("web1"); n.SerialApplied != 1 {
			t.Fatalf("the hostile declaration moved the applied serial to %d", n.SerialApplied)
		}
	})

	t.Run("a link planted before a legitimate declaration", func(t *testing.T) {
		if err := os.MkdirAll(filepath.Join(h.root, "etc/mesh/modules"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(outside, "victim"), filepath.Join(h.root, "etc/mesh/modules/wiki")); err != nil {
			t.Fatal(err)
		}
		before := roottest.Tree(t, base)
		d := m.declare("web1", moduleBody("wiki", "/var/lib/wiki"))
		checkFor(t, settle, m.answered("web1", d.Serial))
		roottest.Unchanged(t, "", before, roottest.Tree(t, base))
		if e := lastError(); !strings.HasPrefix(e, "refused: etc/mesh/modules/wiki is a symbolic link") {
			t.Fatalf("want a refusal naming the link, got %q", e)
		}
	})
}

// declareSigned signs body with the controller's key, canonicalised as a
// declaration is, and publishes it on the inbox of the node it names, as
// a controller with a bug would: what its host refuses is tested.
func (m *testMesh) declareSigned(t *testing.T, body map[string]any) {
	t.Helper()
	ctx := context.Background()
	st, err := m.c.Stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	key, err := st.Identity.SigningKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	env, err := protocol.SealBody(body, key.Sign, key.Fingerprint())
	if err != nil {
		t.Fatal(err)
	}
	nc, err := m.c.DialBroker(ctx, st.Identity)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	b, _ := json.Marshal(env)
	if err := nc.Publish(protocol.DeclarationInbox(body["node"].(string)), b); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// answered is a check that node has reported applying or refusing
// declaration serial; it says what it reported last.
func (m *testMesh) answered(node string, serial int64) func() error {
	return func() error {
		if a := m.node(node).LastApply; a == nil || a.Serial != serial {
			return fmt.Errorf("%s has not reported on declaration %d; its last report: %s", node, serial, jsonText(a))
		}
		return nil
	}
}
