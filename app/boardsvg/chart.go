package boardsvg

import "html/template"

// Point is one slot of a chart: the median and the 99th percentile of the
// intervals heard in it, in ms. Slot 0 is the oldest.
type Point struct {
	Slot     int
	P50, P99 float64
}

// The chart's size and its plot area within it.
const (
	chartW, chartH             = 260.0, 120.0
	plotL, plotR, plotT, plotB = 48.0, 252.0, 20.0, 100.0
)

// Chart draws a node's heartbeat intervals over slots slots (hours, the
// last one now) as two polylines, p50 and p99, on a linear axis from 0 to
// a round value at or above the highest p99, its values written beside it.
// A slot without a point is a gap: the lines break there, and a point
// alone is a short dash, so an hour heard between silences still shows.
// Points must be by slot; those outside 0…slots-1 are left out.
func Chart(node string, slots int, points []Point) template.HTML {
	var b svg
	b.open("chart", chartW, chartH, "heartbeat intervals of "+node+", p50 and p99 per hour over the last "+itoa(slots)+" hours")
	b.title(node + ": heartbeat intervals, p50 and p99 per hour")
	b.raw(`<text class="name" x="2" y="12">`)
	b.text(short(node, 36))
	b.raw("</text>", `<text class="key p50" x="`, num(plotR-30), `" y="12" text-anchor="end">p50</text>`,
		`<text class="key p99" x="`, num(plotR), `" y="12" text-anchor="end">p99</text>`)
	if slots < 1 {
		slots = 1
	}
	kept := points[:0:0]
	top := 0.0
	for _, p := range points {
		if p.Slot >= 0 && p.Slot < slots {
			kept = append(kept, p)
			top = max(top, p.P99, p.P50)
		}
	}
	top = niceCeil(top)
	y := func(ms float64) float64 { return plotB - (plotB-plotT)*min(max(ms, 0), top)/top }
	step := (plotR - plotL) / float64(slots)
	x := func(slot int) float64 { return plotL + step*(float64(slot)+0.5) }
	// Axes: three values up the side, the span along the bottom.
	for _, v := range []float64{0, top / 2, top} {
		b.raw(`<line class="rule" x1="`, num(plotL), `" x2="`, num(plotR), `" y1="`, num(y(v)), `" y2="`, num(y(v)), `"/>`,
			`<text class="axis" x="`, num(plotL-4), `" y="`, num(y(v)+3), `" text-anchor="end">`, esc(Duration(v)), "</text>")
	}
	b.raw(`<text class="axis" x="`, num(plotL), `" y="`, num(chartH-6), `">`, itoa(slots), ` h ago</text>`,
		`<text class="axis" x="`, num(plotR), `" y="`, num(chartH-6), `" text-anchor="end">now</text>`)
	if len(kept) == 0 {
		b.raw(`<text class="empty" x="`, num((plotL+plotR)/2), `" y="`, num((plotT+plotB)/2), `" text-anchor="middle">no intervals heard</text>`)
		return b.html()
	}
	// p99 first, broader, p50 over it: where they meet, both show.
	for _, line := range []struct {
		class string
		at    func(Point) float64
	}{{"p99", func(p Point) float64 { return p.P99 }}, {"p50", func(p Point) float64 { return p.P50 }}} {
		for start := 0; start < len(kept); {
			end := start + 1
			for end < len(kept) && kept[end].Slot == kept[end-1].Slot+1 {
				end++
			}
			b.raw(`<polyline class="`, line.class, `" points="`)
			if end-start == 1 {
				p := kept[start]
				b.raw(num(x(p.Slot)-step/3), ",", num(y(line.at(p))), " ", num(x(p.Slot)+step/3), ",", num(y(line.at(p))))
			} else {
				for i, p := range kept[start:end] {
					if i > 0 {
						b.raw(" ")
					}
					b.raw(num(x(p.Slot)), ",", num(y(line.at(p))))
				}
			}
			b.raw(`"/>`)
			start = end
		}
	}
	return b.html()
}
