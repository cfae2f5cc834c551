package app

import (
	"context"
	"fmt"
	"log/slog"
	"net"

	"mesh-controller/app/metrics"
)

// serveMetrics answers /metrics on l until ctx ends: the daemon moves the
// counters and histograms as things happen, the stores are asked for the
// gauges when scraped (a few rows each, whatever the mesh's size), and
// every store's writes are timed.
func (c uses) serveMetrics(ctx context.Context, st *Stores, l net.Listener, log *slog.Logger) *metrics.Metrics {
	m := metrics.New()
	m.Read("mesh_nodes", "Nodes by state: joined (every node whose host joined), silent and behind (open node.silent and node.behind conditions).", []string{"state"},
		func(ctx context.Context) ([]metrics.Reading, error) {
			joined, err := st.Inventory.CountJoined(ctx)
			if err != nil {
				return nil, err
			}
			open, err := st.Health.CountOpen(ctx)
			if err != nil {
				return nil, err
			}
			n := map[string]int{}
			for _, o := range open {
				n[o.Kind] += o.N
			}
			return []metrics.Reading{
				{Labels: []string{"joined"}, Value: float64(joined)},
				{Labels: []string{"silent"}, Value: float64(n["node.silent"])},
				{Labels: []string{"behind"}, Value: float64(n["node.behind"])},
			}, nil
		})
	m.Read("mesh_conditions_open", "Open conditions by kind and severity.", []string{"kind", "severity"},
		func(ctx context.Context) ([]metrics.Reading, error) {
			open, err := st.Health.CountOpen(ctx)
			var rs []metrics.Reading
			for _, o := range open {
				rs = append(rs, metrics.Reading{Labels: []string{o.Kind, o.Severity}, Value: float64(o.N)})
			}
			return rs, err
		})
	m.Read("mesh_store_size_bytes", "Each store's size: a SQLite file with its write-ahead log, or a PostgreSQL store's database.", []string{"store"},
		func(ctx context.Context) ([]metrics.Reading, error) {
			var rs []metrics.Reading
			for _, name := range fencedContexts {
				n, err := st.DB(name).Size(ctx)
				if err != nil {
					return nil, fmt.Errorf("%s store: %w", name, err)
				}
				rs = append(rs, metrics.Reading{Labels: []string{name}, Value: float64(n)})
			}
			return rs, nil
		})
	for _, name := range fencedContexts {
		st.DB(name).Observe = m.StoreWrite(name)
	}
	go func() {
		if err := m.Serve(ctx, l); err != nil {
			log.Error("metrics", "err", err)
		}
	}()
	return m
}

// observeDeclare tells the metrics how long a declare's parts took.
func observeDeclare(m *metrics.Metrics, t DeclareTimes) {
	if t.Nodes == 0 {
		return
	}
	m.DeclarePart("plan", t.Plan)
	m.DeclarePart("sign", t.Sign)
	m.DeclarePart("store", t.Store)
	m.DeclarePart("send", t.Send)
}
