package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"

	"mesh-controller/app/metrics"
	"mesh-controller/app/protocol"
)

// startMetrics answers /metrics, /healthz and /readyz on l until ctx ends,
// from before the lease is taken: a controller standing by is watched too,
// and its /readyz says why it does not serve. The stores' gauges come once
// they are open (readStores); until then /readyz says the controller is
// starting.
func startMetrics(ctx context.Context, l net.Listener, version string, log *slog.Logger) (*metrics.Metrics, *atomic.Pointer[Stores]) {
	m := metrics.New(metrics.Build{Version: version, Protocol: protocol.Version})
	var stores atomic.Pointer[Stores]
	ready := func(ctx context.Context) error {
		if serving, why := m.Serves(); !serving {
			return errors.New(why)
		}
		st := stores.Load()
		if st == nil {
			return errors.New("starting: the stores are not open yet")
		}
		return st.answer(ctx, log)
	}
	go func() {
		if err := m.Serve(ctx, l, ready); err != nil {
			log.Error("metrics", "err", err)
		}
	}()
	return m, &stores
}

// answer says whether every store answers now: nil, or which does not, in
// words /readyz says to anyone; the error itself is logged (it may name a
// file or a database server).
func (st *Stores) answer(ctx context.Context, log *slog.Logger) error {
	for _, name := range Contexts {
		err := st.Failed(name)
		if err == nil {
			_, err = st.DB(name).Version(ctx, migrationsOf()[name])
		}
		if err != nil {
			log.Warn("readiness: a store does not answer", "store", name, "err", err)
			return fmt.Errorf("the %s store does not answer", name)
		}
	}
	return nil
}

// readStores adds the gauges read from the stores when scraped (a few rows
// each, whatever the mesh's size), and times every store's writes.
func readStores(m *metrics.Metrics, st *Stores) {
	m.Read("mesh_nodes", "Nodes by state, each node in one: not_joined (added, its host not joined yet), silent (open node.silent), behind (open node.behind, not silent), current (joined, neither).", []string{"state"},
		func(ctx context.Context) ([]metrics.Reading, error) {
			all, joined, err := st.Inventory.CountNodes(ctx)
			if err != nil {
				return nil, err
			}
			silent, behind, err := st.Health.CountSilentBehind(ctx)
			if err != nil {
				return nil, err
			}
			// A condition outlives its node by a self-check at most: never
			// more silent and behind nodes than joined ones.
			silent = min(silent, joined)
			behind = min(behind, joined-silent)
			return []metrics.Reading{
				{Labels: []string{"not_joined"}, Value: float64(all - joined)},
				{Labels: []string{"silent"}, Value: float64(silent)},
				{Labels: []string{"behind"}, Value: float64(behind)},
				{Labels: []string{"current"}, Value: float64(joined - silent - behind)},
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
