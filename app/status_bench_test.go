package app

import (
	"context"
	"fmt"
	"testing"
	"time"

	"mesh-controller/contexts/health"
	"mesh-controller/contexts/inventory"
)

// BenchmarkStatus answers status on a mesh of 1,000 nodes (4 assignments
// each) with 200 open conditions, opening the stores as the command does.
//
//	go test -run '^$' -bench Status ./app/
func BenchmarkStatus(b *testing.B) {
	c := plannedMesh(b, 1000, 4, 40)
	ctx := context.Background()
	st, err := c.stores(ctx)
	if err != nil {
		b.Fatal(err)
	}
	inv, hs := st.Inventory, st.Health
	now := time.Now()
	var beats []inventory.Beat
	var found []health.Condition
	for i := 0; i < 1000; i++ {
		name := fmt.Sprintf("n%d", i)
		inv.MarkJoined(ctx, name, now)
		beats = append(beats, inventory.Beat{Node: name, HeardAt: now, IntervalS: 10})
		if i < 200 {
			found = append(found, health.Condition{Key: "node.silent/" + name, Kind: "node.silent", Scope: "machine", Machine: name,
				Severity: health.Urgent, Summary: name + " not heard", Evidence: map[string]any{"bound_s": 30}})
		}
	}
	if err := inv.RecordBeats(ctx, beats); err != nil {
		b.Fatal(err)
	}
	if _, err := hs.Reconcile(ctx, found, map[string]bool{"node.silent": true}, now); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		v, err := c.Status(ctx)
		if err != nil || len(v.Wrong) != 200 {
			b.Fatalf("%d wrong, %v", len(v.Wrong), err)
		}
	}
}
