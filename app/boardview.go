package app

import (
	"context"
	"html/template"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"mesh-controller/app/boardsvg"
	"mesh-controller/app/overlay"
	"mesh-controller/contexts/health"
	"mesh-controller/contexts/inventory"
)

// What the board's pictures draw at most: past it a picture pages or
// summarises, so that the page stays quick to compose and to read.
const (
	// BoardCharts is the most heartbeat charts drawn; past it, those of
	// the nodes whose p99 over the day is highest.
	BoardCharts = 48
	// BoardGridNodes and BoardGridModules are the rows and columns of one
	// page of the module grid.
	BoardGridNodes, BoardGridModules = 100, 50
	// BoardGraphNodes is the most nodes the overlay graph draws; past it,
	// the overlay is counted, not drawn.
	BoardGraphNodes = 200
	// BoardGraphLinks is the most links the graph draws; past it, only the
	// links to the relay and the silent ones are.
	BoardGraphLinks = 3000
	// boardHours is the span of a heartbeat chart, an hour a point.
	boardHours = 24
)

// BoardPage is which page of the module grid to draw, from 1, by rows
// (nodes) and columns (modules).
type BoardPage struct{ Nodes, Modules int }

// ParseBoardPage reads a page from the board's query (?nodes=2&modules=1);
// what is missing or not a number is page 1, and a page past the last is
// the last (a bookmark outlives the nodes it paged through).
func ParseBoardPage(q url.Values) BoardPage {
	n := func(k string) int {
		v, err := strconv.Atoi(q.Get(k))
		if err != nil || v < 1 {
			return 1
		}
		return v
	}
	return BoardPage{Nodes: n("nodes"), Modules: n("modules")}
}

// BoardView is the board's first page: the three questions, and pictures
// of the heartbeats, the module states and the overlay.
type BoardView struct {
	StatusView
	Heartbeats BoardHeartbeats
	Grid       BoardGrid
	Overlay    BoardOverlay
}

// BoardHeartbeats are the heartbeat charts: the p50 and p99 of each
// node's intervals per hour over the last day.
type BoardHeartbeats struct {
	Charts []template.HTML
	// Nodes is how many nodes have a chart due (the joined ones);
	// Longest says there were more than BoardCharts, and the charts
	// drawn are of those whose longest interval of the day is longest,
	// longest first (otherwise they are by name).
	Nodes   int
	Longest bool
}

// BoardGrid is one page of the module grid, with its legend counting
// every cell of the mesh, not only the page's.
type BoardGrid struct {
	SVG, Legend    template.HTML
	Nodes, Modules int
	// Page, Pages are by nodes then modules; First…Last are the rows
	// and columns drawn, from 1.
	Page, Pages                                  BoardPage
	FirstNode, LastNode, FirstModule, LastModule int
}

// Link is the query of the page dn rows and dm columns away, "" if none.
func (g BoardGrid) Link(dn, dm int) string {
	p := BoardPage{Nodes: g.Page.Nodes + dn, Modules: g.Page.Modules + dm}
	if p.Nodes < 1 || p.Nodes > g.Pages.Nodes || p.Modules < 1 || p.Modules > g.Pages.Modules || (dn == 0 && dm == 0) {
		return ""
	}
	return "?nodes=" + strconv.Itoa(p.Nodes) + "&modules=" + strconv.Itoa(p.Modules)
}

// BoardOverlay is the overlay as a graph or, past BoardGraphNodes, counted.
type BoardOverlay struct {
	// SVG is "" when the overlay is counted instead.
	SVG, Legend template.HTML
	Nodes       int
	// Public, NAT (behind NAT or not placed) and Keyless count the nodes.
	Public, NAT, Keyless int
	Relay                string
	// Links are the pairs of peers, Drawn those drawn, Silent those one of
	// whose hosts has not heard the other lately.
	Links, Drawn, Silent int
}

