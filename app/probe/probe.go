// Package probe answers /healthz and /readyz, what a service manager, a
// load balancer or a person asks of a long-running program: whether it is
// alive, and whether it does its work now, and if not why, in one line of
// text. The programs mount them beside /metrics (serve --metrics,
// mesh-host run --metrics) and on the HTTP API; nothing is asked of the
// caller, so nothing said may be secret. CheckAddress says which addresses
// the listener of /metrics and the probes may take.
package probe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"
)

// Ready says why a program is not ready now, nil when it is. The error's
// text is said to whoever asks: it must name what is wrong, never a
// secret, a path or an address (the program's log has the detail).
type Ready func(ctx context.Context) error

// Timeout bounds one readiness check: a probe that hangs is a probe that
// failed, and a load balancer's own timeout is a few seconds.
const Timeout = 3 * time.Second

// Bodies of the answers, each one line.
const (
	// Alive is /healthz's answer: the process answers HTTP.
	Alive = "alive"
	// ReadyLine is /readyz's answer when ready.
	ReadyLine = "ready"
	// NotReady begins /readyz's answer when not ready, before why.
	NotReady = "not ready: "
)

// Handle adds GET /healthz and GET /readyz to mux: /healthz answers 200
// "alive" whenever the process answers at all; /readyz answers 200
// "ready", or 503 "not ready: WHY" as ready says, within Timeout.
func Handle(mux *http.ServeMux, ready Ready) {
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		answer(w, http.StatusOK, Alive)
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), Timeout)
		defer cancel()
		if err := ready(ctx); err != nil {
			answer(w, http.StatusServiceUnavailable, NotReady+oneLine(err.Error()))
			return
		}
		answer(w, http.StatusOK, ReadyLine)
	})
}

// Paths are the paths Handle serves.
var Paths = []string{"/healthz", "/readyz"}

// Is says whether path is one Handle serves: a program logs its probes
// at debug only, since something asks them every few seconds.
func Is(path string) bool {
	for _, p := range Paths {
		if path == p {
			return true
		}
	}
	return false
}

func answer(w http.ResponseWriter, status int, line string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	fmt.Fprintln(w, line)
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// ErrNotLoopback refuses a metrics address reachable from other machines
// unless the operator said so.
var ErrNotLoopback = errors.New("not a loopback address")

// CheckAddress refuses addr unless it is a loopback host:port or public is
// set: what the listener of /metrics answers beside the probes (nodes'
// counts, stores' sizes, the modules a host runs) is not for anyone on the
// network unless the operator chooses.
func CheckAddress(addr string, public bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if public {
		return nil
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("%q: %w", addr, ErrNotLoopback)
}
