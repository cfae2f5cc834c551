package logger

import (
	"bytes"
	"strings"
	"testing"
)

// A value in a log line cannot start a line of its own: slog's text and
// JSON handlers quote a newline, so a host naming itself with one forges
// nothing (what the old printf log allowed).
func TestNew_ValuesCannotForgeLines(t *testing.T) {
	for _, format := range Formats {
		var b bytes.Buffer
		l, err := New(&b, format, "")
		if err != nil {
			t.Fatal(err)
		}
		l.Info("join refused", "node", "x\ntime=2026-01-01T00:00:00Z level=INFO msg=joined node=web9")
		if n := strings.Count(b.String(), "\n"); n != 1 {
			t.Fatalf("%s: %d lines from one record:\n%s", format, n, b.String())
		}
	}
}

// Each level keeps what is said at it and above, and nothing below; a
// format or a level not known is refused, naming the known.
func TestNew_Levels(t *testing.T) {
	for i, level := range Levels {
		var b bytes.Buffer
		l, err := New(&b, "text", level)
		if err != nil {
			t.Fatal(err)
		}
		l.Debug("said at debug")
		l.Info("said at info")
		l.Warn("said at warn")
		l.Error("said at error")
		for j, said := range Levels {
			if kept := strings.Contains(b.String(), "said at "+said); kept != (j >= i) {
				t.Errorf("--log-level %s: a line at %s kept %v:\n%s", level, said, kept, b.String())
			}
		}
	}
	if _, err := New(&bytes.Buffer{}, "xml", ""); err == nil || !strings.Contains(err.Error(), `log format "xml" is not one of text, json`) {
		t.Fatalf("an unknown format: %v", err)
	}
	if _, err := New(&bytes.Buffer{}, "text", "loud"); err == nil || !strings.Contains(err.Error(), `log level "loud" is not one of debug, info, warn, error`) {
		t.Fatalf("an unknown level: %v", err)
	}
}
