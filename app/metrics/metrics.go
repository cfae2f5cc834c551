// Package metrics holds what a controller exposes on /metrics in the
// Prometheus text format: counters and histograms the daemon moves as
// things happen, gauges read when scraped, whether it serves, and the Go
// runtime's and the process's own. It keeps its own registry, so nothing
// another library registers globally leaks into it. The listener it
// answers on (Listen) serves /healthz and /readyz beside /metrics; the
// host's metrics are served the same way.
package metrics

import (
	"context"
	"errors"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"mesh-controller/app/probe"
)

// Metrics are a serving controller's. Every method is safe on a nil
// *Metrics, so the daemon counts without asking whether anyone scrapes.
type Metrics struct {
	// Registry holds every metric below and the gauges added by Read.
	Registry *prometheus.Registry

	beats        prometheus.Counter
	dropped      *prometheus.CounterVec
	declarations prometheus.Counter
	apply        prometheus.Histogram
	declare      *prometheus.HistogramVec
	writes       *prometheus.HistogramVec
	healerActs   *prometheus.CounterVec
	brake        prometheus.Counter
	// clients counts the embedded broker's connections; nil with an
	// external broker, whose connections are that server's to say.
	clients atomic.Pointer[func() int]

	// mu guards serving and why: whether this controller serves, and if
	// not why (starting, standing by, standing aside, stopping).
	mu      sync.Mutex
	serving bool
	why     string
}

// Build is what a binary says of itself in its build_info metric.
type Build struct {
	// Version is the binary's ("" is a development build), Protocol the
	// version of the mesh's protocol it speaks.
	Version, Protocol string
}

// Runtime registers on reg the Go runtime's collector (go_*: goroutines,
// memory, collections) and the process's (process_*: CPU, memory, open
// files), and name, a gauge of 1 labelled with the build's version, Go
// version and protocol, as Prometheus's own build_info metrics are.
func Runtime(reg *prometheus.Registry, name string, b Build) {
	version := b.Version
	if version == "" {
		version = "development build"
	}
	info := prometheus.NewGauge(prometheus.GaugeOpts{Name: name,
		Help:        "Always 1; its labels say which build answers: its version, the Go version it was built with, and the protocol it speaks.",
		ConstLabels: prometheus.Labels{"version": version, "goversion": runtime.Version(), "protocol": b.Protocol}})
	info.Set(1)
	// prometheus's own constructors, not their collectors package's
	// wrappers: that package links database/sql (its DB stats collector),
	// which a host, a builder and a backup module keep out.
	reg.MustRegister(prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}), info)
}

// New makes the metrics in a registry of their own, with the runtime's
// and the process's, mesh_build_info and mesh_serving. Until Serving is
// called the controller is starting: not serving.
func New(b Build) *Metrics {
	m := &Metrics{
		why:      "starting: the lease is not taken yet",
		Registry: prometheus.NewRegistry(),
		beats: prometheus.NewCounter(prometheus.CounterOpts{Name: "mesh_heartbeats_absorbed_total",
			Help: "Heartbeats verified and absorbed."}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mesh_messages_dropped_total",
			Help: "Messages refused or let go, by reason."}, []string{"reason"}),
		declarations: prometheus.NewCounter(prometheus.CounterOpts{Name: "mesh_declarations_sent_total",
			Help: "Declarations this controller sent (catch-up, answers to hosts' asks, healers); a command's own sends are the command's."}),
		apply: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "mesh_apply_duration_seconds",
			Help: "How long hosts took to apply a declaration, as they reported it.", Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 12)}),
		declare: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "mesh_declare_duration_seconds",
			Help: "How long the parts of a catch-up declare took (plan, sign, store, send).", Buckets: prometheus.ExponentialBuckets(0.001, 3, 12)}, []string{"part"}),
		writes: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "mesh_store_write_duration_seconds",
			Help: "How long one write transaction to a store took, by store.", Buckets: prometheus.ExponentialBuckets(0.0001, 3, 12)}, []string{"store"}),
		healerActs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mesh_healer_acts_total",
			Help: "Healers' acts, by healer and outcome (done, failed)."}, []string{"healer", "outcome"}),
		brake: prometheus.NewCounter(prometheus.CounterOpts{Name: "mesh_healer_brake_engaged_total",
			Help: "Times the healers' brake engaged."}),
	}
	m.Registry.MustRegister(m.beats, m.dropped, m.declarations, m.apply, m.declare, m.writes, m.healerActs, m.brake)
	Runtime(m.Registry, "mesh_build_info", b)
	m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "mesh_serving",
		Help: "1 while this controller serves (holds the lease), 0 while it starts, stands by, stands aside or stops."},
		func() float64 {
			if on, _ := m.Serves(); on {
				return 1
			}
			return 0
		}))
	m.Read("mesh_broker_connections", "Clients connected to the embedded broker (absent with an external broker).", nil,
		func(context.Context) ([]Reading, error) {
			if n := m.clients.Load(); n != nil {
				return []Reading{{Value: float64((*n)())}}, nil
			}
			return nil, nil
		})
	return m
}

