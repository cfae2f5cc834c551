package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"mesh-controller/app/nftables"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/inventory"
)

// A node's public domain and networks reach its real host in its
// declaration, signed, and the host applies it; a change made while no
// controller serves, whose command stopped before declaring (only the
// plan moved), is declared by the catch-up.
func TestMesh_RoutingDeclared(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	m.join("web1")
	ctx := context.Background()
	id, err := m.c.IdentityShow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	key, err := base64.StdEncoding.DecodeString(id.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	nc := m.controllerConn(t)
	sub, err := nc.SubscribeSync(protocol.DeclarationInbox("web1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil { // the broker has the subscription before anything is sent
		t.Fatal(err)
	}
	checkFor(t, settle, m.heard("web1"))

	if _, err := m.c.SetPublicDomain(ctx, "web1", "example.org"); err != nil {
		t.Fatal(err)
	}
	v, err := m.c.SetNetworks(ctx, "web1", []string{"2001:db8::/48", "10.20.0.0/16"})
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Pushed) != 1 || !v.Pushed[0].Sent {
		t.Fatalf("networks set, pushed: %+v", v.Pushed)
	}
	serial := v.Pushed[0].Serial
	var got protocol.Declaration
	for got.Serial != serial {
		msg, err := sub.NextMsg(15 * time.Second)
		if err != nil {
			t.Fatalf("no declaration %d on web1's inbox: %v", serial, err)
		}
		var e protocol.Envelope
		if err := json.Unmarshal(msg.Data, &e); err != nil {
			t.Fatal(err)
		}
		if got, err = e.Verify(key); err != nil {
			t.Fatal(err)
		}
	}
	if got.PublicDomain != "example.org" || !slices.Equal(got.Networks, []string{"10.20.0.0/16", "2001:db8::/48"}) {
		t.Fatalf("declaration %d: public domain %q, networks %v", serial, got.PublicDomain, got.Networks)
	}
	checkFor(t, settle, m.appliedFrom("web1", serial))

	// The command's first write alone, as if it stopped there: the catch-up
	// of a controller that starts declares it.
	m.stop()
	st, err := m.c.Stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if changed, err := st.Inventory.SetPublicDomain(ctx, "web1", "mesh.example.net"); err != nil || !changed {
		t.Fatalf("set: %v, %v", changed, err)
	}
	if !m.node("web1").Behind {
		t.Fatal("web1 is not behind its plan after its domain changed")
	}
	m.start()
	checkFor(t, settle, allOf(m.appliedFrom("web1", serial+1), m.notBehind("web1")))
	d, err := st.Inventory.LatestDeclaration(ctx, "web1")
	if err != nil || d == nil {
		t.Fatalf("latest declaration: %v, %v", d, err)
	}
	if !strings.Contains(d.Body, `"public_domain":"mesh.example.net"`) || !strings.Contains(d.Body, `"networks":["10.20.0.0/16","2001:db8::/48"]`) {
		t.Fatalf("the catch-up's declaration: %s", d.Body)
	}

	// Cleared, the fields leave the declaration.
	if _, err := m.c.SetPublicDomain(ctx, "web1", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := m.c.SetNetworks(ctx, "web1", nil); err != nil {
		t.Fatal(err)
	}
	if d, err = st.Inventory.LatestDeclaration(ctx, "web1"); err != nil || strings.Contains(d.Body, "public_domain") || strings.Contains(d.Body, "networks") {
		t.Fatalf("declared after clearing: %v, %v", d, err)
	}
}

// Refusals come before any store is written: nothing changes, nothing is
// declared.
func TestRouting_Refused(t *testing.T) {
	t.Parallel()
	c, st := migrated(t)
	ctx := context.Background()
	if _, err := c.NodeAdd(ctx, "gw1", true); err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		domain string
		want   error
	}{{"Example.org", protocol.ErrBadDomain}, {"org", protocol.ErrBadDomain}, {"a..org", protocol.ErrBadDomain}} {
		if _, err := c.SetPublicDomain(ctx, "gw1", r.domain); !errors.Is(err, r.want) {
			t.Errorf("domain %q: %v, want %v", r.domain, err, r.want)
		}
	}
	for _, r := range []struct {
		nets []string
		want error
	}{
		{[]string{"10.0.0.1/8"}, protocol.ErrBadNetwork},
		{[]string{"nonsense"}, protocol.ErrBadNetwork},
		{[]string{"10.0.0.0/8", "10.3.0.0/16"}, protocol.ErrNetworksOverlap},
		{[]string{"100.64.1.0/24"}, protocol.ErrOverlapsOverlay},
		{[]string{"fd00:1::/32"}, protocol.ErrOverlapsOverlay},
		{manyNetworks(protocol.MaxNetworks + 1), protocol.ErrTooManyNetworks},
	} {
		if _, err := c.SetNetworks(ctx, "gw1", r.nets); !errors.Is(err, r.want) {
			t.Errorf("networks %v: %v, want %v", r.nets, err, r.want)
		}
	}
	if _, err := c.SetNetworks(ctx, "gw9", []string{"10.0.0.0/8"}); !errors.Is(err, inventory.ErrNodeNotFound) {
		t.Errorf("unknown node: %v", err)
	}
	if _, err := c.SetNetworks(ctx, "gw1", manyNetworks(protocol.MaxNetworks)); err != nil {
		t.Errorf("%d networks: %v", protocol.MaxNetworks, err)
	}
	if d, err := st.Inventory.LatestDeclaration(ctx, "gw1"); err != nil || d == nil || d.Serial != 1 {
		t.Fatalf("only the one accepted change is declared: %+v, %v", d, err)
	}
}

// manyNetworks is n distinct /24 networks.
func manyNetworks(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.1.%d.0/24", i)
	}
	return out
}

