package protocol

import (
	"errors"
	"fmt"
	"strings"
)

// MaxFilterBytes bounds a declared ruleset: a node's table is a few
// hundred lines at most.
const MaxFilterBytes = 1 << 20

// OneMeshTable says whether a ruleset is exactly one "table inet mesh { … }"
// and nothing beside it (comments aside): a host replaces that table alone,
// so a ruleset can never flush, add to or delete another table, nor read a
// file (include).
func OneMeshTable(ruleset string) error {
	if len(ruleset) > MaxFilterBytes {
		return fmt.Errorf("%d bytes, over %d", len(ruleset), MaxFilterBytes)
	}
	text := strings.TrimSpace(stripComments(ruleset))
	head, ok := strings.CutPrefix(text, "table")
	fields := strings.Fields(strings.SplitN(head, "{", 2)[0])
	if !ok || len(fields) != 2 || fields[0]+" "+fields[1] != FilterTable || !strings.Contains(head, "{") {
		return errors.New(`must begin "table inet mesh {": the mesh owns that table and no other`)
	}
	depth, quoted := 0, false
	for i, c := range text {
		switch {
		case c == '"':
			quoted = !quoted
		case quoted:
		case c == '{':
			depth++
		case c == '}':
			depth--
			if depth < 0 {
				return errors.New("a } closes nothing")
			}
			if depth == 0 && strings.TrimSpace(text[i+1:]) != "" {
				return errors.New("something follows the table inet mesh block: a ruleset is that table alone")
			}
		}
	}
	if depth != 0 || quoted {
		return errors.New("the table inet mesh block is not closed")
	}
	for line := range strings.Lines(text) {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "include" {
			return errors.New("include is not allowed: a ruleset is read from the declaration alone")
		}
	}
	return nil
}

// stripComments removes nft comments (# to the end of the line) outside
// quoted strings.
func stripComments(s string) string {
	var b strings.Builder
	quoted, comment := false, false
	for _, c := range s {
		switch {
		case comment && c == '\n':
			comment = false
		case comment:
			continue
		case c == '"':
			quoted = !quoted
		case c == '#' && !quoted:
			comment = true
			continue
		case c == '\n':
			quoted = false
		}
		b.WriteRune(c)
	}
	return b.String()
}