// Beat counts a heartbeat absorbed.
func (m *Metrics) Beat() {
	if m != nil {
		m.beats.Inc()
	}
}

// Drop counts a message dropped for reason.
func (m *Metrics) Drop(reason string) {
	if m != nil {
		m.dropped.WithLabelValues(reason).Inc()
	}
}

// Declared counts n declarations sent.
func (m *Metrics) Declared(n int) {
	if m != nil {
		m.declarations.Add(float64(n))
	}
}

// Applied observes one host's apply, in milliseconds as reported.
func (m *Metrics) Applied(ms float64) {
	if m != nil {
		m.apply.Observe(ms / 1000)
	}
}

// DeclarePart observes how long one part of a declare took.
func (m *Metrics) DeclarePart(part string, took time.Duration) {
	if m != nil {
		m.declare.WithLabelValues(part).Observe(took.Seconds())
	}
}

// StoreWrite returns the observer of one store's write transactions (nil
// on a nil *Metrics, which the store then skips).
func (m *Metrics) StoreWrite(store string) func(time.Duration) {
	if m == nil {
		return nil
	}
	h := m.writes.WithLabelValues(store)
	return func(took time.Duration) { h.Observe(took.Seconds()) }
}

// HealerActed counts a healer's act.
func (m *Metrics) HealerActed(healer string, failed bool) {
	if m != nil {
		outcome := "done"
		if failed {
			outcome = "failed"
		}
		m.healerActs.WithLabelValues(healer, outcome).Inc()
	}
}

// BrokerClients says how to count the embedded broker's connections.
func (m *Metrics) BrokerClients(n func() int) {
	if m != nil {
		m.clients.Store(&n)
	}
}

// BrakeEngaged counts the healers' brake engaging.
func (m *Metrics) BrakeEngaged() {
	if m != nil {
		m.brake.Inc()
	}
}

// Serving says this controller serves now: it holds the lease, its broker
// is up and it answers hosts.
func (m *Metrics) Serving() {
	if m != nil {
		m.mu.Lock()
		m.serving, m.why = true, ""
		m.mu.Unlock()
	}
}

// NotServing says this controller does not serve now, and why, in words
// anyone asking /readyz may read.
func (m *Metrics) NotServing(why string) {
	if m != nil {
		m.mu.Lock()
		m.serving, m.why = false, why
		m.mu.Unlock()
	}
}

// Serves says whether this controller serves, and if not why.
func (m *Metrics) Serves() (bool, string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.serving, m.why
}

// Reading is one value of a gauge read at scrape time, with its labels'
// values in the order the gauge names them.
type Reading struct {
	Labels []string
	Value  float64
}

// Read adds a gauge whose values read returns when scraped. A failed read
// makes that gauge, not the whole scrape, fail.
func (m *Metrics) Read(name, help string, labels []string, read func(context.Context) ([]Reading, error)) {
	m.Registry.MustRegister(&reader{desc: prometheus.NewDesc(name, help, labels, nil), read: read})
}

// readTimeout bounds one gauge's read: a scrape must not hang on a store.
const readTimeout = 5 * time.Second

type reader struct {
	desc *prometheus.Desc
	read func(context.Context) ([]Reading, error)
}

func (r *reader) Describe(ch chan<- *prometheus.Desc) { ch <- r.desc }

func (r *reader) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
	defer cancel()
	rs, err := r.read(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(r.desc, err)
		return
	}
	for _, x := range rs {
		ch <- prometheus.MustNewConstMetric(r.desc, prometheus.GaugeValue, x.Value, x.Labels...)
	}
}

// Serve answers /metrics, /healthz and /readyz on l until ctx ends;
// ready says whether the controller is ready (probe.Ready).
func (m *Metrics) Serve(ctx context.Context, l net.Listener, ready probe.Ready) error {
	return Listen(ctx, l, m.Registry, ready)
}

// Listen answers /metrics from reg, and /healthz and /readyz as ready
// says, on l until ctx ends.
func Listen(ctx context.Context, l net.Listener, reg *prometheus.Registry, ready probe.Ready) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	probe.Handle(mux, ready)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	// Closed by ctx, or its listener closed by its owner (serve closes
	// it as it returns): a clean end either way.
	if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}
