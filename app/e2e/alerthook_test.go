package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"mesh-controller/app"
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

// accepted is a check that the receiver accepted an alert of event for
// key; it says what it accepted instead, after how many attempts.
func (r *receiver) accepted(event, key string) func() error {
	return func() error {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, a := range r.got {
			if a.Event == event && a.Condition.Key == key && a.Type != "" && !a.At.IsZero() {
				return nil
			}
		}
		return fmt.Errorf("the receiver has not accepted %s %s; in %d attempts it accepted %+v", key, event, r.attempts, r.got)
	}
}

func (r *receiver) tries() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.attempts
}

// silentBounds raise node.silent quickly and nothing else.
var silentBounds = &app.Bounds{HeartbeatFactor: 4, Apply: time.Hour, DataReport: time.Hour, RetiredWaiting: time.Hour, Memory: time.Hour}

// A host goes silent: the webhook receives node.silent raised, though it
// failed the first attempts (retried); the host comes back: it receives the
// clearing. The URL's token is never in the log.
func TestAlertWebhook_RaisedAndClearedReachTheReceiverRetried(t *testing.T) {
	t.Parallel()
	r := newReceiver(t, func(n int) int {
		if n <= 2 {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	const token = "w3bh00k-t0ken-5ecret"
	m := newTestMesh(t)
	m.restartWith(app.ServeOptions{CheckEvery: 50 * time.Millisecond, Bounds: silentBounds,
		AlertWebhook: strings.Replace(r.srv.URL, "http://", "http://ops:"+token+"-pw@", 1) + "/hook?token=" + token,
		AlertHook:    alerthook.Options{Backoff: 10 * time.Millisecond}})
	h := m.join("web1")
	checkFor(t, settle, m.beating("web1"))
	h.stop()
	checkFor(t, settle, r.accepted("raised", "node.silent/web1"))
	if n := r.tries(); n < 3 {
		t.Fatalf("accepted after %d attempts; the first two were refused", n)
	}
	h.start()
	checkFor(t, settle, r.accepted("cleared", "node.silent/web1"))
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
	t.Parallel()
	r := newReceiver(t, func(int) int { return 0 })
	m := newTestMesh(t)
	m.restartWith(app.ServeOptions{CheckEvery: 50 * time.Millisecond, Bounds: silentBounds,
		AlertWebhook: r.srv.URL + "/hook",
		AlertHook:    alerthook.Options{Queue: 1, Timeout: time.Hour}})
	h := m.join("web1")
	checkFor(t, settle, m.beating("web1"))
	// Raised (posted: hangs), cleared (queued), raised (dropped), cleared (dropped).
	for i := 0; i < 2; i++ {
		h.stop()
		checkFor(t, settle, m.opened(t, "node.silent/web1"))
		h.start()
		checkFor(t, settle, m.cleared(t, "node.silent/web1"))
	}
	if r.tries() != 1 {
		t.Fatalf("the receiver was sent %d attempts; it hangs on the first", r.tries())
	}
	last := *m.node("web1").LastHeard
	checkFor(t, settle, func() error {
		if heard := m.node("web1").LastHeard; !heard.After(last) {
			return fmt.Errorf("web1 was last heard from at %s, not after %s", timeOf(heard), timeOf(&last))
		}
		return nil
	})
	checkFor(t, settle, m.logSays(" waiting=1 dropped_so_far=2"))
}
