package boardsvg

import (
	"html/template"
	"math"
)

// Kinds of overlay node and link, each drawn with a class of its name.
const (
	// NodeRelay is the node NAT'd nodes reach the others through.
	NodeRelay = "relay"
	// NodePublic is dialled from anywhere at its endpoint.
	NodePublic = "public"
	// NodeNAT is behind NAT (or not placed).
	NodeNAT = "nat"
	// NodeOut takes no part: no key, no address, or a key another holds.
	NodeOut = "out"

	// LinkDirect is a pair of peers, each dialling the other or one the other.
	LinkDirect = "direct"
	// LinkRelay is a peer of the relay that the relay forwards for.
	LinkRelay = "relayed"
	// LinkSilent is a pair one of whose hosts has not heard the other lately.
	LinkSilent = "silent"
)

// GraphNode is one node of the overlay; Detail is said on hover after its
// name (its addresses, what keeps it out).
type GraphNode struct{ Name, Kind, Detail string }

// GraphEdge joins Nodes[A] and Nodes[B].
type GraphEdge struct {
	A, B int
	Kind string
}

// LabelsUpTo is the most nodes whose names the graph writes beside them;
// past it, names are said on hover only.
const LabelsUpTo = 40

// Graph draws the overlay: its nodes on a circle in the order given
// (callers sort them by name, so a node keeps its place from one look to
// the next), one circle.node each, and a line per edge beneath them.
func Graph(nodes []GraphNode, edges []GraphEdge) template.HTML {
	n := len(nodes)
	// Room for each node on the circle (and its name, up to LabelsUpTo),
	// bounded either way.
	dot, room := 6.0, 26.0
	if n > 60 {
		dot, room = 4, 12
	}
	r := min(max(float64(n)*room/(2*math.Pi), 80), 420)
	margin := 16.0
	if n <= LabelsUpTo {
		margin = 8 + charW*float64(min(maxLen(nodes), labelChars))
	}
	c := r + margin
	at := func(i int) (float64, float64, float64) {
		a := 2*math.Pi*float64(i)/float64(max(n, 1)) - math.Pi/2
		return c + r*math.Cos(a), c + r*math.Sin(a), a
	}
	var b svg
	b.open("graph", 2*c, 2*c, "the overlay: "+itoa(n)+" nodes, "+itoa(len(edges))+" links")
	for _, e := range edges {
		if e.A < 0 || e.A >= n || e.B < 0 || e.B >= n {
			continue
		}
		x1, y1, _ := at(e.A)
		x2, y2, _ := at(e.B)
		b.raw(`<line class="link `, linkClass(e.Kind), `" x1="`, num(x1), `" y1="`, num(y1), `" x2="`, num(x2), `" y2="`, num(y2), `">`)
		b.title(nodes[e.A].Name + " — " + nodes[e.B].Name + ": " + e.Kind)
		b.raw("</line>")
	}
	for i, nd := range nodes {
		x, y, a := at(i)
		b.raw(`<circle class="node `, nodeClass(nd.Kind), `" cx="`, num(x), `" cy="`, num(y), `" r="`, num(dot), `">`)
		t := nd.Name + " (" + nd.Kind + ")"
		if nd.Detail != "" {
			t += ": " + nd.Detail
		}
		b.title(t)
		b.raw("</circle>")
		if n <= LabelsUpTo {
			// Beside the node, away from the centre.
			lx, ly := x+(dot+3)*math.Cos(a), y+(dot+3)*math.Sin(a)+4
			anchor := "start"
			if math.Cos(a) < -1e-9 {
				anchor = "end"
			} else if math.Abs(math.Cos(a)) <= 1e-9 {
				anchor = "middle"
				if math.Sin(a) < 0 {
					ly -= 4
				} else {
					ly += 6
				}
			}
			b.raw(`<text class="label" x="`, num(lx), `" y="`, num(ly), `" text-anchor="`, anchor, `">`, esc(short(nd.Name, labelChars)), "</text>")
		}
	}
	return b.html()
}

func maxLen(nodes []GraphNode) int {
	n := 1
	for _, nd := range nodes {
		n = max(n, len([]rune(nd.Name)))
	}
	return n
}

// nodeClass and linkClass are the classes of kinds (n-relay, l-silent),
// kept to those the style sheet knows.
func nodeClass(kind string) string {
	switch kind {
	case NodeRelay, NodePublic, NodeNAT:
		return "n-" + kind
	}
	return "n-" + NodeOut
}

func linkClass(kind string) string {
	switch kind {
	case LinkRelay, LinkSilent:
		return "l-" + kind
	}
	return "l-" + LinkDirect
}

// GraphLegend names the kinds of node and link the graph draws.
func GraphLegend() template.HTML {
	var b svg
	for _, k := range []struct{ class, label string }{{NodeRelay, "relay"}, {NodePublic, "public"}, {NodeNAT, "behind NAT"}, {NodeOut, "left out"}} {
		b.key(`<circle class="swatch `+nodeClass(k.class)+`" cx="7" cy="6" r="5"/>`, k.label)
	}
	for _, k := range []struct{ class, label string }{{LinkDirect, "direct"}, {LinkRelay, "through the relay"}, {LinkSilent, "silent"}} {
		b.key(`<line class="swatch `+linkClass(k.class)+`" x1="0" y1="6" x2="14" y2="6"/>`, k.label)
	}
	return template.HTML(b.String())
}
