package daemon

import (
	"context"
	"crypto/ed25519"
	"io"
	"log/slog"
	"mesh-controller/contexts/health"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"mesh-controller/app/protocol"
	"mesh-controller/embedded/broker"
)

// A join that waited longer than joinStale is answered busy, never
// admitted: its answer might no longer reach its host, whose token would
// then be used for nothing.
func TestJoinWorker_StaleJoinIsNotAdmitted(t *testing.T) {
	admitted := make(chan string, 2)
	d := &daemon{o: Options{Counters: &Counters{}}, logger: &logger{log: slog.New(slog.DiscardHandler)}, joins: make(chan queued, 2), events: make(chan *event, 4),
		u: UseCases{Now: time.Now, Hosts: joinOnly(func(_ context.Context, rs []protocol.JoinRequest, _ []string) []JoinResult {
			out := make([]JoinResult, len(rs))
			for i, r := range rs {
				admitted <- r.Node
				out[i].Err = &Refusal{Reason: "unknown token", Err: io.EOF}
			}
			return out
		})}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.joinWorker(ctx); close(done) }()
	ask := func(node string, waited time.Duration) {
		d.joins <- queued{m: &nats.Msg{Subject: protocol.JoinSubject, Reply: "_R_.x.y", Data: []byte(`{"node":"` + node + `"}`)}, at: time.Now().Add(-waited)}
	}
	ask("stale", joinStale+time.Second)
	ask("fresh", 0)
	select {
	case n := <-admitted:
		if n != "fresh" {
			t.Fatalf("%s was admitted", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the fresh join was not taken")
	}
	cancel()
	<-done
	if d.o.Counters.Dropped.Load() != 1 {
		t.Fatalf("%d dropped, want the stale one", d.o.Counters.Dropped.Load())
	}
}

// The source of a join is the broker's word, never the asker's.
func TestSourceOf(t *testing.T) {
	msg := func(h nats.Header) *nats.Msg { return &nats.Msg{Header: h} }
	for want, m := range map[string]*nats.Msg{
		"192.0.2.1": msg(nats.Header{broker.ClientInfoHdr: {`{"host":"192.0.2.1"}`}}),
		// the server appends its own after one of the asker's it could not remove
		"192.0.2.2":   msg(nats.Header{broker.ClientInfoHdr: {`{"host":"6.6.6.6"}`, `{"host":"192.0.2.2"}`}}),
		"2001:db8::1": msg(nats.Header{broker.ClientInfoHdr: {`{"host":"2001:0db8::1"}`}}),
		"unknown":     msg(nats.Header{"nats-request-info": {`{"host":"6.6.6.6"}`}}),
	} {
		if got := sourceOf(m); got != want {
			t.Errorf("got %s, want %s", got, want)
		}
	}
	for _, bad := range []string{`{"host":"join.refused/x"}`, `{"host":""}`, `not json`} {
		if got := sourceOf(msg(nats.Header{broker.ClientInfoHdr: {bad}})); got != "unknown" {
			t.Errorf("%s: got %s", bad, got)
		}
	}
}

func TestRefusalLog(t *testing.T) {
	var l refusalLog
	now := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	logged := 0
	for range 100 {
		if l.allow("192.0.2.1", now) {
			logged++
		}
	}
	if logged != refusalsLogged || !l.allow("192.0.2.2", now) || !l.allow("192.0.2.1", now.Add(time.Minute)) {
		t.Fatalf("logged %d of 100 in a minute", logged)
	}
}

// An ask for the latest declaration that waited longer than askStale is
// not answered: its host has asked again, or soon will.
func TestAskWorker_StaleAskIsNotAnswered(t *testing.T) {
	d := &daemon{o: Options{Counters: &Counters{}}, logger: &logger{log: slog.New(slog.DiscardHandler)}, asks: make(chan queued, 2), events: make(chan *event, 4),
		keys: hostKeys{m: map[string]ed25519.PublicKey{}}, limits: limiter{buckets: map[[2]string]*bucket{}}, u: UseCases{Now: time.Now}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.askWorker(ctx); close(done) }()
	ask := func(node string, waited time.Duration) {
		d.asks <- queued{m: &nats.Msg{Subject: protocol.NodeSubject(node, protocol.DeclarationAsk), Reply: "x"}, at: time.Now().Add(-waited)}
	}
	ask("stale", askStale+time.Second)
	ask("fresh", 0)
	select {
	case ev := <-d.events:
		// The fresh one is judged (and dropped: no host joined as it).
		if ev.kind != evDrop || ev.node != "fresh" {
			t.Fatalf("judged %+v", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the fresh ask was not taken")
	}
	cancel()
	<-done
	if n := d.o.Counters.Dropped.Load(); n != 2 {
		t.Fatalf("%d dropped, want the stale one and the unknown sender", n)
	}
}

// joinOnly is Hosts that only join, as the function says.
type joinOnly func(ctx context.Context, rs []protocol.JoinRequest, urls []string) []JoinResult

func (j joinOnly) Join(ctx context.Context, rs []protocol.JoinRequest, urls []string) []JoinResult {
	return j(ctx, rs, urls)
}

func (joinOnly) CatchUp(context.Context, *nats.Conn, CatchUpAsk) ([]Declared, int, error) {
	return nil, 0, nil
}

func (joinOnly) SelfCheck(context.Context, *nats.Conn, string, *slog.Logger) ([]health.Condition, error) {
	return nil, nil
}

func (joinOnly) Renew(context.Context, string, string) (string, int, error) { return "", 0, io.EOF }

func (joinOnly) RenewGrant(context.Context, string, string, []string) (protocol.JoinReply, int, error) {
	return protocol.JoinReply{}, 0, io.EOF
}
