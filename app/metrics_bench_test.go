package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"mesh-controller/contexts/health"
	"mesh-controller/contexts/inventory"
)

// BenchmarkMetricsScrape10000 is one GET of /metrics, over HTTP on
// loopback, on a mesh of 10,000 joined nodes of which 1,000 are silent
// (an open condition each): what a Prometheus server costs the controller
// every scrape interval.
//
//	go test -run '^$' -bench MetricsScrape10000 ./app/
func BenchmarkMetricsScrape10000(b *testing.B) {
	_, st := migrated(b)
	ctx := context.Background()
	now := time.Now()
	names := make([]string, 10000)
	var found []health.Condition
	for i := range names {
		names[i] = fmt.Sprintf("h%d", i)
		if i < 1000 {
			found = append(found, health.Condition{Key: "node.silent/" + names[i], Kind: "node.silent", Scope: "machine", Machine: names[i],
				Severity: health.Urgent, Summary: names[i] + " not heard", Evidence: map[string]any{"bound_s": 30}})
		}
	}
	if err := st.Inventory.AddNodes(ctx, names, inventory.Converged, now); err != nil {
		b.Fatal(err)
	}
	if _, err := st.DB("inventory").Writer.ExecContext(ctx, `UPDATE nodes SET joined_at = created_at`); err != nil {
		b.Fatal(err)
	}
	if _, err := st.Health.Reconcile(ctx, found, map[string]bool{"node.silent": true}, now); err != nil {
		b.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	m, _ := startMetrics(sctx, l, "", slog.New(slog.DiscardHandler))
	readStores(m, st)
	url := "http://" + l.Addr().String() + "/metrics"
	s := scrapeOf(b, url)
	if s.value("mesh_nodes", "state=current") != 9000 || s.value("mesh_nodes", "state=silent") != 1000 {
		b.Fatalf("current %v, silent %v", s.value("mesh_nodes", "state=current"), s.value("mesh_nodes", "state=silent"))
	}
	for b.Loop() {
		resp, err := http.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || n == 0 {
			b.Fatalf("%s, %d bytes", resp.Status, n)
		}
	}
}
