package inventory

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A change judged on a snapshot commits only while no other write moved
// the act revision since: the second of two changes judged on one
// snapshot is refused whole (ErrActConflict) and writes nothing; one not
// judged on a snapshot (Based 0) goes whatever came before, and moves the
// revision too.
func TestStore_ApplyBasedOnARevision(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	m := addExample(t, s, "paperless", t0)
	if err := s.AddNodes(ctx, []string{"web1", "web2"}, Converged, t0); err != nil {
		t.Fatal(err)
	}
	snap, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	first := Change{Assign: []Assignment{{Node: "web1", Module: m.Module, Version: m.Version}}, Based: snap.Revision}
	second := Change{Assign: []Assignment{{Node: "web2", Module: m.Module, Version: m.Version}}, Based: snap.Revision}
	if err := s.Apply(ctx, first, t0); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(ctx, second, t0); !errors.Is(err, ErrActConflict) {
		t.Fatalf("a change judged on a revision another moved: %v", err)
	}
	after, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(after.Assignments) != 1 || after.Revision != snap.Revision+1 {
		t.Fatalf("after: %+v at revision %d (was %d)", after.Assignments, after.Revision, snap.Revision)
	}
	second.Based = 0
	if err := s.Apply(ctx, second, t0); err != nil {
		t.Fatal(err)
	}
	if again, _ := s.Snapshot(ctx); again.Revision != snap.Revision+2 || len(again.Assignments) != 2 {
		t.Fatalf("a change not judged on a snapshot: %+v at %d", again.Assignments, again.Revision)
	}
}
