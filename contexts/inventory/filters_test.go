package inventory

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"
)

func TestStore_ConvergeAdopt(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	if _, err := s.AddNode(ctx, "web1", Adopted, now); err != nil {
		t.Fatal(err)
	}
	before, _ := s.Node(ctx, "web1")
	if err := s.Adopt(ctx, "web1"); !errors.Is(err, ErrAdoptedAlready) {
		t.Fatalf("adopting an adopted node: %v", err)
	}
	if err := s.Adopt(ctx, "nope"); !errors.Is(err, ErrNodeNotFound) {
		t.Fatalf("adopting an unknown node: %v", err)
	}
	if err := s.Converge(ctx, "nope", nil, 0); !errors.Is(err, ErrNodeNotFound) {
		t.Fatalf("converging an unknown node: %v", err)
	}
	if err := s.Converge(ctx, "web1", &Filter{Kind: "iptables", Since: now}, 0); err == nil {
		t.Fatal("an unknown filter kind was recorded")
	}
	if err := s.Converge(ctx, "web1", &Filter{Kind: FilterNftables, CloseSSH: true, Since: now}, 0); err != nil {
		t.Fatal(err)
	}
	n, _ := s.Node(ctx, "web1")
	fs, err := s.NodeFilters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n.Mode != Converged || n.PlanVersion <= before.PlanVersion || fs["web1"] != (Filter{Kind: FilterNftables, CloseSSH: true, Since: now}) {
		t.Fatalf("converged: %+v, filters %+v", n, fs)
	}
	// Converged again without a filter: the mesh owns none.
	if err := s.Converge(ctx, "web1", nil, 0); err != nil {
		t.Fatal(err)
	}
	if fs, _ := s.NodeFilters(ctx); len(fs) != 0 {
		t.Fatalf("a filter left: %+v", fs)
	}
	if err := s.Converge(ctx, "web1", &Filter{Kind: FilterNftables, Since: now}, 0); err != nil {
		t.Fatal(err)
	}
	converged, _ := s.Node(ctx, "web1")
	if err := s.Adopt(ctx, "web1"); err != nil {
		t.Fatal(err)
	}
	n, _ = s.Node(ctx, "web1")
	fs, _ = s.NodeFilters(ctx)
	if n.Mode != Adopted || n.PlanVersion <= converged.PlanVersion || len(fs) != 0 {
		t.Fatalf("adopted: %+v, filters %+v", n, fs)
	}
}

func TestStore_FactNamed(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for _, n := range []string{"web1", "web2"} {
		if _, err := s.AddNode(ctx, n, Converged, now); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.RecordFacts(ctx, "web1", []Fact{{Name: "arch", Value: "amd64", Why: "x"}, {Name: "filter", Value: "rolled-back", Why: "y"}}, nil, now); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RecordFacts(ctx, "web2", []Fact{{Name: "arch", Value: "arm64", Why: "x"}}, nil, now); err != nil {
		t.Fatal(err)
	}
	got, err := s.FactNamed(ctx, "filter")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got["web1"] != (Fact{Name: "filter", Value: "rolled-back", Why: "y"}) {
		t.Fatalf("got %+v", got)
	}
}

// Many reports are kept in one transaction, each as RecordFacts keeps it:
// one whose node is not known (removed meanwhile) fails alone, and a
// second report of a node in the same batch replaces its first.
func TestStore_RecordFactsMany(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	addNodes(t, s, now, "web1", "web2")
	arch := func(v string) []Fact { return []Fact{{Name: "arch", Value: v, Why: "x"}} }
	kept, err := s.RecordFactsMany(ctx, []FactsReport{
		{Node: "web1", Facts: arch("amd64"), At: now},
		{Node: "gone", Facts: arch("amd64"), At: now},
		{Node: "web2", Facts: arch("arm64"), At: now},
		{Node: "web1", Facts: arch("riscv64"), At: now},
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, wantErr := range []bool{false, true, false, false} {
		if (kept[i].Err != nil) != wantErr {
			t.Errorf("report %d: %v", i, kept[i].Err)
		}
	}
	got, err := s.FactNamed(ctx, "arch")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["web1"].Value != "riscv64" || got["web2"].Value != "arm64" {
		t.Fatalf("kept %+v", got)
	}
}

// A port a host found at several addresses, or held by several processes,
// is kept as one listener with all of them; ListenersOf reads the
// listeners of many nodes, services left out.
func TestStore_Listeners(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for _, n := range []string{"web1", "web2"} {
		if _, err := s.AddNode(ctx, n, Converged, now); err != nil {
			t.Fatal(err)
		}
	}
	found := []Found{
		{Kind: "port", Name: "tcp/22", Detail: "first", Addresses: []string{"[::]"}, Commands: []string{"sshd"}},
		{Kind: "port", Name: "tcp/22", Detail: "second", Addresses: []string{"0.0.0.0"}, Commands: []string{"sshd"}},
		{Kind: "port", Name: "udp/53", Detail: "dns", Addresses: []string{"127.0.0.53"}, Commands: []string{""}},
		{Kind: "service", Name: "cron.service", Detail: "active"},
	}
	if _, err := s.RecordFacts(ctx, "web1", nil, found, now); err != nil {
		t.Fatal(err)
	}
	got, err := s.ListenersOf(ctx, []string{"web1", "web2"})
	if err != nil {
		t.Fatal(err)
	}
	want := []Found{
		{Kind: "port", Name: "tcp/22", Detail: "first", Addresses: []string{"0.0.0.0", "[::]"}, Commands: []string{"sshd"}},
		{Kind: "port", Name: "udp/53", Detail: "dns", Addresses: []string{"127.0.0.53"}},
	}
	if len(got) != 1 || !reflect.DeepEqual(got["web1"], want) {
		t.Fatalf("got %+v", got)
	}
	_, all, err := s.Facts(ctx, "web1")
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 3 || !reflect.DeepEqual(all[0], want[0]) || all[2].Name != "cron.service" {
		t.Fatalf("facts' found: %+v", all)
	}
}
