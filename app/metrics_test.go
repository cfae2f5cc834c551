package app

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"mesh-controller/app/host"
	"mesh-controller/contexts/inventory"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape is what one GET of /metrics said, parsed by Prometheus's own
// text parser.
type scrape map[string]*dto.MetricFamily

// restartWithMetrics restarts the controller with o and /metrics on a
// fresh loopback port; it returns the URL to scrape.
func (m *testMesh) restartWithMetrics(o ServeOptions) string {
	m.t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		m.t.Fatal(err)
	}
	o.Metrics = l
	m.restartWith(o)
	return "http://" + l.Addr().String() + "/metrics"
}

func scrapeOf(t testing.TB, url string) scrape {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	return fams
}

// value is the value of the metric name with labels (name=value pairs):
// a counter's or gauge's value, a histogram's count; -1 if absent.
func (s scrape) value(name string, labels ...string) float64 {
	f := s[name]
	if f == nil {
		return -1
	}
next:
	for _, mt := range f.Metric {
		have := map[string]string{}
		for _, l := range mt.Label {
			have[l.GetName()] = l.GetValue()
		}
		for _, l := range labels {
			k, v, _ := strings.Cut(l, "=")
			if have[k] != v {
				continue next
			}
		}
		switch {
		case mt.Counter != nil:
			return mt.Counter.GetValue()
		case mt.Gauge != nil:
			return mt.Gauge.GetValue()
		case mt.Histogram != nil:
			return float64(mt.Histogram.GetSampleCount())
		}
	}
	return -1
}

// waitMetric waits until the metric satisfies ok, scraping the real
// endpoint each time.
func waitMetric(t *testing.T, url, what string, ok func(scrape) bool) scrape {
	t.Helper()
	var s scrape
	waitFor(t, what, func() bool { s = scrapeOf(t, url); return ok(s) })
	return s
}

// Every metric moves when its event happens, scraped from a real serving
// controller's /metrics with real hosts.
func TestMetrics_MoveWithTheirEvents(t *testing.T) {
	m := newTestMesh(t)
	url := m.restartWithMetrics(ServeOptions{CheckEvery: 50 * time.Millisecond, CatchUpEvery: 50 * time.Millisecond, Bounds: &Bounds{HeartbeatFactor: 4, Apply: time.Hour, DataReport: time.Hour, RetiredWaiting: time.Hour, Memory: time.Hour}})
	s0 := scrapeOf(t, url)
	if s0.value("mesh_nodes", "state=joined") != 0 || s0.value("mesh_heartbeats_absorbed_total") != 0 {
		t.Fatalf("a new mesh: joined %v, heartbeats %v", s0.value("mesh_nodes", "state=joined"), s0.value("mesh_heartbeats_absorbed_total"))
	}
	clients := s0.value("mesh_broker_connections")
	if clients < 1 {
		t.Fatalf("embedded broker connections %v, want the controller's own", clients)
	}

	h := m.join("web1")
	waitMetric(t, url, "web1 joined, beating, connected, its join written", func(s scrape) bool {
		return s.value("mesh_nodes", "state=joined") == 1 && s.value("mesh_heartbeats_absorbed_total") > 0 &&
			s.value("mesh_broker_connections") > clients &&
			s.value("mesh_store_write_duration_seconds", "store=identity") > s0.value("mesh_store_write_duration_seconds", "store=identity")
	})
	for _, store := range fencedContexts {
		if s0.value("mesh_store_size_bytes", "store="+store) <= 0 {
			t.Fatalf("%s store's size: %v", store, s0.value("mesh_store_size_bytes", "store="+store))
		}
	}

	m.declare("web1", `{"modules": []}`)
	waitMetric(t, url, "web1's apply observed", func(s scrape) bool { return s.value("mesh_apply_duration_seconds") >= 1 })

	// web1's plan moved with no declaration made (an act stopped half-way):
	// the catch-up declares it, and times its parts.
	sent := scrapeOf(t, url).value("mesh_declarations_sent_total")
	st, err := m.c.stores(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Inventory.Apply(context.Background(), inventory.Change{Bump: []string{"web1"}}, m.c.Now()); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, url, "the catch-up's declaration sent and timed", func(s scrape) bool {
		return s.value("mesh_declarations_sent_total") > sent && s.value("mesh_declare_duration_seconds", "part=plan") >= 1 &&
			s.value("mesh_declare_duration_seconds", "part=send") >= 1
	})

	// A heartbeat signed with another key than web1 joined with.
	h.stop()
	hs, err := host.Load(h.state.Dir)
	if err != nil {
		t.Fatal(err)
	}
	_, hs.HostKey, _ = newEd25519()
	if err := publishSigned(connectAs(t, m.url, hs), hs, "heartbeat"); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, url, "the forged heartbeat dropped as a bad signature", func(s scrape) bool {
		return s.value("mesh_messages_dropped_total", "reason=bad signature") == 1
	})

	waitMetric(t, url, "web1 silent, its condition open", func(s scrape) bool {
		return s.value("mesh_nodes", "state=silent") == 1 && s.value("mesh_conditions_open", "kind=node.silent", "severity=urgent") == 1
	})

	// Behind and unapplied: the redeclare healer acts (a declaration sent),
	// and its second act engages the brake.
	url = m.restartWithMetrics(ServeOptions{CheckEvery: 50 * time.Millisecond,
		Bounds:  &Bounds{HeartbeatFactor: 1000, Apply: 10 * time.Millisecond, DataReport: time.Hour, RetiredWaiting: time.Hour, Memory: time.Hour},
		Healers: HealerLimits{Acts: 1, Window: time.Hour, Same: 100, SameWindow: time.Hour}})
	m.declare("web1", `{"modules": []}`)
	waitMetric(t, url, "web1 behind, the healer's act and its declaration", func(s scrape) bool {
		return s.value("mesh_nodes", "state=behind") == 1 && s.value("mesh_healer_acts_total", "healer=redeclare", "outcome=done") == 1 &&
			s.value("mesh_declarations_sent_total") >= 1
	})
	if s := scrapeOf(t, url); s.value("mesh_healer_brake_engaged_total") != 0 {
		t.Fatalf("brake engaged after one act: %v", s.value("mesh_healer_brake_engaged_total"))
	}
	m.declare("web1", `{"modules": []}`)
	waitMetric(t, url, "the brake engaged", func(s scrape) bool { return s.value("mesh_healer_brake_engaged_total") == 1 })
}
