package app

import (
	"context"
	"fmt"
	"mesh-controller/app/daemon"
	"mesh-controller/contexts/inventory"
	"testing"
	"time"
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

// TestCatchUp_WaitsForAnActUnderWay: while a person's act is under way (its
// command alive, its time not run out) the catch-up leaves the mesh to it —
// it would otherwise make the act's broker users and secrets a second time
// and declare every node twice; once the act's time has run out, the
// catch-up declares the nodes it left behind.
func TestCatchUp_WaitsForAnActUnderWay(t *testing.T) {
	c := plannedMesh(t, 5, 1, 2)
	ctx := context.Background()
	st, err := c.Stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"n0", "n1", "n2", "n3", "n4"}
	if err := st.Inventory.Apply(ctx, inventory.Change{Bump: names}, c.Now()); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	c.Now = func() time.Time { return now }
	if _, err := st.Inventory.BeginAct(ctx, "assign", now.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	catchUp := func() []daemon.Declared {
		t.Helper()
		st, snap, err := c.storesAndSnapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out, _, err := c.catchUpFrom(ctx, nil, st, snap, false)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if out := catchUp(); len(out) != 0 {
		t.Fatalf("the catch-up declared %+v beside an act under way", out)
	}
	now = now.Add(2 * time.Minute) // the act's time ran out: its command died
	if out := catchUp(); len(out) != len(names) {
		t.Fatalf("the catch-up declared %d nodes after the act's time ran out, want %d: %+v", len(out), len(names), out)
	}
}