// FilterFor renders the filter from the node's plan: its modules' ports by
// their exposure, its domain and networks, and the SSH port by default.
func TestFilterFor(t *testing.T) {
	t.Parallel()
	c, _ := migrated(t)
	ctx := context.Background()
	if _, err := c.NodeAdd(ctx, "web1", true); err != nil {
		t.Fatal(err)
	}
	site := writeManifest(t, `{"module": "site", "version": "1.0.0", "ports": [
		{"name": "https", "port": 8443, "expose": "public"},
		{"name": "admin", "port": 8444, "expose": "local"},
		{"name": "metrics", "port": 9100, "expose": "overlay"}]}`)
	if _, err := c.ModuleAdd(ctx, site, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Assign(ctx, "web1", []string{"site"}); err != nil {
		t.Fatal(err)
	}
	in, rules, err := c.FilterFor(ctx, "web1", false)
	if err != nil {
		t.Fatal(err)
	}
	if in.SSHPort != 0 || in.PublicDomain != "" || len(in.Ports) != 3 || len(in.Overlay) != 0 {
		t.Fatalf("input: %+v", in)
	}
	for _, w := range []string{`tcp dport 22 accept`, "# site/https (tcp 8443): public, closed: the node has no public domain",
		"# site/metrics (tcp 9100): overlay, closed: the node has no overlay yet", "# site/admin (tcp 8444): local, from loopback only"} {
		if !strings.Contains(rules, w) {
			t.Errorf("no %q in\n%s", w, rules)
		}
	}
	if _, err := c.SetPublicDomain(ctx, "web1", "example.org"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetNetworks(ctx, "web1", []string{"10.20.0.0/16"}); err != nil {
		t.Fatal(err)
	}
	in, rules, err = c.FilterFor(ctx, "web1", true)
	if err != nil {
		t.Fatal(err)
	}
	if rules != nftables.Render(in) {
		t.Fatal("the ruleset is not the input's rendering")
	}
	for _, w := range []string{`tcp dport 8443 accept comment "site/https"`, `ip daddr { 10.20.0.0/16 } accept`, "# ssh (tcp 22): closed, as a person asked"} {
		if !strings.Contains(rules, w) {
			t.Errorf("no %q in\n%s", w, rules)
		}
	}
	if _, _, err := c.FilterFor(ctx, "web9", false); !errors.Is(err, inventory.ErrNodeNotFound) {
		t.Errorf("unknown node: %v", err)
	}
}
