package inventory

import (
	"context"
	"testing"
	"time"
)

// NodesToJudge measures silence in SQL (the one computation on time each
// engine spells its own way, sqlite.DB.Seconds): a node heard within its
// bound is left out, one silent past it is judged, to the second.
func TestStore_NodesToJudge(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	t0 := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	for _, n := range []string{"quiet", "beating"} {
		if _, err := s.AddNode(ctx, n, Converged, t0); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.MarkJoinedMany(ctx, []string{"quiet", "beating"}, t0); err != nil {
		t.Fatal(err)
	}
	// Both beat every 10 s, with nothing undelivered; a bound of 3 beats is 30 s.
	beat := func(node string, at time.Time) {
		if err := s.RecordBeats(ctx, []Beat{{Node: node, HeardAt: at, IntervalS: 10}}); err != nil {
			t.Fatal(err)
		}
	}
	beat("quiet", t0)
	beat("beating", t0.Add(25*time.Second))
	judged := func(now time.Time) []string {
		ns, err := s.NodesToJudge(ctx, Watch{Now: now, HeartbeatFactor: 3, DefaultInterval: 5 * time.Second, DataReport: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, n := range ns {
			names = append(names, n.Name)
		}
		return names
	}
	if got := judged(t0.Add(28 * time.Second)); len(got) != 0 {
		t.Fatalf("28 s after quiet's beat: judged %v, want none", got)
	}
	if got := judged(t0.Add(30*time.Second + 500*time.Millisecond)); len(got) != 1 || got[0] != "quiet" {
		t.Fatalf("30.5 s after quiet's beat: judged %v, want [quiet]", got)
	}
	if got := judged(t0.Add(2 * time.Minute)); len(got) != 2 {
		t.Fatalf("2 min on: judged %v, want both", got)
	}
}
