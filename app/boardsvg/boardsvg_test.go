package boardsvg

import (
	"encoding/xml"
	"html/template"
	"io"
	"math"
	"strconv"
	"strings"
	"testing"
)

// element is one element of a picture, as an XML parser reads it.
type element struct {
	name  string
	attrs map[string]string
	// text is its own character data; title that of its <title> child.
	text, title string
}

// parse reads a picture as XML (it must be well formed: a name that broke
// out of its attribute or text would not be) into its elements, in order.
func parse(t *testing.T, h template.HTML) []*element {
	t.Helper()
	d := xml.NewDecoder(strings.NewReader(string(h)))
	var out, open []*element
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well formed: %v\n%s", err, h)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			e := &element{name: tok.Name.Local, attrs: map[string]string{}}
			for _, a := range tok.Attr {
				e.attrs[a.Name.Local] = a.Value
			}
			out, open = append(out, e), append(open, e)
		case xml.EndElement:
			open = open[:len(open)-1]
		case xml.CharData:
			if len(open) == 0 {
				continue
			}
			e := open[len(open)-1]
			e.text += string(tok)
			if e.name == "title" && len(open) > 1 {
				open[len(open)-2].title += string(tok)
			}
		}
	}
	return out
}

// having are the elements named name whose class holds class ("" for any).
func having(es []*element, name, class string) []*element {
	var out []*element
	for _, e := range es {
		if e.name == name && (class == "" || strings.Contains(" "+e.attrs["class"]+" ", " "+class+" ")) {
			out = append(out, e)
		}
	}
	return out
}

// coords are a polyline's points.
func coords(t *testing.T, e *element) [][2]float64 {
	t.Helper()
	var out [][2]float64
	for _, p := range strings.Fields(e.attrs["points"]) {
		x, y, ok := strings.Cut(p, ",")
		fx, err1 := strconv.ParseFloat(x, 64)
		fy, err2 := strconv.ParseFloat(y, 64)
		if !ok || err1 != nil || err2 != nil {
			t.Fatalf("point %q of %q", p, e.attrs["points"])
		}
		out = append(out, [2]float64{fx, fy})
	}
	return out
}

// A chart scales from 0 to a round value at or above the highest p99,
// says so on its axis, breaks its lines where an hour is missing, and
// draws a lone hour as a dash; with nothing heard, it says so.
func TestChart(t *testing.T) {
	t.Run("empty", func(t *testing.T) {
		es := parse(t, Chart("web1", 24, nil))
		if n := len(having(es, "polyline", "")); n != 0 {
			t.Fatalf("%d polylines with no data", n)
		}
		if !hasText(es, "no intervals heard") || !hasText(es, "1 ms") || !hasText(es, "24 h ago") || !hasText(es, "now") {
			t.Fatalf("texts %v", texts(es))
		}
	})
	t.Run("one point", func(t *testing.T) {
		es := parse(t, Chart("web1", 24, []Point{{Slot: 23, P50: 1000, P99: 1800}}))
		p50, p99 := having(es, "polyline", "p50"), having(es, "polyline", "p99")
		if len(p50) != 1 || len(p99) != 1 {
			t.Fatalf("%d p50 and %d p99 polylines", len(p50), len(p99))
		}
		a, b := coords(t, p99[0]), coords(t, p50[0])
		// A dash at the top (1.8 s of a 2 s axis) in the last slot.
		if len(a) != 2 || a[0][1] != a[1][1] || a[0][0] >= a[1][0] || a[1][0] > plotR {
			t.Fatalf("p99 %v", a)
		}
		if want := plotB - (plotB-plotT)*0.9; a[0][1] != want || b[0][1] != plotB-(plotB-plotT)*0.5 {
			t.Fatalf("p99 at y %v (want %v), p50 at %v", a[0][1], want, b[0][1])
		}
		if !hasText(es, "2 s") || !hasText(es, "1 s") || !hasText(es, "0 ms") {
			t.Fatalf("axis %v", texts(es))
		}
	})
	t.Run("gaps", func(t *testing.T) {
		pts := []Point{{0, 100, 200}, {1, 100, 400}, {2, 100, 300}, {5, 90, 95}, {6, 90, 95}, {24, 1e9, 1e9}, {-1, 1e9, 1e9}}
		es := parse(t, Chart("web1", 24, pts))
		p99 := having(es, "polyline", "p99")
		if len(p99) != 2 || len(coords(t, p99[0])) != 3 || len(coords(t, p99[1])) != 2 {
			t.Fatalf("p99 lines %v", p99)
		}
		// The slots out of range do not scale the axis: 400 → 500 ms.
		if !hasText(es, "500 ms") || coords(t, p99[0])[1][1] != plotB-(plotB-plotT)*0.8 {
			t.Fatalf("axis %v, p99 %v", texts(es), coords(t, p99[0]))
		}
		// Slots left to right, evenly.
		c := coords(t, p99[0])
		if !(c[0][0] < c[1][0] && c[1][0] < c[2][0]) || math.Abs((c[1][0]-c[0][0])-(c[2][0]-c[1][0])) > 0.21 {
			t.Fatalf("x %v", c)
		}
	})
}

