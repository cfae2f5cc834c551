package app

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"mesh-controller/contexts/health"
	"mesh-controller/contexts/inventory"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape is what one GET of /metrics said, parsed by Prometheus's own
// text parser.
type scrape map[string]*dto.MetricFamily

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

// Each node is counted in one state of mesh_nodes: a node both silent and
// behind is silent only, a joined node neither is current, and the states
// add up to the mesh.
func TestMetrics_NodesEachInOneState(t *testing.T) {
	_, st := migrated(t)
	ctx := context.Background()
	now := time.Now()
	if err := st.Inventory.AddNodes(ctx, []string{"added", "quiet", "late", "fine", "gone"}, inventory.Converged, now); err != nil {
		t.Fatal(err)
	}
	if _, err := st.DB("inventory").Writer.ExecContext(ctx, `UPDATE nodes SET joined_at = created_at WHERE name <> 'added'`); err != nil {
		t.Fatal(err)
	}
	var found []health.Condition
	for _, c := range [][2]string{{"node.silent", "quiet"}, {"node.behind", "quiet"}, {"node.behind", "late"}} {
		found = append(found, health.Condition{Key: c[0] + "/" + c[1], Kind: c[0], Scope: "machine", Machine: c[1], Severity: health.Warning, Summary: c[1]})
	}
	if _, err := st.Health.Reconcile(ctx, found, map[string]bool{"node.silent": true, "node.behind": true}, now); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	m, _ := startMetrics(sctx, l, "", slog.New(slog.DiscardHandler))
	readStores(m, st)
	s := scrapeOf(t, "http://"+l.Addr().String()+"/metrics")
	for state, want := range map[string]float64{"not_joined": 1, "silent": 1, "behind": 1, "current": 2} {
		if got := s.value("mesh_nodes", "state="+state); got != want {
			t.Errorf("mesh_nodes{state=%q} is %v, want %v", state, got, want)
		}
	}
}
