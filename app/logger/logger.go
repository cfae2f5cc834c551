// Package logger makes the log/slog loggers the long-running programs
// write (mesh-controller serve and api, mesh-host run): key=value text or
// one JSON object a line, from a level up, times in UTC. Each program says
// its log's format and level with the same two flags.
package logger

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// Formats are the formats New writes (--log-format).
var Formats = []string{"text", "json"}

// Levels are the levels New takes (--log-level), most said first.
var Levels = []string{"debug", "info", "warn", "error"}

// New is a log on w: log/slog records as key=value text (slog's
// TextHandler, whose quoting keeps a hostile value on its own line) or as
// one JSON object a line, from level up ("" is info). Times are UTC.
func New(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	switch level {
	case "debug":
		lv = slog.LevelDebug
	case "info", "":
		lv = slog.LevelInfo
	case "warn":
		lv = slog.LevelWarn
	case "error":
		lv = slog.LevelError
	default:
		return nil, fmt.Errorf("log level %q is not one of %s", level, strings.Join(Levels, ", "))
	}
	o := &slog.HandlerOptions{Level: lv, ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey && len(groups) == 0 {
			a.Value = slog.TimeValue(a.Value.Time().UTC())
		}
		return a
	}}
	switch format {
	case "text", "":
		return slog.New(slog.NewTextHandler(w, o)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, o)), nil
	}
	return nil, fmt.Errorf("log format %q is not one of %s", format, strings.Join(Formats, ", "))
}
