package app

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"mesh-controller/app/boardsvg"
	"mesh-controller/contexts/health"
	"mesh-controller/contexts/inventory"
)

// Each hour's p50 and p99 are read from its histogram (the upper bound of
// the bucket holding the rank, never above the maximum), in its slot of
// the day; hours outside the day, and of nodes not charted, are left out,
// and a node not heard all day has a series without points.
func TestBoard_HeartbeatSeries(t *testing.T) {
	first := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	hist := func(n1000, n30000 int) health.Histogram {
		var h health.Histogram
		for range n1000 {
			h.Add(1000)
		}
		for range n30000 {
			h.Add(30000)
		}
		return h
	}
	at := func(node string, hour int, h health.Histogram) health.HourHistogram {
		return health.HourHistogram{HourKey: health.HourKey{Node: node, Hour: first.Add(time.Duration(hour) * time.Hour)}, Histogram: h}
	}
	got := heartbeatSeries([]health.HourHistogram{
		at("web1", -1, hist(0, 5)), at("web1", 0, hist(99, 1)), at("web1", 1, hist(98, 2)), at("web1", 23, hist(1, 0)), at("web1", 24, hist(0, 5)),
		at("web2", 5, hist(0, 1)), at("gone", 5, hist(0, 1)),
	}, []string{"quiet", "web1", "web2"}, first)
	// 1000 ms falls in bucket 40 (up to 2^10 = 1024 ms); 30000 ms in
	// bucket 60 (up to 32768 ms), read as the maximum, 30000.
	want := []nodeSeries{
		{Node: "quiet"},
		{Node: "web1", Points: []boardsvg.Point{{Slot: 0, P50: 1024, P99: 1024}, {Slot: 1, P50: 1024, P99: 30000}, {Slot: 23, P50: 1000, P99: 1000}}},
		{Node: "web2", Points: []boardsvg.Point{{Slot: 5, P50: 30000, P99: 30000}}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("series\n%+v\nwant\n%+v", got, want)
	}
}

// Past BoardCharts joined nodes, the charts are of those whose longest
// interval of the day is longest, longest first, then by name; a node
// not joined (removed) is not charted whatever its intervals.
func TestBoard_ChartedNodes(t *testing.T) {
	_, st := migrated(t)
	ctx := context.Background()
	first := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	hours := map[health.HourKey]health.Histogram{}
	var joined []string
	for i := range BoardCharts + 2 {
		var h health.Histogram
		h.Add(1000)
		n := fmt.Sprintf("n%03d", i)
		hours[health.HourKey{Node: n, Hour: first.Add(3 * time.Hour)}] = h
		joined = append(joined, n)
	}
	long := func(node string, at time.Time, ms float64) {
		h := hours[health.HourKey{Node: node, Hour: at}]
		h.Add(ms)
		hours[health.HourKey{Node: node, Hour: at}] = h
	}
	long("n007", first.Add(4*time.Hour), 30000)
	long("n005", first.Add(5*time.Hour), 30000)
	long("gone", first.Add(5*time.Hour), 90000)
	long("n009", first.Add(-time.Hour), 90000) // the day before
	if err := st.Health.RecordHeartbeats(ctx, hours); err != nil {
		t.Fatal(err)
	}
	got, err := chartedNodes(ctx, st.Health, joined, first)
	if err != nil || len(got) != BoardCharts || !reflect.DeepEqual(got[:4], []string{"n005", "n007", "n000", "n001"}) {
		t.Fatalf("charted %v (%d) %v", got[:min(4, len(got))], len(got), err)
	}
	if got, _ := chartedNodes(ctx, st.Health, joined[:3], first); !reflect.DeepEqual(got, joined[:3]) {
		t.Fatalf("up to BoardCharts, every joined node: %v", got)
	}
}

// The grid pages by BoardGridNodes rows and BoardGridModules columns,
// its legend counting every cell of the mesh.
func TestBoard_ModuleGrid(t *testing.T) {
	var nodes []string
	var assigned []inventory.Assignment
	var states []health.ModuleState
	for i := range 250 {
		n := fmt.Sprintf("n%03d", i)
		nodes = append(nodes, n)
		assigned = append(assigned, inventory.Assignment{Node: n, Module: "web", Version: "1.0.0"})
		if i%2 == 0 {
			states = append(states, health.ModuleState{Node: n, Module: "web", Version: "1.0.0", State: "ready"})
		}
		if i == 7 {
			states = append(states, health.ModuleState{Node: n, Module: "old", Version: "0.1.0", State: "failed"})
		}
	}
	// A state left from a node no longer recorded is not counted.
	states = append(states, health.ModuleState{Node: "gone", Module: "web", State: "failed"})
	g := moduleGrid(nodes, assigned, states, ParseBoardPage(url.Values{"nodes": {"9"}, "modules": {"x"}}))
	if g.Page != (BoardPage{3, 1}) || g.Pages != (BoardPage{3, 1}) || g.FirstNode != 201 || g.LastNode != 250 || g.FirstModule != 1 || g.LastModule != 2 {
		t.Fatalf("page %+v of %+v, nodes %d–%d, modules %d–%d", g.Page, g.Pages, g.FirstNode, g.LastNode, g.FirstModule, g.LastModule)
	}
	if n := strings.Count(string(g.SVG), `<rect class="cell `); n != 50*2 {
		t.Fatalf("%d cells drawn, want 100", n)
	}
	if g.Link(1, 0) != "" || g.Link(0, 1) != "" || g.Link(-1, 0) != "?nodes=2&modules=1" {
		t.Fatalf("links %q %q %q", g.Link(1, 0), g.Link(0, 1), g.Link(-1, 0))
	}
	for _, want := range []string{"ready 125", "failed 1", "assigned, not reported 125", "not assigned 249"} {
		if !strings.Contains(string(g.Legend), want) {
			t.Errorf("legend %s lacks %q", g.Legend, want)
		}
	}
	if g := moduleGrid(nodes, nil, nil, BoardPage{1, 1}); g.SVG != "" || g.Modules != 0 {
		t.Fatalf("a grid of no module: %d modules, %d bytes", g.Modules, len(g.SVG))
	}
}

// The overlay as a graph: a link per pair of peers, the relay's and the
// silent ones marked, a node without a key left out; past
// BoardGraphNodes, counted and not drawn.
func TestBoard_OverlayGraph(t *testing.T) {
	key := func(i int) string {
		b := make([]byte, 32)
		b[0] = byte(i + 1)
		return base64.StdEncoding.EncodeToString(b)
	}
	node := func(i int, name string, reach inventory.Reach, endpoint string) inventory.OverlayNode {
		return inventory.OverlayNode{Name: name, Index: int64(i + 1), Key: key(i), Placement: inventory.Placement{Reach: reach, Endpoint: endpoint}}
	}
	o := inventory.Overlay{Prefix6: "fd12:3456:789a::/48", Nodes: []inventory.OverlayNode{
		node(0, "a", inventory.Public, "203.0.113.1:51820"), node(1, "b", inventory.Public, "203.0.113.2:51820"),
		node(2, "c", inventory.BehindNAT, ""), node(3, "d", inventory.BehindNAT, ""),
	}}
	o.Nodes[3].Key = ""
	v := overlayGraph(o, []inventory.SilentPeer{{Node: "c", Peer: "a"}, {Node: "c", Peer: "gone"}})
	if v.Relay != "a" || v.Links != 2 || v.Drawn != 2 || v.Silent != 1 || v.Public != 2 || v.NAT != 2 || v.Keyless != 1 {
		t.Fatalf("%+v", v)
	}
	svg := string(v.SVG)
	for _, want := range []string{`<circle class="node n-relay"`, `<circle class="node n-out"`, `<line class="link l-silent"`, "<title>a — c: silent</title>", "<title>a — b: relayed</title>"} {
		if !strings.Contains(svg, want) {
			t.Errorf("the graph lacks %s:\n%s", want, svg)
		}
	}
	if n := strings.Count(svg, `<circle class="node `); n != 4 {
		t.Fatalf("%d circles", n)
	}

	var many inventory.Overlay
	for i := range BoardGraphNodes + 1 {
		many.Nodes = append(many.Nodes, node(i, fmt.Sprintf("n%03d", i), inventory.BehindNAT, ""))
	}
	many.Nodes[0].Placement = inventory.Placement{Reach: inventory.Public, Endpoint: "203.0.113.1:51820"}
	many.Nodes[1].Key = ""
	v = overlayGraph(many, nil)
	if v.SVG != "" || v.Nodes != BoardGraphNodes+1 || v.Public != 1 || v.NAT != BoardGraphNodes || v.Keyless != 1 {
		t.Fatalf("past %d nodes: %+v (%d bytes of SVG)", BoardGraphNodes, v, len(v.SVG))
	}
}

// BenchmarkBoard composes the board's first page, pictures and all, on a
// mesh of 1,000 nodes × 20 modules (4 assigned to each, every one
// reported ready, a day of heartbeat hours each), opening the stores as
// the command does.
//
//	go test -run '^$' -bench Board ./app/
func BenchmarkBoard(b *testing.B) {
	c := plannedMesh(b, 1000, 4, 20)
	ctx := context.Background()
	st, err := c.stores(ctx)
	if err != nil {
		b.Fatal(err)
	}
	now := c.Now()
	byNode := map[string][]health.ModuleState{}
	hours := map[health.HourKey]health.Histogram{}
	var beats []inventory.Beat
	for n := range 1000 {
		name := fmt.Sprintf("n%d", n)
		st.Inventory.MarkJoined(ctx, name, now)
		beats = append(beats, inventory.Beat{Node: name, HeardAt: now, IntervalS: 10})
		for k := range 4 {
			mod := (n + k*7) % 20
			byNode[name] = append(byNode[name], health.ModuleState{Node: name, Module: fmt.Sprintf("m%d", mod), Version: fmt.Sprintf("1.%d.0", mod),
				State: "ready", Since: now, HeardAt: now, ChangedAt: now})
		}
		for h := range boardHours {
			var hist health.Histogram
			for i := range 360 {
				hist.Add(float64(10_000 + i))
			}
			hours[health.HourKey{Node: name, Hour: now.Add(-time.Duration(h) * time.Hour)}] = hist
		}
	}
	if err := st.Inventory.RecordBeats(ctx, beats); err != nil {
		b.Fatal(err)
	}
	if err := st.Health.RecordModuleStates(ctx, byNode); err != nil {
		b.Fatal(err)
	}
	if err := st.Health.RecordHeartbeats(ctx, hours); err != nil {
		b.Fatal(err)
	}
	var buf strings.Builder
	var v BoardView
	b.ResetTimer()
	for b.Loop() {
		v, err = c.Board(ctx, BoardPage{1, 1})
		if err != nil || v.Grid.Nodes != 1000 || v.Grid.Modules != 20 || len(v.Heartbeats.Charts) != BoardCharts || v.Overlay.Nodes != 1000 {
			b.Fatalf("%d×%d grid, %d charts, overlay of %d: %v", v.Grid.Nodes, v.Grid.Modules, len(v.Heartbeats.Charts), v.Overlay.Nodes, err)
		}
		buf.Reset()
		if err := boardTemplates.ExecuteTemplate(&buf, "status.html", v); err != nil {
			b.Fatal(err)
		}
	}
	pictures := len(v.Grid.SVG) + len(v.Grid.Legend) + len(v.Overlay.SVG)
	for _, c := range v.Heartbeats.Charts {
		pictures += len(c)
	}
	b.ReportMetric(float64(buf.Len()), "page-bytes")
	b.ReportMetric(float64(pictures), "picture-bytes")
}
