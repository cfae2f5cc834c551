package main

import (
	"strings"
	"testing"
)

// Whatever a value from outside holds, shown prints it on one line whose
// columns are its own: every control and format character escaped (line
// breaks, CR, tabs, ANSI escapes, NEL, the line and paragraph separators,
// bidi overrides, invalid UTF-8), and a value without any unchanged.
func TestShown(t *testing.T) {
	for _, s := range []string{"api:u-123 (ada@example.org, Ada)", "replaced the disk of nas1", "Zoë Ōtsuka", ""} {
		if got := shown(s); got != s {
			t.Errorf("shown(%q) = %q, want it unchanged", s, got)
		}
	}
	for in, want := range map[string]string{
		"a\nb":                  `"a\nb"`,
		"a\rb":                  `"a\rb"`,
		"a\tb":                  `"a\tb"`,
		"\x1b[2Kred":            `"\x1b[2Kred"`,
		"a\u0085b":              `"a\u0085b"`,
		"a\u2028b\u2029":        `"a\u2028b\u2029"`,
		"admin\u202egnp.exe":    `"admin\u202egnp.exe"`,
		"bad\xffutf8":           `"bad\xffutf8"`,
		"no\u00a0break":         `"no\u00a0break"`,
		"zero\u200bwidth":       `"zero\u200bwidth"`,
		"quote \" and \\ too\n": `"quote \" and \\ too\n"`,
	} {
		got := shown(in)
		if got != want {
			t.Errorf("shown(%q) = %s, want %s", in, got, want)
		}
		if strings.ContainsFunc(got, func(r rune) bool { return r < 0x20 || r == 0x7f || r >= 0x80 && r < 0xa0 }) {
			t.Errorf("shown(%q) = %q holds a control character", in, got)
		}
	}
}
