package app

import (
	"context"
	"fmt"
	"mesh-controller/contexts/inventory"
	"testing"
)

// TestCatchUp_LeavesWhatAnActDeclares: the catch-up may read the mesh just
// after an act moved every node's plan and before the act kept its
// declarations (a roll-out to ten thousand nodes takes seconds to sign and
// keep them). Declaring from that read, it must not declare the same plan
// to every node a second time: a node the act has declared meanwhile is
// left alone, and only a node still behind is declared.
func TestCatchUp_LeavesWhatAnActDeclares(t *testing.T) {
	c := plannedMesh(t, 30, 2, 5)
	ctx := context.Background()
	st, err := c.Stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for n := range 30 {
		names = append(names, fmt.Sprintf("n%d", n))
	}
	if err := st.Inventory.Apply(ctx, inventory.Change{Bump: names}, c.Now()); err != nil {
		t.Fatal(err)
	}
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nodes := snap.NodeNames
	if n := snap.Nodes[nodes[0]]; n.PlanVersion <= n.DeclaredPlanVersion {
		t.Fatalf("%s is not behind its plan: %+v", n.Name, n)
	}
	act, err := c.newDeclarer(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	act.notSent = "no broker in this test"
	// The act declares all but the last node; the catch-up read the mesh before.
	for _, p := range act.declare(ctx, snap, nodes[:len(nodes)-1]) {
		if p.Problem != "" || p.Serial != 1 {
			t.Fatalf("the act: %+v", p)
		}
	}
	out, _, err := c.catchUpFrom(ctx, nil, st, snap, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 1 || out[0].Node != nodes[len(nodes)-1] || out[0].Serial != 1 {
		t.Fatalf("the catch-up declared %+v; want only %s, serial 1", out, nodes[len(nodes)-1])
	}
	for _, name := range nodes[:len(nodes)-1] {
		d, err := st.Inventory.LatestDeclaration(ctx, name)
		if err != nil || d.Serial != 1 {
			t.Fatalf("%s: latest %+v, %v; want the act's serial 1 alone", name, d, err)
		}
	}
}