// Board reads what the board's first page shows, afresh.
func (c *Health) Board(ctx context.Context, page BoardPage) (BoardView, error) {
	sv, read, err := c.status(ctx)
	v := BoardView{StatusView: sv}
	if err != nil {
		return v, err
	}
	st, err := c.stores(ctx)
	if err != nil {
		return v, err
	}
	now := c.Now()
	o, err := st.Inventory.ReadOverlay(ctx)
	if err != nil {
		return v, err
	}
	joined, err := st.Inventory.JoinedNodes(ctx)
	if err != nil {
		return v, err
	}
	first := now.UTC().Truncate(time.Hour).Add(-(boardHours - 1) * time.Hour)
	charted, err := chartedNodes(ctx, st.Health, joined, first)
	if err != nil {
		return v, err
	}
	hours, err := st.Health.HeartbeatHours(ctx, first, charted)
	if err != nil {
		return v, err
	}
	silent, err := st.Inventory.SilentPeers(ctx)
	if err != nil {
		return v, err
	}
	v.Heartbeats = BoardHeartbeats{Nodes: len(joined), Longest: len(charted) < len(joined)}
	for _, s := range heartbeatSeries(hours, charted, first) {
		v.Heartbeats.Charts = append(v.Heartbeats.Charts, boardsvg.Chart(s.Node, boardHours, s.Points))
	}
	names := make([]string, len(o.Nodes))
	for i, n := range o.Nodes {
		names[i] = n.Name
	}
	v.Grid = moduleGrid(names, read.snap.Assignments, read.states, page)
	v.Overlay = overlayGraph(o, silent)
	return v, nil
}

// nodeSeries is one node's heartbeat intervals per hour.
type nodeSeries struct {
	Node   string
	Points []boardsvg.Point
}

// heartbeatSeries reads each hour's p50 and p99 from its histogram, slot 0
// being the hour first, for each node of nodes in its order (a node with
// no hour heard has a series without points); hours outside the day, and
// of other nodes, are left out.
func heartbeatSeries(hours []health.HourHistogram, nodes []string, first time.Time) []nodeSeries {
	out := make([]nodeSeries, len(nodes))
	at := make(map[string]int, len(nodes))
	for i, n := range nodes {
		out[i].Node, at[n] = n, i
	}
	for _, h := range hours {
		slot := int(h.Hour.Sub(first) / time.Hour)
		i, ok := at[h.Node]
		if !ok || h.Hour.Before(first) || slot >= boardHours || h.Count == 0 {
			continue
		}
		out[i].Points = append(out[i].Points, boardsvg.Point{Slot: slot, P50: h.Quantile(0.5), P99: h.Quantile(0.99)})
	}
	for _, s := range out {
		sort.Slice(s.Points, func(i, j int) bool { return s.Points[i].Slot < s.Points[j].Slot })
	}
	return out
}

// chartedNodes are the joined nodes with a chart: all of them up to
// BoardCharts, else those whose longest interval of the day is longest,
// longest first (then by name). Past BoardCharts the store finds each
// node's longest interval, so that only the charted nodes' hours are read.
func chartedNodes(ctx context.Context, hs *health.Store, joined []string, since time.Time) ([]string, error) {
	if len(joined) <= BoardCharts {
		return joined, nil
	}
	longest, err := hs.HeartbeatLongest(ctx, since)
	if err != nil {
		return nil, err
	}
	out := slices.Clone(joined)
	sort.Strings(out)
	sort.SliceStable(out, func(i, j int) bool { return longest[out[i]] > longest[out[j]] })
	return out[:BoardCharts], nil
}

// moduleGrid draws one page of nodes × modules: the modules are those
// assigned or reported anywhere, by name, the nodes every node, by name.
func moduleGrid(nodes []string, assigned []inventory.Assignment, states []health.ModuleState, page BoardPage) BoardGrid {
	type at struct{ node, module string }
	cells := make(map[at]boardsvg.Cell, len(assigned)+len(states))
	modules := map[string]bool{}
	for _, a := range assigned {
		cells[at{a.Node, a.Module}] = boardsvg.Cell{State: boardsvg.Absent, Version: a.Version}
		modules[a.Module] = true
	}
	for _, s := range states {
		cells[at{s.Node, s.Module}] = boardsvg.Cell{State: s.State, Version: s.Version}
		modules[s.Module] = true
	}
	mods := make([]string, 0, len(modules))
	for m := range modules {
		mods = append(mods, m)
	}
	sort.Strings(mods)
	isNode := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		isNode[n] = true
	}
	// Every cell of the mesh counted, not only the page's: those not
	// assigned are what no other is.
	counts := map[string]int{}
	for k, c := range cells {
		if isNode[k.node] {
			counts[boardsvg.Kind(c.State)]++
		}
	}
	drawn := 0
	for _, n := range counts {
		drawn += n
	}
	counts[boardsvg.NotAssigned] = len(nodes)*len(mods) - drawn

	pages := func(n, per int) int { return max(1, (n+per-1)/per) }
	g := BoardGrid{Nodes: len(nodes), Modules: len(mods), Legend: boardsvg.Legend(counts),
		Pages: BoardPage{Nodes: pages(len(nodes), BoardGridNodes), Modules: pages(len(mods), BoardGridModules)}}
	g.Page = BoardPage{Nodes: min(page.Nodes, g.Pages.Nodes), Modules: min(page.Modules, g.Pages.Modules)}
	n0, m0 := (g.Page.Nodes-1)*BoardGridNodes, (g.Page.Modules-1)*BoardGridModules
	rows, cols := nodes[n0:min(n0+BoardGridNodes, len(nodes))], mods[m0:min(m0+BoardGridModules, len(mods))]
	g.FirstNode, g.LastNode, g.FirstModule, g.LastModule = n0+1, n0+len(rows), m0+1, m0+len(cols)
	grid := boardsvg.Grid{Nodes: rows, Modules: cols, Cells: make([][]boardsvg.Cell, len(rows))}
	for i, n := range rows {
		grid.Cells[i] = make([]boardsvg.Cell, len(cols))
		for j, m := range cols {
			grid.Cells[i][j] = cells[at{n, m}]
		}
	}
	if len(rows) > 0 && len(cols) > 0 {
		g.SVG = boardsvg.ModuleGrid(grid)
	}
	return g
}

