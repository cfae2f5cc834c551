// Package boardsvg draws the board's pictures as SVG, put inline in its
// page: a chart of one node's heartbeat intervals, the grid of module
// states, the overlay as a graph. Each is a pure function of plain values
// (no store, no clock): every name and version in them is escaped, and
// each draws exactly what it is given, the board deciding how much that is.
// The pictures carry classes, never colours: the page's style sheet (the
// only one its Content-Security-Policy allows) colours them.
package boardsvg

import (
	"html/template"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// svg builds one picture: every text put in goes through esc.
type svg struct{ strings.Builder }

// esc escapes text for an SVG element's content or a double-quoted
// attribute inside HTML: < > & ' " and NUL.
func esc(s string) string { return template.HTMLEscapeString(s) }

// num writes a coordinate: one decimal is finer than a pixel.
func num(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

func itoa(i int) string { return strconv.Itoa(i) }

// raw writes markup the package itself made.
func (b *svg) raw(parts ...string) {
	for _, p := range parts {
		b.WriteString(p)
	}
}

// text writes an escaped text.
func (b *svg) text(s string) { b.WriteString(esc(s)) }

// title writes a <title> child: what a browser shows on hover, and what a
// screen reader reads.
func (b *svg) title(s string) { b.raw("<title>", esc(s), "</title>") }

// open writes the root element of a picture w × h, scaled down with the
// page (the style sheet's max-width), labelled for screen readers.
func (b *svg) open(class string, w, h float64, label string) {
	b.raw(`<svg xmlns="http://www.w3.org/2000/svg" class="`, class, `" viewBox="0 0 `, num(w), " ", num(h),
		`" width="`, num(w), `" height="`, num(h), `" role="img" aria-label="`, esc(label), `">`)
}

// html is the picture as a page may include it: everything in it was
// escaped as it was written.
func (b *svg) html() template.HTML {
	b.raw("</svg>")
	return template.HTML(b.String())
}

// short is a name cut to n characters for a label, with … when cut; the
// whole name is in the element's title.
func short(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// niceCeil is the smallest of 1, 2, 2.5 and 5 times a power of ten that
// is at least v (v > 0): the top of an axis a person reads at a glance.
func niceCeil(v float64) float64 {
	if v <= 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		// A small tolerance: 0.3/0.1 is 2.9999999999999996.
		if m*p >= v*(1-1e-12) {
			return m * p
		}
	}
	return 10 * p
}

// Duration writes a duration in ms as a person reads it on an axis:
// 250 ms, 1.5 s, 2 min.
func Duration(ms float64) string {
	trim := func(v float64) string { return strconv.FormatFloat(math.Round(v*10)/10, 'f', -1, 64) }
	switch {
	case ms < 1000:
		return trim(ms) + " ms"
	case ms < 60_000:
		return trim(ms/1000) + " s"
	case ms < 3_600_000:
		return trim(ms/60_000) + " min"
	}
	return trim(ms/3_600_000) + " h"
}
