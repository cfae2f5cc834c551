package app

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"mesh-controller/app/alerthook"
)

// receiver is a webhook receiver on loopback: it records each alert it
// accepted and how many attempts it was sent.
type receiver struct {
	mu       sync.Mutex
	attempts int
	got      []postedAlert
	// answer says how to answer attempt n (from 1): a status, or 0 to hang
	// until the request or the test ends.
	answer func(n int) int
	srv    *httptest.Server
}

// postedAlert is what a receiver reads of a posted alert's JSON body.
type postedAlert struct {
	Type      string `json:"type"`
	Event     string `json:"event"`
	Condition struct {
		Key string `json:"key"`
	} `json:"condition"`
	At time.Time `json:"at"`
}

func newReceiver(t *testing.T, answer func(n int) int) *receiver {
	r := &receiver{answer: answer}
	release := make(chan struct{})
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.attempts++
		status := r.answer(r.attempts)
		r.mu.Unlock()
		if status == 0 {
			select {
			case <-req.Context().Done():
			case <-release:
			}
			return
		}
		if status == http.StatusOK {
			r.mu.Lock()
			var a postedAlert
			if err := json.Unmarshal(body, &a); err != nil || req.Header.Get("Content-Type") != "application/json" || req.Method != http.MethodPost {
				status = http.StatusBadRequest
			} else {
				r.got = append(r.got, a)
			}
			r.mu.Unlock()
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(r.srv.Close)
	t.Cleanup(func() { close(release) }) // before Close, which waits for the hung
	return r
}

// has says whether the receiver accepted an alert of event for key.
func (r *receiver) has(event, key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range r.got {
		if a.Event == event && a.Condition.Key == key && a.Type != "" && !a.At.IsZero() {
			return true
		}
	}
	return false
}

func (r *receiver) tries() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.attempts
}

// silentBounds raise node.silent quickly and nothing else.
var silentBounds = &Bounds{HeartbeatFactor: 4, Apply: time.Hour, DataReport: time.Hour, RetiredWaiting: time.Hour, Memory: time.Hour}

// A host goes silent: the webhook receives node.silent raised, though it
// failed the first attempts (retried); the host comes back: it receives the
// clearing. The URL's token is never in the log.
func TestAlertWebhook_RaisedAndClearedReachTheReceiverRetried(t *testing.T) {
	r := newReceiver(t, func(n int) int {
		if n <= 2 {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	const token = "w3bh00k-t0ken-5ecret"
	m := newTestMesh(t)
	m.restartWith(ServeOptions{CheckEvery: 50 * time.Millisecond, Bounds: silentBounds,
		AlertWebhook: strings.Replace(r.srv.URL, "http://", "http://ops:"+token+"-pw@", 1) + "/hook?token=" + token,
		AlertHook:    alerthook.Options{Backoff: 10 * time.Millisecond}})
	h := m.join("web1")
	waitFor(t, "web1 to beat", func() bool { return m.node("web1").LastHeard != nil && m.node("web1").HeartbeatS > 0 })
	h.stop()
	waitFor(t, "the receiver to accept node.silent/web1 raised", func() bool { return r.has("raised", "node.silent/web1") })
	if n := r.tries(); n < 3 {
		t.Fatalf("accepted after %d attempts; the first two were refused", n)
	}
	h.start()
	waitFor(t, "the receiver to accept node.silent/web1 cleared", func() bool { return r.has("cleared", "node.silent/web1") })
	logs := m.logs.String()
	if strings.Contains(logs, token) {
		t.Fatalf("the webhook's token is in the log:\n%s", logs)
	}
	if !strings.Contains(logs, "/hook?token=REDACTED") {
		t.Fatalf("the log does not say where alerts are posted, redacted:\n%s", logs)
	}
}

// A receiver that hangs holds nothing up: heartbeats are still absorbed and
// conditions raised and cleared; what does not fit the queue is dropped,
// counted, and said in the log.
func TestAlertWebhook_HangingReceiverHoldsTheDaemonUpNot(t *testing.T) {
	r := newReceiver(t, func(int) int { return 0 })
	m := newTestMesh(t)
	m.restartWith(ServeOptions{CheckEvery: 50 * time.Millisecond, Bounds: silentBounds,
		AlertWebhook: r.srv.URL + "/hook",
		AlertHook:    alerthook.Options{Queue: 1, Timeout: time.Hour}})
	h := m.join("web1")
	waitFor(t, "web1 to beat", func() bool { return m.node("web1").LastHeard != nil && m.node("web1").HeartbeatS > 0 })
	// Raised (posted: hangs), cleared (queued), raised (dropped), cleared (dropped).
	for i := 0; i < 2; i++ {
		h.stop()
		waitFor(t, "node.silent/web1 to be raised", func() bool { return m.open(t, "node.silent/web1") })
		h.start()
		waitFor(t, "node.silent/web1 to clear", func() bool { return !m.open(t, "node.silent/web1") })
	}
	if r.tries() != 1 {
		t.Fatalf("the receiver was sent %d attempts; it hangs on the first", r.tries())
	}
	last := *m.node("web1").LastHeard
	waitFor(t, "web1's heartbeats to be absorbed still", func() bool { return m.node("web1").LastHeard.After(last) })
	waitFor(t, "the log to say alerts were dropped", func() bool {
		return strings.Contains(m.logs.String(), " waiting=1 dropped_so_far=2")
	})
}
