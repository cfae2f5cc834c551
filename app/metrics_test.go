package app

import (
	"net/http"
	"strings"
	"testing"

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