func hasText(es []*element, s string) bool {
	for _, e := range es {
		if e.name == "text" && strings.TrimSpace(e.text) == s {
			return true
		}
	}
	return false
}

func texts(es []*element) []string {
	var out []string
	for _, e := range es {
		if e.name == "text" {
			out = append(out, e.text)
		}
	}
	return out
}

func TestNiceCeil(t *testing.T) {
	for _, c := range []struct{ in, want float64 }{
		{0, 1}, {-3, 1}, {0.3, 0.5}, {1, 1}, {1.01, 2}, {2, 2}, {2.2, 2.5}, {3, 5}, {7, 10}, {10, 10}, {1800, 2000}, {30000, 50000}, {0.2, 0.2},
	} {
		if got := niceCeil(c.in); got != c.want {
			t.Errorf("niceCeil(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestDuration(t *testing.T) {
	for _, c := range []struct {
		ms   float64
		want string
	}{{0, "0 ms"}, {12.34, "12.3 ms"}, {999, "999 ms"}, {1000, "1 s"}, {1500, "1.5 s"}, {90_000, "1.5 min"}, {7_200_000, "2 h"}} {
		if got := Duration(c.ms); got != c.want {
			t.Errorf("Duration(%v) = %q, want %q", c.ms, got, c.want)
		}
	}
}

// The grid has a cell per node and module, each coloured by its state and
// titled with node, module, state and version; the legend counts them.
func TestModuleGrid(t *testing.T) {
	g := Grid{Nodes: []string{"web1", "web2"}, Modules: []string{"paperless", "postgres", "redis"}, Cells: [][]Cell{
		{{"ready", "2.1.0"}, {"failed", "16.4.0"}, {}},
		{{Absent, "2.1.0"}, {"backing-off", "16.4.0"}, {"dreaming", "7.0.0"}},
	}}
	es := parse(t, ModuleGrid(g))
	cells := having(es, "rect", "cell")
	if len(cells) != 6 {
		t.Fatalf("%d cells, want 6", len(cells))
	}
	want := []struct{ class, title string }{
		{"st-ready", "web1 / paperless: ready, 2.1.0"}, {"st-failed", "web1 / postgres: failed, 16.4.0"}, {"st-none", "web1 / redis: not assigned"},
		{"st-absent", "web2 / paperless: assigned 2.1.0, its host reports nothing of it"}, {"st-backing-off", "web2 / postgres: backing-off, 16.4.0"},
		{"st-other", "web2 / redis: dreaming, 7.0.0"},
	}
	for i, w := range want {
		if c := cells[i]; c.attrs["class"] != "cell "+w.class || c.title != w.title {
			t.Errorf("cell %d: class %q title %q, want %q %q", i, c.attrs["class"], c.title, "cell "+w.class, w.title)
		}
	}
	// Rows down, columns across.
	if cells[0].attrs["y"] != cells[2].attrs["y"] || cells[0].attrs["x"] != cells[3].attrs["x"] || cells[0].attrs["y"] == cells[3].attrs["y"] {
		t.Fatalf("layout: %v %v %v", cells[0].attrs, cells[2].attrs, cells[3].attrs)
	}
	legend := parse(t, "<p>"+Legend(map[string]int{"ready": 4, "failed": 1, NotAssigned: 2})+"</p>")
	if sw := having(legend, "rect", "swatch"); len(sw) != 3 || len(having(legend, "rect", "cell")) != 0 {
		t.Fatalf("legend swatches %d", len(sw))
	}
	var text string
	for _, e := range legend {
		text += e.text
	}
	if !strings.Contains(text, "ready 4") || !strings.Contains(text, "failed 1") || !strings.Contains(text, "not assigned 2") {
		t.Fatalf("legend %q", text)
	}
}

// The graph puts a circle per node on a circle in the order given, a line
// per edge, names beside the nodes up to LabelsUpTo.
func TestGraph(t *testing.T) {
	nodes := []GraphNode{{"a", NodeRelay, ""}, {"b", NodeNAT, ""}, {"c", NodePublic, ""}, {"d", NodeOut, "no WireGuard key"}}
	edges := []GraphEdge{{0, 1, LinkRelay}, {0, 2, LinkDirect}, {1, 2, LinkSilent}, {0, 9, LinkDirect}}
	es := parse(t, Graph(nodes, edges))
	circles, lines := having(es, "circle", "node"), having(es, "line", "link")
	if len(circles) != 4 || len(lines) != 3 || len(having(es, "text", "label")) != 4 {
		t.Fatalf("%d circles, %d lines, %d labels", len(circles), len(lines), len(having(es, "text", "label")))
	}
	if circles[3].attrs["class"] != "node n-out" || circles[3].title != "d (out): no WireGuard key" || lines[2].attrs["class"] != "link l-silent" {
		t.Fatalf("classes %v %q %v", circles[3].attrs, circles[3].title, lines[2].attrs)
	}
	// The first node at the top, the others clockwise.
	f := func(e *element, k string) float64 { v, _ := strconv.ParseFloat(e.attrs[k], 64); return v }
	if f(circles[0], "cx") != f(circles[2], "cx") || f(circles[0], "cy") >= f(circles[2], "cy") || f(circles[1], "cx") <= f(circles[0], "cx") {
		t.Fatalf("layout %v %v", circles[0].attrs, circles[2].attrs)
	}
	// Drawn twice, the same bytes.
	if Graph(nodes, edges) != Graph(nodes, edges) {
		t.Fatal("the graph is not deterministic")
	}
	many := make([]GraphNode, LabelsUpTo+1)
	for i := range many {
		many[i] = GraphNode{Name: "n" + strconv.Itoa(i), Kind: NodeNAT}
	}
	es = parse(t, Graph(many, nil))
	if len(having(es, "circle", "node")) != LabelsUpTo+1 || len(having(es, "text", "label")) != 0 {
		t.Fatalf("past %d nodes: %d circles, %d labels", LabelsUpTo, len(having(es, "circle", "node")), len(having(es, "text", "label")))
	}
	if es := parse(t, Graph(nil, nil)); len(having(es, "circle", "")) != 0 {
		t.Fatal("circles with no node")
	}
	legend := parse(t, "<p>"+GraphLegend()+"</p>")
	if len(having(legend, "circle", "node")) != 0 || len(having(legend, "line", "link")) != 0 || len(having(legend, "circle", "swatch")) != 4 {
		t.Fatal("the legend's swatches pass for the graph's nodes or links")
	}
}

// Every name, version and detail is escaped: one holding markup or quotes
// stays text, in an element's content as in its title.
func TestEscaping(t *testing.T) {
	const evil = `<script>alert("x")</script>' onmouseover='alert(1)&amp;`
	pictures := map[string]template.HTML{
		"chart": Chart(evil, 24, []Point{{Slot: 3, P50: 1, P99: 2}}),
		"grid":  ModuleGrid(Grid{Nodes: []string{evil}, Modules: []string{evil}, Cells: [][]Cell{{{State: evil, Version: evil}}}}),
		"graph": Graph([]GraphNode{{evil, evil, evil}, {"b", NodeNAT, ""}}, []GraphEdge{{0, 1, evil}}),
	}
	for name, h := range pictures {
		if strings.Contains(string(h), "<script") || strings.Contains(string(h), "onmouseover='") {
			t.Errorf("%s: markup got through:\n%s", name, h)
		}
		es := parse(t, h)
		found := false
		for _, e := range es {
			for k, v := range e.attrs {
				if strings.HasPrefix(k, "on") {
					t.Errorf("%s: attribute %s=%q", name, k, v)
				}
			}
			if e.name == "script" {
				t.Errorf("%s: a script element", name)
			}
			found = found || strings.Contains(e.title, evil)
		}
		if !found {
			t.Errorf("%s: no title holds the name as it is", name)
		}
	}
	// A state a host made up is coloured as other, never as a class it chose.
	if es := parse(t, pictures["grid"]); having(es, "rect", "cell")[0].attrs["class"] != "cell st-other" {
		t.Fatalf("class %q", having(es, "rect", "cell")[0].attrs["class"])
	}
}
