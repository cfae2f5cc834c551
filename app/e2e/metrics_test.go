package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"mesh-controller/app"
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
func (m *testMesh) restartWithMetrics(o app.ServeOptions) string {
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

// waitMetric waits until check passes on the metrics, scraping the real
// endpoint each time; check says what the metrics are instead.
func waitMetric(t *testing.T, url string, check func(scrape) error) scrape {
	t.Helper()
	var s scrape
	checkFor(t, settle, func() error { s = scrapeOf(t, url); return check(s) })
	return s
}

// Every metric moves when its event happens, scraped from a real serving
// controller's /metrics with real hosts.
func TestMetrics_MoveWithTheirEvents(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	url := m.restartWithMetrics(app.ServeOptions{CheckEvery: 50 * time.Millisecond, CatchUpEvery: 50 * time.Millisecond, Bounds: &app.Bounds{HeartbeatFactor: 4, Apply: time.Hour, DataReport: time.Hour, RetiredWaiting: time.Hour, Memory: time.Hour}})
	s0 := scrapeOf(t, url)
	if s0.value("mesh_nodes", "state=current") != 0 || s0.value("mesh_heartbeats_absorbed_total") != 0 {
		t.Fatalf("a new mesh: current %v, heartbeats %v", s0.value("mesh_nodes", "state=current"), s0.value("mesh_heartbeats_absorbed_total"))
	}
	clients := s0.value("mesh_broker_connections")
	if clients < 1 {
		t.Fatalf("embedded broker connections %v, want the controller's own", clients)
	}

	h := m.join("web1")
	waitMetric(t, url, func(s scrape) error {
		joined, beats, conns := s.value("mesh_nodes", "state=current"), s.value("mesh_heartbeats_absorbed_total"), s.value("mesh_broker_connections")
		writes, writes0 := s.value("mesh_store_write_duration_seconds", "store=identity"), s0.value("mesh_store_write_duration_seconds", "store=identity")
		if joined == 1 && beats > 0 && conns > clients && writes > writes0 {
			return nil
		}
		return fmt.Errorf("not web1 joined, beating, connected, its join written: joined %v, heartbeats %v, connections %v (%v before), identity writes %v (%v before)",
			joined, beats, conns, clients, writes, writes0)
	})
	for _, store := range app.FencedContexts {
		if s0.value("mesh_store_size_bytes", "store="+store) <= 0 {
			t.Fatalf("%s store's size: %v", store, s0.value("mesh_store_size_bytes", "store="+store))
		}
	}

	m.declare("web1", `{"modules": []}`)
	waitMetric(t, url, func(s scrape) error {
		if n := s.value("mesh_apply_duration_seconds"); n < 1 {
			return fmt.Errorf("web1's apply not observed: %v applies timed", n)
		}
		return nil
	})

	// web1's plan moved with no declaration made (an act stopped half-way):
	// the catch-up declares it, and times its parts.
	sent := scrapeOf(t, url).value("mesh_declarations_sent_total")
	st, err := m.c.Stores(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Inventory.Apply(context.Background(), inventory.Change{Bump: []string{"web1"}}, m.c.Now()); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, url, func(s scrape) error {
		now, plan, send := s.value("mesh_declarations_sent_total"), s.value("mesh_declare_duration_seconds", "part=plan"), s.value("mesh_declare_duration_seconds", "part=send")
		if now > sent && plan >= 1 && send >= 1 {
			return nil
		}
		return fmt.Errorf("the catch-up's declaration not sent and timed: %v sent (%v before), plan timed %v, send %v", now, sent, plan, send)
	})
	// Applied before web1 stops: else, behind it from the restart on, the
	// healer's first act below is on this declaration and its second, on
	// the one the test makes, engages the brake before the test looks.
	checkFor(t, settle, func() error {
		if n := m.node("web1"); n.SerialApplied < n.SerialDeclared {
			return fmt.Errorf("web1 applied %d of %d", n.SerialApplied, n.SerialDeclared)
		}
		return nil
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
	waitMetric(t, url, func(s scrape) error {
		if n := s.value("mesh_messages_dropped_total", "reason=bad signature"); n != 1 {
			return fmt.Errorf("%v messages dropped as a bad signature, not the forged heartbeat's 1", n)
		}
		return nil
	})

	waitMetric(t, url, func(s scrape) error {
		silent, open := s.value("mesh_nodes", "state=silent"), s.value("mesh_conditions_open", "kind=node.silent", "severity=urgent")
		if silent == 1 && open == 1 && s.value("mesh_nodes", "state=current") == 0 {
			return nil
		}
		return fmt.Errorf("not web1 silent, its condition open: %v silent, %v node.silent open", silent, open)
	})

	// Behind and unapplied: the redeclare healer acts (a declaration sent),
	// and its second act engages the brake.
	url = m.restartWithMetrics(app.ServeOptions{CheckEvery: 50 * time.Millisecond,
		Bounds:  &app.Bounds{HeartbeatFactor: 1000, Apply: 10 * time.Millisecond, DataReport: time.Hour, RetiredWaiting: time.Hour, Memory: time.Hour},
		Healers: app.HealerLimits{Acts: 1, Window: time.Hour, Same: 100, SameWindow: time.Hour}})
	m.declare("web1", `{"modules": []}`)
	waitMetric(t, url, func(s scrape) error {
		behind, acts, sent := s.value("mesh_nodes", "state=behind"), s.value("mesh_healer_acts_total", "healer=redeclare", "outcome=done"), s.value("mesh_declarations_sent_total")
		if behind == 1 && acts == 1 && sent >= 1 && s.value("mesh_nodes", "state=current") == 0 {
			return nil
		}
		return fmt.Errorf("not web1 behind, the healer's act and its declaration: %v behind, %v redeclares done, %v declarations sent", behind, acts, sent)
	})
	if s := scrapeOf(t, url); s.value("mesh_healer_brake_engaged_total") != 0 {
		t.Fatalf("brake engaged after one act: %v", s.value("mesh_healer_brake_engaged_total"))
	}
	m.declare("web1", `{"modules": []}`)
	waitMetric(t, url, func(s scrape) error {
		if n := s.value("mesh_healer_brake_engaged_total"); n != 1 {
			return fmt.Errorf("the brake engaged %v times, not once", n)
		}
		return nil
	})
}
