package app

import (
	"context"
	"testing"
	"time"

	"mesh-controller/contexts/health"
)

// Measurements older than their window are pruned by the self-check until
// none is left, not a batch of 1,000 per check.
func TestSelfCheck_PrunesEverythingOld(t *testing.T) {
	c, st := migrated(t)
	ctx := context.Background()
	old := c.Now().Add(-measurementWindow - time.Hour)
	ds := make([]health.Duration, 5000)
	for i := range ds {
		ds[i] = health.Duration{Kind: "apply", Subject: "web1", MS: 1, At: old}
	}
	if err := st.Health.RecordDurations(ctx, ds); err != nil {
		t.Fatal(err)
	}
	if err := st.Health.RecordHeartbeats(ctx, map[health.HourKey]health.Histogram{{Node: "web1", Hour: old}: {Count: 1, Buckets: map[int]int64{1: 1}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SelfCheck(ctx, CheckOptions{}); err != nil {
		t.Fatal(err)
	}
	var durations, hours int
	st.DB("health").Reader.QueryRow(`SELECT count(*) FROM durations`).Scan(&durations)
	st.DB("health").Reader.QueryRow(`SELECT count(*) FROM heartbeat_hours`).Scan(&hours)
	if durations != 0 || hours != 0 {
		t.Fatalf("left %d durations and %d hourly aggregates older than the window", durations, hours)
	}
}
