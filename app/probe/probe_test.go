package probe

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// /healthz answers while the process answers; /readyz says ready, or 503
// and why on one line, a why of several lines folded onto it; other
// methods are refused.
func TestHandle(t *testing.T) {
	var why error
	mux := http.NewServeMux()
	Handle(mux, func(ctx context.Context) error {
		if _, ok := ctx.Deadline(); !ok {
			return errors.New("asked without a deadline")
		}
		return why
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	ask := func(method, path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode < 400 && resp.Header.Get("Content-Type") != "text/plain; charset=utf-8" {
			t.Errorf("%s %s: Content-Type %q", method, path, resp.Header.Get("Content-Type"))
		}
		return resp.StatusCode, string(b)
	}
	for _, c := range []struct {
		method, path string
		why          error
		status       int
		body         string
	}{
		{"GET", "/healthz", errors.New("not asked"), 200, "alive\n"},
		{"GET", "/readyz", nil, 200, "ready\n"},
		{"GET", "/readyz", errors.New("standing by:\n another serves"), 503, "not ready: standing by: another serves\n"},
		{"POST", "/readyz", nil, 405, ""},
	} {
		why = c.why
		status, body := ask(c.method, c.path)
		if status != c.status || (c.body != "" && body != c.body) {
			t.Errorf("%s %s: %d %q, want %d %q", c.method, c.path, status, body, c.status, c.body)
		}
	}
	if !Is("/readyz") || !Is("/healthz") || Is("/v1/readyz") {
		t.Error("Is does not tell the probes' paths")
	}
}
