package app

import (
	"context"
	"fmt"
	"testing"
	"time"

	"mesh-controller/contexts/inventory"
)

// listenersMesh is plannedMesh's 1,000 converged nodes, each having
// reported twelve listeners: two on ports of the mesh's modules (declared
// there, or not), five reachable that no module declares, five on loopback.
func listenersMesh(b *testing.B) *testApp {
	c := plannedMesh(b, 1000, 4, 40)
	ctx := context.Background()
	st, err := c.stores(ctx)
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	for i := 0; i < 1000; i++ {
		var found []inventory.Found
		for k := 0; k < 2; k++ {
			found = append(found, inventory.Found{Kind: "port", Name: fmt.Sprintf("tcp/%d", 1000+(i+k)%40), Addresses: []string{"0.0.0.0"}, Commands: []string{"m"}})
		}
		for k := 0; k < 5; k++ {
			found = append(found, inventory.Found{Kind: "port", Name: fmt.Sprintf("tcp/%d", 20000+k), Addresses: []string{"0.0.0.0"}, Commands: []string{"stray"}},
				inventory.Found{Kind: "port", Name: fmt.Sprintf("tcp/%d", 30000+k), Addresses: []string{"127.0.0.1"}, Commands: []string{"local"}})
		}
		if _, err := st.Inventory.RecordFacts(ctx, fmt.Sprintf("n%d", i), nil, found, now); err != nil {
			b.Fatal(err)
		}
	}
	return c
}

// BenchmarkSelfCheckListeners is the self-check of a mesh whose 1,000
// converged nodes each report at least five listeners no module declares
// (a node.unmanaged-listener each, naming 5,000 listeners and more, raised
// by the first run and found again after):
//
//	go test -run '^$' -bench SelfCheckListeners ./app/
func BenchmarkSelfCheckListeners(b *testing.B) {
	c := listenersMesh(b)
	ctx := context.Background()
	if _, err := c.SelfCheck(ctx, CheckOptions{}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r, err := c.SelfCheck(ctx, CheckOptions{})
		if err != nil {
			b.Fatal(err)
		}
		n, listeners := 0, 0
		for _, o := range r.Open {
			if o.Kind == "node.unmanaged-listener" {
				n++
				listeners += int(o.Evidence["count"].(float64))
			}
		}
		if n != 1000 || listeners < 5000 {
			b.Fatalf("%d node.unmanaged-listener open naming %d listeners, want 1000 naming at least 5000", n, listeners)
		}
	}
}

// BenchmarkConvergePreview previews converging one node of that mesh
// with the filter: its listeners judged, its plan made, its ruleset
// rendered, the preview kept (-bench ConvergePreview).
func BenchmarkConvergePreview(b *testing.B) {
	c := listenersMesh(b)
	ctx := context.Background()
	for i := 0; i < b.N; i++ {
		p, _, err := c.Converge(ctx, ConvergeRequest{Node: "n7", Filter: "nftables"})
		if err != nil || len(p.Unmanaged) < 5 {
			b.Fatalf("%v, %d not kept", err, len(p.Unmanaged))
		}
	}
}
