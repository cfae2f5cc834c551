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
