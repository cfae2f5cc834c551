package daemon

import (
	"log/slog"
	"net/url"
	"os"
	"strings"
)

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
