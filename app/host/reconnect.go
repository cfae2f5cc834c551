package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"mesh-controller/app/protocol"
)

// How a host comes back after its broker or controller went away (a
// controller restarted under ten thousand hosts): it never gives up, and
// waits a little longer after each failed try, at a random point of the
// wait, so hosts that lost their broker together do not come back together.
const (
	// reconnectFirst and reconnectMost bound the wait between two tries to
	// reach the broker: a broker back after 20 s is reached again within
	// reconnectMost.
	reconnectFirst = 250 * time.Millisecond
	reconnectMost  = 4 * time.Second
	// askFirst and askMost bound the wait between two asks for the latest
	// declaration that were not answered (the controller not serving yet,
	// or answering others first).
	askFirst = 500 * time.Millisecond
	askMost  = 8 * time.Second
)

// backoff is the wait before try attempt (from 1): doubling from first up
// to most, drawn from the upper half of that.
func backoff(attempt int, first, most time.Duration) time.Duration {
	d := most
	if attempt < 30 {
		d = min(most, first<<(attempt-1))
	}
	return d/2 + rand.N(d/2+1)
}

// reconnecting are the options of a host's connection to its broker: it
// tries again for ever (its first connection included, and after its
// credentials were refused: a broker starting again may refuse them for a
// moment), waiting backoff between tries.
func reconnecting() []nats.Option {
	return []nats.Option{nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true), nats.IgnoreAuthErrorAbort(),
		nats.Timeout(handshakeWithin), nats.SetCustomDialer(&redialer{}),
		nats.CustomReconnectDelay(func(attempts int) time.Duration { return backoff(attempts, reconnectFirst, reconnectMost) })}
}

// handshakeWithin bounds a try to reach the broker, its handshake
// included: a broker taking ten thousand hosts back at once answers each
// in turn.
const handshakeWithin = 10 * time.Second

// redialer dials the broker for one connection, closing the connection it
// dialed before: nats.go (v1.55) does not close a connection whose
// handshake failed before dialing again, and under a crowd of hosts coming
// back the leaked sockets (measured: "too many open files" with 10,000
// simulated hosts) keep hosts from coming back at all.
type redialer struct {
	mu   sync.Mutex
	last net.Conn
}

// Dial closes the last connection dialed, which nats.go is done with when
// it dials again, and dials anew.
func (r *redialer) Dial(network, address string) (net.Conn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last != nil {
		r.last.Close()
		r.last = nil
	}
	c, err := net.DialTimeout(network, address, handshakeWithin)
	if err == nil {
		r.last = c
	}
	return c, err
}

// askLatest asks the controller for this node's latest declaration, as a
// host does whenever it (re)connects, and asks again after backoff until
// it is answered or ctx ends: a controller starting again answers no one
// until it serves, and one answering thousands of hosts at once may answer
// this one late. It returns nil when the controller has no declaration for
// the node. failed, if set, is told each unanswered ask.
func askLatest(ctx context.Context, nc *nats.Conn, st *State, serial int64, failed func(error)) (*protocol.Envelope, error) {
	req, err := protocol.Sign(st.HostKey, protocol.DeclarationAskBody{SerialApplied: serial})
	if err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		m, err := askOnceLatest(ctx, nc, st.Node, req)
		if err == nil {
			var probe struct {
				None        bool   `json:"none"`
				Error       string `json:"error"`
				Declaration string `json:"declaration"`
			}
			if json.Unmarshal(m.Data, &probe) == nil && probe.None {
				return nil, nil
			}
			// Refused (a protocol the controller does not speak): said, and
			// asked again as if unanswered, so that a controller upgraded
			// behind the same broker is heard without a reconnection.
			if probe.Error != "" && probe.Declaration == "" {
				err = fmt.Errorf("%w: %s", ErrAskRefused, probe.Error)
			} else {
				var env protocol.Envelope
				if err := json.Unmarshal(m.Data, &env); err != nil {
					return nil, fmt.Errorf("the latest declaration is not JSON: %w", err)
				}
				return &env, nil
			}
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if failed != nil {
			failed(err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(backoff(attempt, askFirst, askMost)):
		}
	}
}

// ErrAskRefused means the controller answered the ask for the latest
// declaration with a refusal (its words follow).
var ErrAskRefused = errors.New("the controller refused this host")

func askOnceLatest(ctx context.Context, nc *nats.Conn, node string, req []byte) (*nats.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, protocol.AnswerTimeout)
	defer cancel()
	m, err := nc.RequestWithContext(ctx, protocol.NodeSubject(node, protocol.DeclarationAsk), req)
	if errors.Is(err, nats.ErrNoResponders) {
		return nil, errors.New("no controller is serving yet")
	}
	return m, err
}

// asking is one ask for the latest declaration at a time: a new
// connection's ask ends the last one's.
type asking struct{ stop context.CancelFunc }

// start ends the ask under way, if any, and runs ask in its own goroutine
// until it returns or the next start or end.
func (a *asking) start(ctx context.Context, ask func(ctx context.Context)) {
	a.end()
	ctx, a.stop = context.WithCancel(ctx)
	go ask(ctx)
}

// end ends the ask under way, if any.
func (a *asking) end() {
	if a.stop != nil {
		a.stop()
	}
}
