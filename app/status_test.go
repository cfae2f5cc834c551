package app

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"mesh-controller/contexts/inventory"
)

// Status reads only the nodes the store finds near a bound, and says what
// judging every node says: nodes just either side of their silence bound
// (beating every 1, 2.5 or 10 s, or never said), of the data report's
// bound, never heard, not joined, behind their plan or their declaration.
func TestStatus_JudgesAsEveryNode(t *testing.T) {
	c, st := migrated(t)
	ctx := context.Background()
	inv := st.Inventory
	now := time.Date(2026, 11, 30, 17, 0, 0, 123456789, time.UTC)
	c.Now = func() time.Time { return now }
	b := DefaultBounds()
	offsets := []time.Duration{-2 * time.Second, -time.Second, -time.Millisecond, 0, time.Millisecond, 999 * time.Millisecond, time.Second, 2 * time.Second}
	var names []string
	var beats []inventory.Beat
	var undelivered []string
	i := 0
	node := func() string {
		name := fmt.Sprintf("n%03d", i)
		i++
		names = append(names, name)
		if _, err := inv.AddNode(ctx, name, inventory.Converged, now.Add(-time.Hour)); err != nil {
			t.Fatal(err)
		}
		if err := inv.MarkJoined(ctx, name, now.Add(-time.Hour)); err != nil {
			t.Fatal(err)
		}
		return name
	}
	for _, interval := range []float64{0, 1, 2.5, 10} {
		for _, off := range offsets {
			name := node()
			bound := b.heartbeat(name, interval)
			beats = append(beats, inventory.Beat{Node: name, HeardAt: now.Add(-bound + off), IntervalS: interval})
		}
	}
	for _, off := range offsets {
		name := node()
		beats = append(beats, inventory.Beat{Node: name, HeardAt: now, IntervalS: 10})
		sets := []inventory.DataSet{{Module: "a", Name: "d", Path: "/srv/a", Precious: "costly"}, {Module: "b", Name: "d", Path: "/srv/b", Precious: "costly"}}
		if err := inv.RecordDataSets(ctx, name, sets, now.Add(-b.DataReport+off)); err != nil {
			t.Fatal(err)
		}
	}
	for k := 0; k < 3; k++ {
		name := node()
		beats = append(beats, inventory.Beat{Node: name, HeardAt: now, IntervalS: 10, SerialApplied: int64(k)})
		undelivered = append(undelivered, name)
	}
	if _, err := inv.AddNode(ctx, "unjoined", inventory.Converged, now); err != nil {
		t.Fatal(err)
	}
	silent := node()
	if _, err := st.DB("inventory").Writer.ExecContext(ctx, `UPDATE nodes SET last_heard = NULL WHERE name = ?`, silent); err != nil {
		t.Fatal(err)
	}
	if err := inv.RecordBeats(ctx, beats); err != nil {
		t.Fatal(err)
	}
	sign := func(int64, time.Time) (string, string, string, error) { return "{}", "sig", "key", nil }
	var reqs []inventory.DeclarationRequest
	for _, n := range undelivered[1:] {
		reqs = append(reqs, inventory.DeclarationRequest{Node: n, PlanVersion: inventory.CurrentPlan, Sign: sign})
	}
	if _, err := inv.SaveDeclarations(ctx, reqs, now); err != nil {
		t.Fatal(err)
	}
	if err := inv.BumpPlans(ctx, undelivered[:2]); err != nil {
		t.Fatal(err)
	}

	got, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Every node judged, as before.
	snap, err := inv.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	data, err := inv.AllDataSets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	quiet := []Signal{}
	for _, s := range signals(snap, data, b, now) {
		if s.Quiet {
			quiet = append(quiet, s)
		}
	}
	outOfDate := []OutOfDate{}
	for _, name := range snap.NodeNames {
		if n := snap.Nodes[name]; n.Undelivered() {
			outOfDate = append(outOfDate, OutOfDate{Kind: "node", Name: name})
		}
	}
	if !reflect.DeepEqual(got.Quiet, quiet) {
		t.Errorf("quiet:\n got %+v\nwant %+v", got.Quiet, quiet)
	}
	if len(quiet) < 20 || len(quiet) > len(names) {
		t.Errorf("%d quiet of %d: the cases do not straddle the bounds", len(quiet), len(names))
	}
	var gotOut []OutOfDate
	for _, o := range got.OutOfDate {
		gotOut = append(gotOut, OutOfDate{Kind: o.Kind, Name: o.Name})
	}
	if !reflect.DeepEqual(gotOut, outOfDate) || len(outOfDate) != 3 {
		t.Errorf("out of date: got %+v, want %+v", gotOut, outOfDate)
	}
}
