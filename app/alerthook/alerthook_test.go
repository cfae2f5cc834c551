package alerthook

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// lines is a log that tests can wait on.
type lines struct {
	mu sync.Mutex
	l  []string
	ch chan struct{}
}

func newLines() *lines { return &lines{ch: make(chan struct{}, 100)} }

// Write takes one record of a slog handler, a line.
func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	l.l = append(l.l, string(p))
	l.mu.Unlock()
	l.ch <- struct{}{}
	return len(p), nil
}

// next waits for the next line, for 10 s at most.
func (l *lines) next(t *testing.T) string {
	t.Helper()
	select {
	case <-l.ch:
	case <-time.After(10 * time.Second):
		t.Fatal("no log line within 10s")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.l[len(l.l)-1]
}

// A receiver that always fails is tried Attempts times, then the alert is
// given up and the log says why, without the URL's secrets; so is one
// that hangs past Timeout.
func TestHook_GivesUpAfterItsAttempts(t *testing.T) {
	const token = "t0ken-kn0wn"
	for _, c := range []struct {
		name   string
		answer func(w http.ResponseWriter, r *http.Request)
		want   string
	}{
		{"failing", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusInternalServerError) },
			`alert not delivered" url="http://REDACTED@127\.0\.0\.1:\d+/\?k=REDACTED" attempts=3 err="the receiver answered 500 Internal Server Error"`},
		{"hanging", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() },
			`alert not delivered" url="http://REDACTED@127\.0\.0\.1:\d+/\?k=REDACTED" attempts=3 err=`},
	} {
		t.Run(c.name, func(t *testing.T) {
			var attempts atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				attempts.Add(1)
				// Read whole, so the server notices the client hanging up.
				io.Copy(io.Discard, r.Body)
				c.answer(w, r)
			}))
			defer srv.Close()
			h, err := New(strings.Replace(srv.URL, "http://", "http://u:"+token+"@", 1)+"/?k="+token, Options{Attempts: 3, Backoff: time.Millisecond, Timeout: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			log := newLines()
			ctx, cancel := context.WithCancel(context.Background())
			done := h.Start(ctx, slog.New(slog.NewTextHandler(log, nil)))
			defer func() { cancel(); <-done }()
			h.Post([]byte(`{"event":"raised"}`))
			line := log.next(t)
			if !regexp.MustCompile(c.want).MatchString(line) || strings.Contains(line, token) || !strings.Contains(line, "?k=REDACTED") {
				t.Fatalf("log line %q: want %q, redacted", line, c.want)
			}
			if n := attempts.Load(); n != 3 {
				t.Fatalf("%d attempts, want 3", n)
			}
		})
	}
}
