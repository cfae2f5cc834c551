package health

import (
	"context"
	"errors"
	"testing"
	"time"

	"mesh-controller/embedded/sqlite/sqlitetest"
)

func TestStore_HandActs(t *testing.T) {
	db, _ := sqlitetest.Open(t, "health")
	s := NewStore(db)
	ctx := context.Background()
	now := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	if _, err := s.RecordHandAct(ctx, HandAct{At: now, What: "x"}); !errors.Is(err, ErrNoWhy) {
		t.Fatalf("no why: %v", err)
	}
	for i, why := range []string{"first", "second"} {
		if _, err := s.RecordHandAct(ctx, HandAct{At: now.Add(time.Duration(i) * time.Hour), What: "declare", Why: why, Who: "me@here"}); err != nil {
			t.Fatal(err)
		}
	}
	acts, err := s.HandActs(ctx, now.Add(30*time.Minute))
	if err != nil || len(acts) != 1 || acts[0].Why != "second" {
		t.Fatalf("since: %+v, %v", acts, err)
	}
}

func TestStore_Drops(t *testing.T) {
	db, _ := sqlitetest.Open(t, "health")
	s := NewStore(db)
	ctx := context.Background()
	t0 := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	s.CountDrops(ctx, "web1", "bad signature", 2, t0)
	s.CountDrops(ctx, "web1", "bad signature", 3, t0.Add(time.Minute))
	s.CountDrops(ctx, "web2", "unknown sender", 1, t0)
	drops, err := s.Drops(ctx, "web1")
	if err != nil || len(drops) != 1 || drops[0].Count != 5 || !drops[0].FirstAt.Equal(t0) || !drops[0].LastAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("web1: %+v, %v", drops, err)
	}
	if all, _ := s.Drops(ctx, ""); len(all) != 2 {
		t.Fatalf("all: %+v", all)
	}
}

func TestStore_JoinRefusals(t *testing.T) {
	db, _ := sqlitetest.Open(t, "health")
	s := NewStore(db)
	ctx := context.Background()
	t0 := time.Date(2026, 11, 29, 10, 0, 30, 0, time.UTC)
	for _, r := range []struct {
		source, reason string
		n              int64
		at             time.Time
	}{
		{"192.0.2.7", "unknown token", 5, t0.Add(-20 * time.Minute)},
		{"192.0.2.7", "unknown token", 2, t0},
		{"192.0.2.7", "unknown token", 3, t0.Add(10 * time.Second)},
		{"192.0.2.7", "used token", 1, t0.Add(time.Minute)},
		{"192.0.2.8", "unknown token", 4, t0},
	} {
		if err := s.CountJoinRefusals(ctx, r.source, r.reason, r.n, r.at); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.JoinRefusalsSince(ctx, t0.Add(-10*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].Source != "192.0.2.7" || got[0].Reason != "unknown token" || got[0].Count != 5 ||
		!got[0].FirstAt.Equal(t0.Truncate(time.Minute)) || !got[0].LastAt.Equal(t0.Add(10*time.Second)) ||
		got[1].Reason != "used token" || got[2].Source != "192.0.2.8" || got[2].Count != 4 {
		t.Fatalf("since: %+v", got)
	}
	if n, err := s.PruneMeasurements(ctx, t0.Add(-10*time.Minute), t0.Add(-10*time.Minute), 100); err != nil || n != 1 {
		t.Fatalf("pruned %d, %v", n, err)
	}
}
