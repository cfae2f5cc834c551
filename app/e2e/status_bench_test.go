package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"mesh-controller/contexts/inventory"
)

// BenchmarkStatus10000 answers status on a well mesh of 10,000 joined
// nodes, each beating and with a declaration applied: what a person asks
// most of a large mesh (-bench 'Status10000').
func BenchmarkStatus10000(b *testing.B) {
	c, st := migrated(b)
	ctx := context.Background()
	inv := st.Inventory
	now := time.Now()
	names := make([]string, 10000)
	beats := make([]inventory.Beat, len(names))
	reqs := make([]inventory.DeclarationRequest, len(names))
	sign := func(int64, time.Time) (string, string, string, error) { return "{}", "sig", "key", nil }
	for i := range names {
		names[i] = fmt.Sprintf("h%d", i)
		beats[i] = inventory.Beat{Node: names[i], HeardAt: now, IntervalS: 10, SerialApplied: 1}
		reqs[i] = inventory.DeclarationRequest{Node: names[i], PlanVersion: inventory.CurrentPlan, Sign: sign}
	}
	if err := inv.AddNodes(ctx, names, inventory.Converged, now); err != nil {
		b.Fatal(err)
	}
	if _, err := st.DB("inventory").Writer.ExecContext(ctx, `UPDATE nodes SET joined_at = created_at`); err != nil {
		b.Fatal(err)
	}
	if _, err := inv.SaveDeclarations(ctx, reqs, now); err != nil {
		b.Fatal(err)
	}
	if err := inv.RecordBeats(ctx, beats); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		v, err := c.Status(ctx)
		if err != nil || len(v.Quiet) != 0 || len(v.OutOfDate) != 0 {
			b.Fatalf("%d quiet, %d out of date, %v", len(v.Quiet), len(v.OutOfDate), err)
		}
	}
}
