// Package alerthook posts the controller's alerts (each raising and
// clearing that mesh.alert carries) to a person's webhook over HTTP: queued,
// retried with back-off, and never holding up the daemon that hands them in.
package alerthook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"
)

// Defaults of Options' zero values.
const (
	DefaultQueue    = 256
	DefaultAttempts = 5
	DefaultBackoff  = 500 * time.Millisecond
	DefaultTimeout  = 10 * time.Second
)

// Options bound a hook's work; zero values are the defaults.
type Options struct {
	// Queue is how many alerts wait to be posted; past it they are dropped.
	Queue int
	// Attempts is how many times one alert is posted before it is given up.
	Attempts int
	// Backoff is the wait after the first failed attempt, doubled after
	// each further one (up to 30 s).
	Backoff time.Duration
	// Timeout bounds one attempt, so that a receiver that hangs holds the
	// queue up for no longer.
	Timeout time.Duration
}

// Hook posts alerts to one URL.
type Hook struct {
	url     string
	shown   string
	o       Options
	client  *http.Client
	queue   chan []byte
	log     *slog.Logger
	dropped atomic.Int64
}

// Parse checks raw is a URL a hook can post to: http or https, with a host.
// Its error never repeats the URL, which may hold a token.
func Parse(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, errors.New("the URL does not parse")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, errors.New("the URL is not http or https")
	}
	if u.Host == "" {
		return nil, errors.New("the URL names no host")
	}
	return u, nil
}

// Redact is u as a log may show it: its userinfo and every query value
// replaced, since a webhook's token is often kept in one or the other.
func Redact(u *url.URL) string {
	r := *u
	if r.User != nil {
		r.User = url.User("REDACTED")
	}
	if r.RawQuery != "" {
		q := r.Query()
		for k := range q {
			q[k] = []string{"REDACTED"}
		}
		r.RawQuery = q.Encode()
	}
	r.Fragment, r.RawFragment = "", ""
	return r.String()
}

// New is a hook posting to raw (see Parse).
func New(raw string, o Options) (*Hook, error) {
	u, err := Parse(raw)
	if err != nil {
		return nil, err
	}
	if o.Queue <= 0 {
		o.Queue = DefaultQueue
	}
	if o.Attempts <= 0 {
		o.Attempts = DefaultAttempts
	}
	if o.Backoff <= 0 {
		o.Backoff = DefaultBackoff
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	return &Hook{url: raw, shown: Redact(u), o: o, client: &http.Client{Timeout: o.Timeout},
		queue: make(chan []byte, o.Queue), log: slog.New(slog.DiscardHandler)}, nil
}

// Shown is the hook's URL as the log shows it (Redact).
func (h *Hook) Shown() string { return h.shown }

// Dropped counts the alerts dropped because the queue was full.
func (h *Hook) Dropped() int64 { return h.dropped.Load() }

// Post queues one alert's JSON body; it never waits. A full queue drops
// the alert, counts it, and says so in the log.
func (h *Hook) Post(body []byte) {
	select {
	case h.queue <- body:
	default:
		n := h.dropped.Add(1)
		h.log.Warn("alert webhook: queue full, alert dropped", "url", h.shown, "waiting", cap(h.queue), "dropped_so_far", n)
	}
}

// Start posts what is queued, logging to log, until ctx ends; done is
// closed then. Call it before the first Post, so Post logs there too.
func (h *Hook) Start(ctx context.Context, log *slog.Logger) (done <-chan struct{}) {
	h.log = log
	d := make(chan struct{})
	go func() {
		defer close(d)
		for {
			select {
			case <-ctx.Done():
				return
			case body := <-h.queue:
				h.deliver(ctx, body)
			}
		}
	}()
	return d
}

// deliver posts one body, retrying with back-off, and logs giving up.
func (h *Hook) deliver(ctx context.Context, body []byte) {
	wait := h.o.Backoff
	var err error
	for attempt := 1; attempt <= h.o.Attempts; attempt++ {
		if err = h.post(ctx, body); err == nil {
			return
		}
		if attempt == h.o.Attempts {
			break
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(2*wait, 30*time.Second)
	}
	if ctx.Err() == nil {
		h.log.Warn("alert webhook: alert not delivered", "url", h.shown, "attempts", h.o.Attempts, "err", err)
	}
}

func (h *Hook) post(ctx context.Context, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(body))
	if err != nil {
		return errors.New("request not made")
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.client.Do(req)
	if err != nil {
		// A *url.Error repeats the whole URL: say only what went wrong.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("the receiver answered %s", resp.Status)
	}
	return nil
}
