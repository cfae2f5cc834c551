package health

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"mesh-controller/embedded/sqlite/sqlitetest"
)

func TestStore_ForgetMachines(t *testing.T) {
	db, _ := sqlitetest.Open(t, "health")
	s := NewStore(db)
	ctx := context.Background()
	t0 := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	found := []Condition{
		{Key: "node.silent/web1", Kind: "node.silent", Scope: "machine", Machine: "web1", Severity: Urgent, Summary: "web1 not heard"},
		{Key: "data.no-backup/web1/paperless/media", Kind: "data.no-backup", Scope: "module", Machine: "web1", Module: "paperless", Severity: Urgent, Summary: "no backup"},
		{Key: "node.silent/web2", Kind: "node.silent", Scope: "machine", Machine: "web2", Severity: Urgent, Summary: "web2 not heard"},
	}
	if _, err := s.Reconcile(ctx, found, map[string]bool{"node.silent": true, "data.no-backup": true}, t0); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"web1", "web2"} {
		if err := s.CountDrops(ctx, n, "bad signature", 3, t0); err != nil {
			t.Fatal(err)
		}
	}
	act := HandAct{At: t0, What: "node remove web1", Why: "decommissioned", Cause: "node", Who: "test"}
	if _, err := s.ForgetMachines(ctx, []string{"web1"}, "node removed", []HandAct{{At: t0, What: "x"}}, t0); !errors.Is(err, ErrNoWhy) {
		t.Fatalf("a hand act with no why: %v", err)
	}
	f, err := s.ForgetMachines(ctx, []string{"web1", "web9"}, "node removed", []HandAct{act}, t0.Add(time.Minute))
	if err != nil || len(f.Cleared) != 2 || f.Drops != 1 {
		t.Fatalf("forget: %+v, %v", f, err)
	}
	open, _ := s.Conditions(ctx)
	if len(open) != 1 || open[0].Machine != "web2" {
		t.Fatalf("open: %+v", open)
	}
	h, _ := s.History(ctx, "node.silent/web1", time.Time{})
	if len(h) != 2 || h[0].Event != "cleared" || !strings.HasSuffix(h[0].Condition.Summary, "(cleared: node removed)") {
		t.Fatalf("history: %+v", h)
	}
	if d, _ := s.Drops(ctx, ""); len(d) != 1 || d[0].Node != "web2" {
		t.Fatalf("drops: %+v", d)
	}
	if acts, _ := s.HandActs(ctx, time.Time{}); len(acts) != 1 || acts[0].What != "node remove web1" {
		t.Fatalf("hand acts: %+v", acts)
	}
}

func TestStore_RecordHandActs(t *testing.T) {
	db, _ := sqlitetest.Open(t, "health")
	s := NewStore(db)
	ctx := context.Background()
	t0 := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	// One without a why: none is kept.
	if _, err := s.RecordHandActs(ctx, []HandAct{{At: t0, What: "a", Why: "w"}, {At: t0, What: "b"}}); !errors.Is(err, ErrNoWhy) {
		t.Fatalf("no why: %v", err)
	}
	acts, err := s.RecordHandActs(ctx, []HandAct{{At: t0, What: "a", Why: "w"}, {At: t0, What: "b", Why: "w"}})
	if err != nil || len(acts) != 2 || acts[0].ID == 0 || acts[1].ID == acts[0].ID {
		t.Fatalf("%+v, %v", acts, err)
	}
	if kept, _ := s.HandActs(ctx, time.Time{}); len(kept) != 2 {
		t.Fatalf("kept %d", len(kept))
	}
}
