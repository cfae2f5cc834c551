package daemon

import (
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strings"
)

// LogFormats are the formats NewLogger writes (serve --log-format).
var LogFormats = []string{"text", "json"}

// NewLogger is the daemon's log on w: log/slog records as key=value text
// (slog's TextHandler, whose quoting keeps a hostile value on its own line)
// or as one JSON object a line. Times are UTC.
func NewLogger(w io.Writer, format string) (*slog.Logger, error) {
	o := &slog.HandlerOptions{ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
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
	return nil, fmt.Errorf("log format %q is not one of %s", format, strings.Join(LogFormats, ", "))
}

// StoreShown is a store as the start line says it: its context and where
// it is, a file's path or a PostgreSQL URL without its password.
type StoreShown struct {
	Context, Location string
}

// logServing is the line that says the daemon serves: what (the version,
// its pid, the lease's generation), where (the broker's URL, the data
// directory) and which stores.
func (d *daemon) logServing(generation int64) {
	stores := make([]any, 0, len(d.o.Stores))
	for _, s := range d.o.Stores {
		stores = append(stores, slog.String(s.Context, s.Location))
	}
	version := ShownVersion(d.o.Version)
	broker := "embedded"
	if d.o.Broker != "" {
		broker = "external"
	}
	d.log.Info("serving", "version", version, "pid", os.Getpid(), "lease_generation", generation,
		"broker", broker, "broker_url", redactURLs(d.url), "data", d.o.DataDir, slog.Group("stores", stores...))
}

// redactURLs is a comma-separated list of URLs with each password
// replaced, as url.URL.Redacted does.
func redactURLs(list string) string {
	parts := strings.Split(list, ",")
	for i, p := range parts {
		if u, err := url.Parse(strings.TrimSpace(p)); err == nil && u.User != nil {
			parts[i] = u.Redacted()
		}
	}
	return strings.Join(parts, ",")
}
