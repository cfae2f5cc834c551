package inventory

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"mesh-controller/embedded/sqlite/sqlitetest"
)

// BenchmarkNodes lists 10,000 nodes, each with a declaration of about 3 KB,
// as node list does (-bench 'Nodes$').
func BenchmarkNodes(b *testing.B) {
	db, _ := sqlitetest.Open(b, "inventory")
	s := NewStore(db)
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 17, 0, 0, 0, time.UTC)
	names := make([]string, 10000)
	reqs := make([]DeclarationRequest, len(names))
	body := strings.Repeat("x", 3000)
	sign := func(int64, time.Time) (string, string, string, error) { return body, "sig", "key", nil }
	for i := range names {
		names[i] = fmt.Sprintf("h%d", i)
		reqs[i] = DeclarationRequest{Node: names[i], PlanVersion: 1, Sign: sign}
	}
	if err := s.AddNodes(ctx, names, Converged, now); err != nil {
		b.Fatal(err)
	}
	if _, err := s.SaveDeclarations(ctx, reqs, now); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		nodes, err := s.Nodes(ctx)
		if err != nil || len(nodes) != len(names) || nodes[0].SerialDeclared != 1 {
			b.Fatalf("%d nodes, %v", len(nodes), err)
		}
	}
}
