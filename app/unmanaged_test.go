package app

import (
	"testing"

	"mesh-controller/contexts/inventory"
)

// What a host sends is judged: a listener named otherwise than
// protocol/port raises nothing (its name would be part of the evidence).
func TestUnmanagedListener_NamesJudged(t *testing.T) {
	in := &checkInputs{snap: &inventory.Snapshot{}, listeners: map[string][]inventory.Found{"web1": {
		{Kind: "port", Name: "tcp/8080", Addresses: []string{"0.0.0.0"}},
		{Kind: "port", Name: "tcp/8080/../../x", Addresses: []string{"0.0.0.0"}},
		{Kind: "port", Name: "sctp/9", Addresses: []string{"0.0.0.0"}},
		{Kind: "port", Name: "tcp/123456", Addresses: []string{"0.0.0.0"}},
	}}}
	got := unmanagedListeners(in, inventory.Node{Name: "web1", Mode: inventory.Converged})
	if len(got) != 1 || got[0].Name != "tcp/8080" {
		t.Fatalf("got %+v", got)
	}
}
