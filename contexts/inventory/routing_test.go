package inventory

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

// A node's routing is kept, read back and in the snapshot; a change moves
// its plan, the same value again does not.
func TestStore_Routing(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	if _, err := s.AddNode(ctx, "gw1", Adopted, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddNode(ctx, "web1", Adopted, time.Now()); err != nil {
		t.Fatal(err)
	}
	plan := func() int64 {
		t.Helper()
		n, err := s.Node(ctx, "gw1")
		if err != nil {
			t.Fatal(err)
		}
		return n.PlanVersion
	}
	if r, err := s.Routing(ctx, "gw1"); err != nil || r.PublicDomain != "" || r.Networks == nil || len(r.Networks) != 0 {
		t.Fatalf("none yet: %+v, %v", r, err)
	}
	for i, step := range []struct {
		name    string
		set     func() (bool, error)
		changed bool
	}{
		{"domain", func() (bool, error) { return s.SetPublicDomain(ctx, "gw1", "example.org") }, true},
		{"same domain", func() (bool, error) { return s.SetPublicDomain(ctx, "gw1", "example.org") }, false},
		{"networks", func() (bool, error) { return s.SetNetworks(ctx, "gw1", []string{"10.0.0.0/8", "2001:db8::/48"}) }, true},
		{"same networks", func() (bool, error) { return s.SetNetworks(ctx, "gw1", []string{"10.0.0.0/8", "2001:db8::/48"}) }, false},
	} {
		before := plan()
		changed, err := step.set()
		if err != nil || changed != step.changed {
			t.Fatalf("%d %s: changed %v, %v", i, step.name, changed, err)
		}
		if moved := plan() > before; moved != step.changed {
			t.Errorf("%s: plan moved %v, want %v", step.name, moved, step.changed)
		}
	}
	r, err := s.Routing(ctx, "gw1")
	if err != nil || r.PublicDomain != "example.org" || !slices.Equal(r.Networks, []string{"10.0.0.0/8", "2001:db8::/48"}) {
		t.Fatalf("kept: %+v, %v", r, err)
	}
	snap, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := snap.Routing["gw1"]; got.PublicDomain != "example.org" || len(got.Networks) != 2 {
		t.Fatalf("snapshot: %+v", snap.Routing)
	}
	if _, ok := snap.Routing["web1"]; ok {
		t.Fatalf("web1 routes nothing, yet: %+v", snap.Routing)
	}
	t.Run("cleared", func(t *testing.T) {
		if changed, err := s.SetPublicDomain(ctx, "gw1", ""); err != nil || !changed {
			t.Fatalf("%v, %v", changed, err)
		}
		if changed, err := s.SetNetworks(ctx, "gw1", nil); err != nil || !changed {
			t.Fatalf("%v, %v", changed, err)
		}
		if changed, err := s.SetNetworks(ctx, "gw1", nil); err != nil || changed {
			t.Fatalf("cleared twice: %v, %v", changed, err)
		}
		snap, err := s.Snapshot(ctx)
		if err != nil || len(snap.Routing) != 0 {
			t.Fatalf("%+v, %v", snap.Routing, err)
		}
	})
	t.Run("unknown node", func(t *testing.T) {
		if _, err := s.SetPublicDomain(ctx, "gw9", "example.org"); !errors.Is(err, ErrNodeNotFound) {
			t.Fatalf("set: %v", err)
		}
		if _, err := s.Routing(ctx, "gw9"); !errors.Is(err, ErrNodeNotFound) {
			t.Fatalf("read: %v", err)
		}
	})
}
