package boardsvg

import (
	"html/template"
	"math"

	"mesh-controller/app/protocol"
)

// Cell states besides those hosts report.
const (
	// Absent is a module assigned to a node whose host reports nothing of it.
	Absent = "absent"
	// NotAssigned is a module neither assigned to a node nor reported by it.
	NotAssigned = ""
	// Other is any state a host reports that the grid does not know.
	Other = "other"
)

// State is one state the grid colours, as its legend names it.
type State struct{ State, Label string }

// States are the states the grid colours, in the legend's order: those
// hosts report (protocol), then the grid's own.
var States = []State{
	{protocol.StateReady, "ready"},
	{protocol.StateStarting, "starting"},
	{protocol.StateWaiting, "waiting for secrets"},
	{protocol.StateBackingOff, "backing off"},
	{protocol.StateCrashLooping, "crash-looping"},
	{protocol.StateFailed, "failed"},
	{protocol.StateStopped, "stopped"},
	{Absent, "assigned, not reported"},
	{Other, "other"},
	{NotAssigned, "not assigned"},
}

// known are the states with a colour of their own.
var known = func() map[string]bool {
	m := map[string]bool{}
	for _, s := range States {
		m[s.State] = true
	}
	return m
}()

// Kind is the state a cell is coloured as: its own if the grid knows it,
// else Other.
func Kind(state string) string {
	if known[state] {
		return state
	}
	return Other
}

// class is a state's class: st-ready; st-none for NotAssigned.
func class(state string) string {
	if state == NotAssigned {
		return "st-none"
	}
	return "st-" + Kind(state)
}

// Cell is one node's module: its state, and the version reported (or
// assigned, when Absent).
type Cell struct{ State, Version string }

// Grid is nodes × modules, Cells[node][module].
type Grid struct {
	Nodes, Modules []string
	Cells          [][]Cell
}

// The grid's pitch, the size of a character in its labels, the longest
// label drawn whole.
const (
	pitch, cell = 14, 12.0
	charW       = 6.6
	labelChars  = 24
)

// ModuleGrid draws one rect.cell per node and module, a row per node and a
// column per module (rows and columns in the order given), each coloured by its state (a class st-<state>) and
// titled with the node, module, state and version.
func ModuleGrid(g Grid) template.HTML {
	longest := func(names []string) float64 {
		n := 1
		for _, s := range names {
			n = max(n, len([]rune(short(s, labelChars))))
		}
		return float64(n) * charW
	}
	// Whole pixels: the cells' coordinates are written as integers.
	x0 := math.Ceil(longest(g.Nodes) + 8)
	// Module names stand upright above their columns: at a slant, a
	// pitch of 14 would put them closer than their own height.
	y0 := math.Ceil(longest(g.Modules) + 8)
	w := x0 + float64(pitch*len(g.Modules)) + 4
	h := y0 + float64(pitch*len(g.Nodes)) + 2
	var b svg
	b.open("grid", w, h, "module states: "+itoa(len(g.Nodes))+" nodes by "+itoa(len(g.Modules))+" modules")
	for j, m := range g.Modules {
		// The glyphs stand left of the baseline once turned: it runs a
		// little right of the column's middle.
		x, y := x0+float64(pitch*j)+cell/2+4, y0-4
		b.raw(`<text class="col" transform="translate(`, num(x), " ", num(y), `) rotate(-90)">`)
		b.title(m)
		b.text(short(m, labelChars))
		b.raw("</text>")
	}
	for i, n := range g.Nodes {
		y := y0 + float64(pitch*i)
		b.raw(`<text class="row" x="`, num(x0-4), `" y="`, num(y+cell-2), `" text-anchor="end">`)
		b.title(n)
		b.text(short(n, labelChars))
		b.raw("</text>")
		for j, m := range g.Modules {
			c := g.Cells[i][j]
			b.raw(`<rect class="cell `, class(c.State), `" x="`, itoa(int(x0)+pitch*j), `" y="`, itoa(int(y)), `" width="12" height="12">`)
			b.title(cellTitle(n, m, c))
			b.raw("</rect>")
		}
	}
	return b.html()
}

// cellTitle names the node, module, state and version of a cell.
func cellTitle(node, module string, c Cell) string {
	s := node + " / " + module + ": "
	switch c.State {
	case NotAssigned:
		return s + "not assigned"
	case Absent:
		return s + "assigned " + c.Version + ", its host reports nothing of it"
	}
	if c.Version != "" {
		return s + c.State + ", " + c.Version
	}
	return s + c.State
}

// Legend draws each state's swatch and label with how many cells are in
// it (counts by Kind), leaving out states no cell is in.
func Legend(counts map[string]int) template.HTML {
	var b svg
	for _, s := range States {
		n := counts[s.State]
		if n == 0 {
			continue
		}
		b.key(`<rect class="swatch `+class(s.State)+`" width="12" height="12"/>`, s.Label+" "+itoa(n))
	}
	return template.HTML(b.String())
}

// key writes one entry of a legend: a swatch, its label, and a count
// when there is one.
func (b *svg) key(swatch, label string) {
	b.raw(`<span class="key"><svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 14 12" width="14" height="12" aria-hidden="true">`, swatch, `</svg> `, esc(label), "</span> ")
}
