package inventory

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"testing"
	"time"
)

func addExample(t *testing.T, s *Store, name string, now time.Time) Manifest {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name + ".json")
	if err != nil {
		t.Fatal(err)
	}
	m, ps := ParseManifest(b)
	if len(ps) > 0 {
		t.Fatal(ps)
	}
	canon, _ := json.Marshal(m)
	if _, err := s.AddModule(context.Background(), m, canon, "", now); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestStore_RemoveNodes(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	t0 := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	m := addExample(t, s, "paperless", t0)
	if err := s.AddNodes(ctx, []string{"web1", "web2"}, Converged, t0); err != nil {
		t.Fatal(err)
	}
	var rs []Retirement
	for _, d := range m.Data {
		state := "retired"
		if d.Precious == Rebuildable {
			state = "dropped"
		}
		rs = append(rs, Retirement{Node: "web1", Module: m.Module, DataSet: d.Name, Path: d.Path, Precious: d.Precious, State: state, RetiredAt: t0, Why: "unassigned"})
	}
	for _, n := range []string{"web1", "web2"} {
		if err := s.Apply(ctx, Change{Assign: []Assignment{{Node: n, Module: m.Module, Version: m.Version, AssignedAt: t0}}}, t0); err != nil {
			t.Fatal(err)
		}
	}
	backup := t0.Add(-time.Hour)
	if err := s.RecordDataSets(ctx, "web1", []DataSet{{Module: "paperless", Name: "media", Path: "/var/lib/paperless/media", Bytes: 4096, Precious: Irreplaceable, LastBackup: &backup}}, t0); err != nil {
		t.Fatal(err)
	}
	later := t0.Add(-time.Minute)
	if err := s.RecordBackup(ctx, "web1", "paperless", "media", later); err != nil {
		t.Fatal(err)
	}

	t1 := t0.Add(time.Hour)
	t.Run("refused while assigned", func(t *testing.T) {
		if _, err := s.RemoveNodes(ctx, []string{"web1"}, nil, 0, t1); !errors.Is(err, ErrStillAssigned) {
			t.Fatalf("got %v", err)
		}
	})
	if err := s.Apply(ctx, Change{Unassign: []Holder{{Node: "web1", Module: "paperless"}}, Retirements: rs}, t0); err != nil {
		t.Fatal(err)
	}
	if err := s.AskDeletions(ctx, []Deletion{{Node: "web1", Module: "paperless", Target: "index", Kind: "data", Path: "/var/lib/paperless/index", Why: "x"}}, nil, 0, t0); err != nil {
		t.Fatal(err)
	}
	t.Run("all or nothing", func(t *testing.T) {
		if _, err := s.RemoveNodes(ctx, []string{"web1", "web9"}, nil, 0, t1); !errors.Is(err, ErrNodeNotFound) {
			t.Fatalf("got %v", err)
		}
		if _, err := s.RemoveNodes(ctx, []string{"web1", "web2"}, nil, 0, t1); !errors.Is(err, ErrStillAssigned) {
			t.Fatalf("got %v", err)
		}
		if _, err := s.Node(ctx, "web1"); err != nil {
			t.Fatalf("a refused removal removed web1: %v", err)
		}
	})

	consumer := []Retirement{{Node: "web1", Module: "postgres", DataSet: "postgres", Precious: Irreplaceable, Consumer: "web2/paperless", State: "retired", RetiredAt: t0, Why: "its node was removed"}}
	r, err := s.RemoveNodes(ctx, []string{"web1"}, consumer, 0, t1)
	if err != nil || r.Kept != 3 || len(r.Cancelled) != 1 || r.Cancelled[0].Target != "index" {
		t.Fatalf("remove: %+v, %v", r, err)
	}
	if _, err := s.Node(ctx, "web1"); !errors.Is(err, ErrNodeNotFound) {
		t.Fatalf("web1 still recorded: %v", err)
	}
	got, _ := s.Retirements(ctx, "web1")
	if len(got) != 3 {
		t.Fatalf("retirements: %+v", got)
	}
	for _, r := range got {
		if r.NodeRemovedAt == nil || !r.NodeRemovedAt.Equal(t1) {
			t.Errorf("%s not marked removed: %+v", r.DataSet, r)
		}
		if r.DataSet == "media" && (r.Bytes == nil || *r.Bytes != 4096 || r.LastBackup == nil || !r.LastBackup.Equal(later)) {
			t.Errorf("media kept without its size and latest backup: %+v", r)
		}
	}

	// The name may be added again: a fresh record that does not take the old data for its own.
	if _, err := s.AddNode(ctx, "web1", Converged, t1); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(ctx, Change{Assign: []Assignment{{Node: "web1", Module: m.Module, Version: m.Version, AssignedAt: t1}}}, t1); err != nil {
		t.Fatal(err)
	}
	if err := s.DeletionsDone(ctx, "web1", []Deletion{{Module: "paperless", Kind: "data", Target: "media"}}, t1); err != nil {
		t.Fatal(err)
	}
	got, _ = s.Retirements(ctx, "web1")
	for _, r := range got {
		if r.State != "retired" && r.State != "dropped" {
			t.Errorf("the new web1 touched the removed one's %s: %s", r.DataSet, r.State)
		}
	}
	snap, _ := s.Snapshot(ctx)
	if len(snap.Seats.Deletions) != 0 {
		t.Fatalf("a cancelled deletion is still asked: %+v", snap.Seats.Deletions)
	}

	t.Run("recorded deleted by hand", func(t *testing.T) {
		id := got[0].ID
		if err := s.AskDeletions(ctx, nil, []int64{id}, 0, t1); err != nil {
			t.Fatal(err)
		}
		if err := s.AskDeletions(ctx, nil, []int64{id}, 0, t1); !errors.Is(err, ErrNotCleanable) {
			t.Fatalf("twice: %v", err)
		}
	})
}
