package app

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"testing"
	"time"

	"mesh-controller/app/plan"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/inventory"
)

// wgKey is a stand-in WireGuard public key: 32 bytes, base64, one per name.
func wgKey(name string) string {
	sum := sha256.Sum256([]byte("wg " + name))
	return base64.StdEncoding.EncodeToString(sum[:])
}

// The planner behind the store's refusal: c1 recorded with a1's key,
// written into the store directly (as a mesh recorded before keys were
// judged may hold). Every node's plan carries an overlay part its host
// accepts whole, a1 keeps its key, c1 is in nobody's part, and the
// self-check's rule names c1 and a1.
func TestPlan_DuplicateKeyDeclaresWhatHostsAccept(t *testing.T) {
	c, st := migrated(t)
	ctx := context.Background()
	for i, n := range []string{"a1", "b1", "c1", "nat1"} {
		if _, err := c.NodeAdd(ctx, n, false); err != nil {
			t.Fatal(err)
		}
		p := Placement{Endpoint: fmt.Sprintf("203.0.113.%d:51820", i+1), Public: true}
		if n == "nat1" {
			p = Placement{Site: "home"}
		}
		if _, err := c.OverlayPlace(ctx, n, p); err != nil {
			t.Fatal(err)
		}
		if n == "c1" {
			continue
		}
		if _, err := st.Inventory.RecordFacts(ctx, n, []inventory.Fact{{Name: protocol.FactWireGuardKey, Value: wgKey(n), Why: "wg"}}, nil, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.DB("inventory").Writer.ExecContext(ctx, `INSERT INTO node_facts (node, name, value, why) VALUES ('c1', ?, ?, 'behind the check')`,
		protocol.FactWireGuardKey, wgKey("a1")); err != nil {
		t.Fatal(err)
	}
	snap, err := st.Inventory.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pl := plan.New(snap, nil)
	for _, n := range []string{"a1", "b1", "c1", "nat1"} {
		p, err := pl.Plan(n)
		if err != nil {
			t.Fatal(err)
		}
		d := p.Body.Overlay
		if err := protocol.CheckOverlay(d, wgKey(n)); err != nil {
			t.Errorf("%s's host refuses its overlay part: %v", n, err)
		}
		if n == "c1" {
			if d != nil {
				t.Errorf("c1, holding a1's key, has an overlay part: %+v", d)
			}
			continue
		}
		if d == nil || len(d.Peers) == 0 {
			t.Fatalf("%s has no peers: %+v", n, d)
		}
		for _, peer := range d.Peers {
			if peer.Node == "c1" || peer.Node == "a1" && peer.PublicKey != wgKey("a1") {
				t.Errorf("%s's peer %+v", n, peer)
			}
		}
	}
	in := &checkInputs{now: time.Now(), bounds: DefaultBounds(), declared: map[string]time.Time{}, data: map[string][]inventory.DataSet{}}
	if err := c.readInventory(ctx, st.Inventory, in); err != nil {
		t.Fatal(err)
	}
	got := ruleOf(t, "overlay.key-conflict").eval(in)
	if len(got) != 1 || got[0].Key != "overlay.key-conflict/c1" || got[0].Evidence["holder"] != "a1" {
		t.Errorf("overlay.key-conflict: %+v", got)
	}
	if got := ruleOf(t, "overlay.peer-refused").eval(in); len(got) != 0 {
		t.Errorf("overlay.peer-refused: %+v", got)
	}
}
