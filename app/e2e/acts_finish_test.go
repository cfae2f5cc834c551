package e2e

import (
	"context"
	"slices"
	"testing"

	"mesh-controller/app"
	"mesh-controller/app/daemon"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/inventory"
)

// An act killed after its commit point leaves the other stores holding
// what the inventory no longer has; serve's catch-up finishes it
// (finishActs): the licence a module held that is no longer assigned is
// forgotten, and the broker users and host keys of a node no longer in the
// inventory are revoked and dropped. Here the kills are stood in for by
// writing the inventory's part alone, as the act's first step would.
func TestActs_CatchUpFinishesWhatAKilledActLeft(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	m.join("web1")
	m.join("web2")
	m.addModule(writeManifest(t, translatorManifest))
	ctx := context.Background()
	if _, err := m.c.Assign(ctx, "web1", []string{"translator"}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.c.LicenceAdd(ctx, app.LicenceAddRequest{Name: "translation", Provider: "deepl", Expires: "720h", Token: protocol.NewSecret([]byte("a licence"))}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.c.LicenceUse(ctx, app.LicenceUseRequest{Name: "translation", Holder: "web1/translator", KeyFile: m.operatorKeyFile(t)}); err != nil {
		t.Fatal(err)
	}
	st, err := m.c.Stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// unassign's commit, and node remove's, with nothing after them.
	if err := st.Inventory.Apply(ctx, inventory.Change{Unassign: []inventory.Holder{{Node: "web1", Module: "translator"}}, Bump: []string{"web1"}}, m.c.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Inventory.RemoveNodes(ctx, []string{"web2"}, nil, 0, m.c.Now()); err != nil {
		t.Fatal(err)
	}
	held := func() []string {
		hs, err := st.Licences.AllHolders(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, h := range hs {
			out = append(out, h.String())
		}
		return out
	}
	known := func() []string {
		ns, err := st.Identity.KnownNodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ns
	}
	if h, k := held(), known(); !slices.Contains(h, "web1/translator") || !slices.Contains(k, "web2") {
		t.Fatalf("before the catch-up: licence holders %v, nodes the identity store knows %v", h, k)
	}
	// The catch-up that finishes acts (at start, and once a minute) finishes both.
	if _, _, err := m.c.CatchUp(ctx, nil, daemon.CatchUpAsk{Thorough: true, Finish: true}); err != nil {
		t.Fatal(err)
	}
	if h := held(); len(h) != 0 {
		t.Errorf("after the catch-up, licences are still held by %v", h)
	}
	if k := known(); slices.Contains(k, "web2") || !slices.Contains(k, "web1") {
		t.Errorf("after the catch-up, the identity store knows %v", k)
	}
	revoked, err := st.Identity.Revoked(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(revoked) == 0 {
		t.Error("no broker user was revoked for the removed node")
	}
}
