package app

import (
	"embed"
	"html/template"
	"net/http"
	"net/url"
	"time"

	"mesh-controller/contexts/health"
)

//go:embed board/*.html
var boardFiles embed.FS

var boardTemplates = template.Must(template.New("").Funcs(template.FuncMap{
	"when": func(t any) string {
		switch v := t.(type) {
		case time.Time:
			return v.UTC().Format("2006-01-02 15:04:05Z")
		case *time.Time:
			if v != nil {
				return v.UTC().Format("2006-01-02 15:04:05Z")
			}
		}
		return "never"
	},
	"ago": func(s Signal) string {
		if s.Last == nil {
			return "never heard"
		}
		return "last heard " + time.Duration(s.AgeS*float64(time.Second)).Round(time.Second).String() + " ago"
	},
	"bound":   func(s Signal) string { return time.Duration(s.BoundS * float64(time.Second)).String() },
	"keyPath": func(key string) string { return "/condition/" + url.PathEscape(key) },
	"silenced": func(c health.Condition) bool {
		return c.SilencedUntil != nil && c.SilencedUntil.After(time.Now())
	},
}).ParseFS(boardFiles, "board/*.html"))

// BoardHandler serves the three questions as a web page that holds nothing:
// every request reads the stores afresh, and nothing is written.
func (c *Controller) BoardHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		v, err := c.Status(r.Context())
		if err != nil {
			boardError(w, err)
			return
		}
		render(w, "status.html", v)
	})
	mux.HandleFunc("GET /condition/{key...}", func(w http.ResponseWriter, r *http.Request) {
		d, err := c.ConditionShow(r.Context(), r.PathValue("key"))
		if err != nil {
			w.WriteHeader(http.StatusNotFound)
			render(w, "error.html", err.Error()+" — it may have been cleared since")
			return
		}
		render(w, "condition.html", d)
	})
	return mux
}

func render(w http.ResponseWriter, name string, data any) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err := boardTemplates.ExecuteTemplate(w, name, data); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

func boardError(w http.ResponseWriter, err error) {
	w.WriteHeader(http.StatusServiceUnavailable)
	render(w, "error.html", err.Error())
}
