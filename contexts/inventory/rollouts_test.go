package inventory

import (
	"context"
	"errors"
	"testing"
	"time"
)

// One roll-out a module is kept: a second is refused while the first is
// under way, replaces it once it ended (its nodes with it), and the
// ended one's driver writes nothing over its successor; a rollback is
// refused with none recorded and while one is under way.
func TestRollOuts_OneAModule(t *testing.T) {
	s, _ := newStore(t)
	ctx, now := context.Background(), time.Now()
	first := RollOut{ID: "a", Module: "store", To: "2.0.0", Canary: 1, Batch: "50%", Wait: time.Minute, Soak: 10 * time.Second, Phase: RollOutRunning,
		Nodes: []RollOutNode{{Node: "db1", From: "1.0.0", Result: "waiting"}, {Node: "db2", From: "1.1.0", Batch: 1, Result: "waiting"}}}
	if _, err := s.RollBackRollOut(ctx, "store", "why", now); !errors.Is(err, ErrNoRollOut) {
		t.Fatalf("a rollback with no roll-out: %v", err)
	}
	if err := s.StartRollOut(ctx, first, now); err != nil {
		t.Fatal(err)
	}
	if under, err := s.RollOutsUnderWay(ctx); err != nil || len(under) != 1 || under[0] != "store" {
		t.Fatalf("under way: %v %v", under, err)
	}
	second := first
	second.ID, second.To, second.Nodes = "b", "3.0.0", []RollOutNode{{Node: "db3", From: "2.0.0", Result: "waiting"}}
	if err := s.StartRollOut(ctx, second, now); !errors.Is(err, ErrRollOutUnderWay) {
		t.Fatalf("a second roll-out while one is under way: %v", err)
	}
	if _, err := s.RollBackRollOut(ctx, "store", "why", now); !errors.Is(err, ErrRollOutUnderWay) {
		t.Fatalf("a rollback while under way: %v", err)
	}
	before, _ := s.RollOutMark(ctx, "store")
	first.Phase, first.Nodes[0].Result, first.Nodes[0].Moved, first.Nodes[0].Serial = RollOutDone, "ready", true, 7
	if err := s.SaveRollOut(ctx, first, now); err != nil {
		t.Fatal(err)
	}
	if after, err := s.RollOutMark(ctx, "store"); err != nil || after == before || before == "" {
		t.Fatalf("the mark did not change: %q, then %q (%v)", before, after, err)
	}
	got, ok, err := s.RollOut(ctx, "store")
	if err != nil || !ok || got.Phase != RollOutDone || got.Wait != time.Minute || got.Soak != 10*time.Second || len(got.Nodes) != 2 ||
		got.Nodes[0].Result != "ready" || !got.Nodes[0].Moved || got.Nodes[0].Serial != 7 || got.Nodes[1].From != "1.1.0" {
		t.Fatalf("read back: %+v %v %v", got, ok, err)
	}
	if from, err := s.RollOutFromVersions(ctx); err != nil || len(from["store"]) != 2 {
		t.Fatalf("from versions: %v %v", from, err)
	}
	if err := s.StartRollOut(ctx, second, now); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveRollOut(ctx, first, now); !errors.Is(err, ErrNoRollOut) {
		t.Fatalf("the replaced roll-out written over its successor: %v", err)
	}
	got, _, _ = s.RollOut(ctx, "store")
	if got.ID != "b" || len(got.Nodes) != 1 || got.Nodes[0].Node != "db3" {
		t.Fatalf("the second: %+v", got)
	}
}

// A roll-out allowed without a snapshot says so when read back, and the
// snapshot names, per node of it, the version it allows; the host's word
// on each node's data is kept. One not allowed names none.
func TestRollOuts_WithoutSnapshot(t *testing.T) {
	s, _ := newStore(t)
	ctx, now := context.Background(), time.Now()
	ro := RollOut{ID: "a", Module: "store", To: "2.0.0", Batch: "1", WithoutSnapshot: true, Phase: RollOutRunning,
		Nodes: []RollOutNode{{Node: "db1", From: "1.0.0", Result: "waiting"}, {Node: "db2", From: "1.0.0", Batch: 1, Result: "waiting"}}}
	if err := s.StartRollOut(ctx, ro, now); err != nil {
		t.Fatal(err)
	}
	ro.Nodes[0].Result, ro.Nodes[0].Prepared = "ready", "prepare of 2.0.0 ran; snapshot 1a2b3c4d of main first"
	if err := s.SaveRollOut(ctx, ro, now); err != nil {
		t.Fatal(err)
	}
	got, _, err := s.RollOut(ctx, "store")
	if err != nil || !got.WithoutSnapshot || got.Nodes[0].Prepared != ro.Nodes[0].Prepared {
		t.Fatalf("read back: %+v %v", got, err)
	}
	snap, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.WithoutSnapshot) != 2 || snap.WithoutSnapshot[Holder{Node: "db2", Module: "store"}] != "2.0.0" {
		t.Fatalf("the snapshot's: %v", snap.WithoutSnapshot)
	}
	ro.Phase = RollOutDone
	if err := s.SaveRollOut(ctx, ro, now); err != nil {
		t.Fatal(err)
	}
	next := RollOut{ID: "b", Module: "store", To: "3.0.0", Batch: "1", Phase: RollOutRunning, Nodes: []RollOutNode{{Node: "db1", From: "2.0.0", Result: "waiting"}}}
	if err := s.StartRollOut(ctx, next, now); err != nil {
		t.Fatal(err)
	}
	if snap, _ := s.Snapshot(ctx); len(snap.WithoutSnapshot) != 0 {
		t.Fatalf("a roll-out not allowed: %v", snap.WithoutSnapshot)
	}
}
