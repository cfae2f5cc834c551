package app

import (
	"bytes"
	"strings"
	"testing"

	"mesh-controller/app/daemon"
)

// A value in a log line cannot start a line of its own: slog's text and
// JSON handlers quote a newline, so a host naming itself with one forges
// nothing (what the old printf log allowed).
func TestServeLog_ValuesCannotForgeLines(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		var b bytes.Buffer
		l, err := daemon.NewLogger(&b, format)
		if err != nil {
			t.Fatal(err)
		}
		l.Info("join refused", "node", "x\ntime=2026-01-01T00:00:00Z level=INFO msg=joined node=web9")
		if n := strings.Count(b.String(), "\n"); n != 1 {
			t.Fatalf("%s: %d lines from one record:\n%s", format, n, b.String())
		}
	}
	if _, err := daemon.NewLogger(&bytes.Buffer{}, "xml"); err == nil || !strings.Contains(err.Error(), `log format "xml" is not one of text, json`) {
		t.Fatalf("an unknown format: %v", err)
	}
}
