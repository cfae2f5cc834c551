package host

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/prometheus/client_golang/prometheus"

	"mesh-controller/app/metrics"
	"mesh-controller/app/protocol"
)

// hostMetrics are what mesh-host run --metrics answers on /metrics, in a
// registry of their own: counters and a histogram moved as things happen,
// gauges read from the supervisor when scraped, and the Go runtime's and
// the process's own. Every method is safe on a nil *hostMetrics, so the
// host counts without asking whether anyone scrapes.
type hostMetrics struct {
	reg     *prometheus.Registry
	apply   prometheus.Histogram
	applies *prometheus.CounterVec
	fetched prometheus.Counter
	backups *prometheus.CounterVec
}

// moduleStates are the states a module is counted in, every one said
// (0 when no module is in it) so that a dashboard's series never vanish.
var moduleStates = []string{protocol.StateWaiting, protocol.StateStarting, protocol.StateReady, protocol.StateBackingOff,
	protocol.StateCrashLooping, protocol.StateStopped, protocol.StateFailed}

// serveMetrics makes the host's metrics and answers /metrics, /healthz and
// /readyz on l until ctx ends.
func (r *Runner) serveMetrics(ctx context.Context, l net.Listener) *hostMetrics {
	m := &hostMetrics{
		reg: prometheus.NewRegistry(),
		apply: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "mesh_host_apply_duration_seconds",
			Help: "How long this host took to apply a declaration, as it reports it.", Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 12)}),
		applies: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mesh_host_applies_total",
			Help: "Declarations this host applied or did not, by outcome (applied, failed)."}, []string{"outcome"}),
		fetched: prometheus.NewCounter(prometheus.CounterOpts{Name: "mesh_host_archive_fetched_bytes_total",
			Help: "Bytes of archives fetched from the controller, each verified against its digest."}),
		backups: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mesh_host_backups_total",
			Help: "Backups, restores and snapshots this host ran, by kind and outcome (ok, failed)."}, []string{"kind", "outcome"}),
	}
	m.reg.MustRegister(m.apply, m.applies, m.fetched, m.backups)
	metrics.Runtime(m.reg, "mesh_host_build_info", metrics.Build{Version: Version, Protocol: protocol.Version})
	m.reg.MustRegister(&supervisorCollector{r: r,
		modules: prometheus.NewDesc("mesh_host_modules", "Modules this host supervises, by state.", []string{"state"}, nil),
		restarts: prometheus.NewDesc("mesh_host_module_restarts_total", "Times each module was started again after it exited, since this host started.",
			[]string{"module"}, nil),
		connected: prometheus.NewDesc("mesh_host_connected", "1 while this host is connected to the broker, 0 while it is not.", nil, nil),
		serial:    prometheus.NewDesc("mesh_host_serial_applied", "The serial of the declaration this host applied last (0: none yet).", nil, nil),
	})
	go func() {
		if err := metrics.Listen(ctx, l, m.reg, r.ready); err != nil {
			r.warnf("metrics: %v", err)
		}
	}()
	return m
}

// ready says why the host is not ready: it is ready while it is connected
// to the broker and has applied the last declaration it was given.
func (r *Runner) ready(context.Context) error {
	if nc := r.nc.Load(); nc == nil || !nc.IsConnected() {
		return errors.New("not connected to the broker")
	}
	r.mu.Lock()
	last, failed := r.last.Serial, r.failed
	r.mu.Unlock()
	switch {
	case failed > 0:
		return fmt.Errorf("declaration %d did not apply (the host's log says why); %d is the last applied", failed, last)
	case last == 0:
		return errors.New("no declaration applied yet")
	}
	return nil
}

// applied counts an apply's outcome and times it.
func (m *hostMetrics) applied(report protocol.AppliedBody) {
	if m == nil || report.Serial == 0 {
		return
	}
	outcome := "applied"
	if !report.OK {
		outcome = "failed"
	}
	m.applies.WithLabelValues(outcome).Inc()
	if report.TotalMS > 0 {
		m.apply.Observe(report.TotalMS / 1000)
	}
}

// fetchedArchive counts an archive's bytes, fetched and verified.
func (m *hostMetrics) fetchedArchive(bytes int64) {
	if m != nil {
		m.fetched.Add(float64(bytes))
	}
}

// backedUp counts a backup's, a restore's or a snapshot's outcome.
func (m *hostMetrics) backedUp(kind string, ok bool) {
	if m == nil {
		return
	}
	outcome := "ok"
	if !ok {
		outcome = "failed"
	}
	m.backups.WithLabelValues(kind, outcome).Inc()
}

// supervisorCollector reads the modules' states and restarts, and the
// connection, when scraped.
type supervisorCollector struct {
	r                                    *Runner
	modules, restarts, connected, serial *prometheus.Desc
}

func (c *supervisorCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.modules
	ch <- c.restarts
	ch <- c.connected
	ch <- c.serial
}

func (c *supervisorCollector) Collect(ch chan<- prometheus.Metric) {
	n := map[string]int{}
	if c.r.sup != nil {
		for _, st := range c.r.sup.States() {
			n[st.State]++
		}
		for module, times := range c.r.sup.Restarts() {
			ch <- prometheus.MustNewConstMetric(c.restarts, prometheus.CounterValue, float64(times), module)
		}
	}
	for _, state := range moduleStates {
		ch <- prometheus.MustNewConstMetric(c.modules, prometheus.GaugeValue, float64(n[state]), state)
	}
	connected := 0.0
	if nc := c.r.nc.Load(); nc != nil && nc.IsConnected() {
		connected = 1
	}
	ch <- prometheus.MustNewConstMetric(c.connected, prometheus.GaugeValue, connected)
	c.r.mu.Lock()
	serial := c.r.last.Serial
	c.r.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(c.serial, prometheus.GaugeValue, float64(serial))
}
