package app

import (
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"html/template"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	"mesh-controller/app/boardsvg"
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
	"bound":       func(s Signal) string { return time.Duration(s.BoundS * float64(time.Second)).String() },
	"keyPath":     func(key string) string { return "/condition/" + url.PathEscape(key) },
	"add":         func(a, b int) int { return a + b },
	"gridNodes":   func() int { return BoardGridNodes },
	"gridModules": func() int { return BoardGridModules },
	"graphNodes":  func() int { return BoardGraphNodes },
	"graphLinks":  func() int { return BoardGraphLinks },
	"labelsUpTo":  func() int { return boardsvg.LabelsUpTo },
	"silenced": func(c health.Condition) bool {
		return c.SilencedUntil != nil && c.SilencedUntil.After(time.Now())
	},
}).ParseFS(boardFiles, "board/*.html"))

// boardCSP allows the page nothing but its own inline style, by hash: no
// script, no frame, no form, no other origin.
var boardCSP = func() string {
	b, err := boardFiles.ReadFile("board/layout.html")
	if err != nil {
		panic(err)
	}
	m := regexp.MustCompile(`(?s)<style>(.*?)</style>`).FindSubmatch(b)
	if m == nil {
		panic("board/layout.html has no style block")
	}
	sum := sha256.Sum256(m[1])
	return "default-src 'none'; style-src 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) +
		"'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
}()

// BoardHandler serves the three questions as a web page that holds nothing,
// with pictures of the heartbeats, the module states and the overlay:
// every request reads the stores afresh, and nothing is written. It answers
// only requests whose Host is one of hosts (the address it listens on, and
// names a person gave): a page of another site that a DNS rebinding points
// at the board gets nothing.
func (c *Health) BoardHandler(hosts ...string) http.Handler {
	allowed := map[string]bool{}
	for _, h := range hosts {
		allowed[strings.ToLower(h)] = true
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		v, err := c.Board(r.Context(), ParseBoardPage(r.URL.Query()))
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
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !allowed[strings.ToLower(r.Host)] {
			http.Error(w, "this board answers only to "+strings.Join(hosts, ", ")+": start it with --host "+r.Host+" to answer to that name", http.StatusMisdirectedRequest)
			return
		}
		w.Header().Set("Content-Security-Policy", boardCSP)
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "no-referrer")
		mux.ServeHTTP(w, r)
	})
}

// BoardHosts are the Host values a board listening on addr answers to: the
// address itself and, on a loopback address, its usual spellings; and each
// extra name, with the port.
func BoardHosts(addr string, extra ...string) []string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return append([]string{addr}, extra...)
	}
	out := []string{addr}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		out = append(out, net.JoinHostPort("localhost", port), net.JoinHostPort("127.0.0.1", port), net.JoinHostPort("::1", port))
	}
	for _, e := range extra {
		if _, _, err := net.SplitHostPort(e); err == nil {
			out = append(out, e)
		} else {
			out = append(out, net.JoinHostPort(e, port))
		}
	}
	return out
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