// overlayGraph draws the overlay as computed (overlay show), each pair
// of peers a link; past BoardGraphNodes it only counts the nodes, without
// computing the overlay.
func overlayGraph(o inventory.Overlay, silent []inventory.SilentPeer) BoardOverlay {
	v := BoardOverlay{Nodes: len(o.Nodes), Legend: boardsvg.GraphLegend()}
	if len(o.Nodes) > BoardGraphNodes {
		for _, n := range o.Nodes {
			if n.Placement.Reach == inventory.Public {
				v.Public++
			} else {
				v.NAT++
			}
			if n.Key == "" {
				v.Keyless++
			}
		}
		return v
	}
	m := overlay.Compute(o)
	v.Relay = m.Relay
	index := make(map[string]int, len(m.Nodes))
	nodes := make([]boardsvg.GraphNode, len(m.Nodes))
	for i, n := range m.Nodes {
		index[n.Node] = i
		g := boardsvg.GraphNode{Name: n.Node, Kind: boardsvg.NodeNAT, Detail: strings.TrimSpace(n.Address4 + " " + n.Endpoint)}
		switch {
		case m.Declared[n.Node] == nil:
			g.Kind, g.Detail = boardsvg.NodeOut, strings.Join(n.Missing, "; ")
			v.Keyless++
		case n.Node == m.Relay:
			g.Kind = boardsvg.NodeRelay
		case n.Reach == string(inventory.Public):
			g.Kind = boardsvg.NodePublic
		}
		if n.Reach == string(inventory.Public) {
			v.Public++
		} else {
			v.NAT++
		}
		nodes[i] = g
	}
	quiet := map[[2]int]bool{}
	for _, s := range silent {
		a, okA := index[s.Node]
		b, okB := index[s.Peer]
		if okA && okB {
			quiet[[2]int{min(a, b), max(a, b)}] = true
		}
	}
	links := map[[2]int]string{}
	for a, n := range m.Nodes {
		for _, p := range n.Peers {
			b, ok := index[p.Node]
			if !ok || a == b {
				continue
			}
			k := [2]int{min(a, b), max(a, b)}
			kind := links[k]
			if kind == "" {
				kind = boardsvg.LinkDirect
			}
			if len(p.Via) > 0 || p.Relays {
				kind = boardsvg.LinkRelay
			}
			links[k] = kind
		}
	}
	edges := make([]boardsvg.GraphEdge, 0, len(links))
	for k, kind := range links {
		if quiet[k] {
			kind = boardsvg.LinkSilent
			v.Silent++
		}
		edges = append(edges, boardsvg.GraphEdge{A: k[0], B: k[1], Kind: kind})
	}
	v.Links = len(edges)
	if len(edges) > BoardGraphLinks {
		relay, hasRelay := index[m.Relay]
		kept := edges[:0]
		for _, e := range edges {
			if e.Kind != boardsvg.LinkDirect || (hasRelay && (e.A == relay || e.B == relay)) {
				kept = append(kept, e)
			}
		}
		edges = kept
	}
	// Drawn in one order whatever the map's: the page does not flicker.
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].A != edges[j].A {
			return edges[i].A < edges[j].A
		}
		return edges[i].B < edges[j].B
	})
	v.Drawn = len(edges)
	v.SVG = boardsvg.Graph(nodes, edges)
	return v
}
