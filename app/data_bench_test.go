package app

import (
	"context"
	"fmt"
	"testing"
	"time"

	"mesh-controller/contexts/inventory"
)

// dataMesh is a mesh of nodes with perNode assignments, each keeping one
// data set (reported by its host), retired on every node for one module,
// and a provider with consumers retired.
func dataMesh(b *testing.B, nodes, perNode, consumers int) *testApp {
	c := plannedMesh(b, nodes, perNode, 40)
	ctx := context.Background()
	st, err := c.stores(ctx)
	if err != nil {
		b.Fatal(err)
	}
	inv := st.Inventory
	snap, err := inv.Snapshot(ctx)
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	for _, n := range snap.NodeNames {
		var sets []inventory.DataSet
		for _, a := range snap.AssignmentsOf(n) {
			sets = append(sets, inventory.DataSet{Module: a.Module, Name: "d", Path: "/srv/" + a.Module, Bytes: 1 << 20, Precious: inventory.Costly})
		}
		if err := inv.RecordDataSets(ctx, n, sets, now); err != nil {
			b.Fatal(err)
		}
		first := snap.AssignmentsOf(n)[0]
		if err := inv.Apply(ctx, inventory.Change{Unassign: []inventory.Holder{{Node: n, Module: first.Module}},
			Retirements: []inventory.Retirement{{Node: n, Module: first.Module, DataSet: "d", Path: "/srv/" + first.Module,
				Precious: inventory.Costly, State: "retired", RetiredAt: now, Why: "bench"}}}, now); err != nil {
			b.Fatal(err)
		}
	}
	var cs []inventory.ConsumerChange
	for i := 0; i < consumers; i++ {
		cs = append(cs, inventory.ConsumerChange{Provider: inventory.Holder{Node: "n0", Module: "m0"}, Consumer: fmt.Sprintf("n%d/m1", i), Provision: "sql", State: "retired", Why: "bench"})
	}
	if err := inv.Apply(ctx, inventory.Change{Consumers: cs}, now); err != nil {
		b.Fatal(err)
	}
	return c
}

// BenchmarkDataAndCleanup lists every data set (data) and everything
// retired (cleanup), opening the stores as the commands do.
//
//	go test -run '^$' -bench DataAndCleanup ./app/
func BenchmarkDataAndCleanup(b *testing.B) {
	for _, size := range []struct{ nodes, perNode, consumers int }{{250, 4, 250}, {1000, 4, 1000}, {2500, 4, 2500}} {
		c := dataMesh(b, size.nodes, size.perNode, size.consumers)
		ctx := context.Background()
		ds, _ := c.Data(ctx)
		cls, _ := c.Cleanup(ctx)
		b.Run(fmt.Sprintf("data/%d-sets", len(ds)), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if _, err := c.Data(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("cleanup/%d-retired", len(cls)), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if _, err := c.Cleanup(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
