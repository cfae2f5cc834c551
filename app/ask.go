package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"mesh-controller/app/protocol"
	"mesh-controller/contexts/inventory"
)

// Refusals of logs and ask.
var (
	// ErrNotConnected means a node's host is not connected to the broker.
	ErrNotConnected = errors.New("is not connected")
	// ErrNoSuchTool means a module's manifest names no such tool.
	ErrNoSuchTool = errors.New("has no tool")
	// ErrNoInstance means no running instance of a module answered.
	ErrNoInstance = errors.New("no running instance")
	// ErrNoAnswer means a tool or a host did not answer in time.
	ErrNoAnswer = errors.New("did not answer")
	// ErrLogs means a host could not give a module's log.
	ErrLogs = errors.New("its host could not give the log")
	// ErrNotJSON means a tool's input is not one JSON value.
	ErrNotJSON = errors.New("is not JSON")
)

// MaxToolInput bounds a tool's input: the broker refuses larger messages
// from a module's answer anyway.
const MaxToolInput = 512 << 10

// silentSince says since when a node has not been heard, for a refusal.
func silentSince(n inventory.Node) string {
	if n.LastHeard == nil {
		return "it has never been heard"
	}
	return "silent since " + n.LastHeard.UTC().Format(time.RFC3339)
}

// Logs asks a node's host for a module's log: the last lines, then, when
// following, each new part until ctx ends or out fails. A host that does
// not answer is not connected; the refusal says since when it is silent.
func (c *Modules) Logs(ctx context.Context, node, module string, lines int, follow bool, out func([]string) error) error {
	if err := CheckNames(node, module); err != nil {
		return err
	}
	st, err := c.stores(ctx)
	if err != nil {
		return err
	}
	n, err := st.Inventory.Node(ctx, node)
	if err != nil {
		return err
	}
	nc, err := c.dialBroker(ctx, st.Identity)
	if err != nil {
		return err
	}
	defer nc.Close()
	ask, _ := json.Marshal(protocol.LogsAsk{Module: module, Lines: min(max(lines, 0), protocol.MaxLogLines), Follow: follow})
	sub, err := sendHost(nc, node, protocol.NodeSubject(node, protocol.LogsInbox), ask)
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()
	first := true
	for {
		wait := protocol.AnswerTimeout
		if !first {
			wait = 3 * protocol.LogsKeepalive // a following host sends at least this often
		}
		wctx, cancel := context.WithTimeout(ctx, wait)
		m, err := sub.NextMsgWithContext(wctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil // Ctrl-C: following ends
		case err != nil && first:
			return fmt.Errorf("node %s %w: its host did not answer (%s)", node, ErrNotConnected, silentSince(n))
		case err != nil:
			return fmt.Errorf("node %s %w: its host stopped sending the log (%s)", node, ErrNotConnected, silentSince(n))
		}
		if noResponders(m) {
			return fmt.Errorf("node %s %w: no host listens for it (%s)", node, ErrNotConnected, silentSince(n))
		}
		first = false
		var a protocol.LogsAnswer
		if err := json.Unmarshal(m.Data, &a); err != nil {
			return fmt.Errorf("the log from %s: %w", node, err)
		}
		if a.Error != "" {
			return fmt.Errorf("%w: %s", ErrLogs, a.Error)
		}
		if len(a.Lines) > 0 {
			if err := out(a.Lines); err != nil {
				return err
			}
		}
		if m.Reply != "" && inHostInbox(node, m.Reply) {
			// A following host sends each part as a request: an answer
			// says someone still reads. It goes nowhere but the host's
			// own inbox, whatever the part's reply subject says.
			_ = m.Respond([]byte("{}"))
		}
		if a.End {
			return nil
		}
	}
}

// sendHost asks node's host on subject with its answers due on a subject
// of the node's own (protocol.AnswerSubject), subscribed to before the ask
// is sent: a host answers there with the permissions it has for its own
// reports, and nobody but that host and the controllers may publish or
// read there. The caller reads the answers from the subscription and ends
// it; a message with noResponders says no host listens on subject.
func sendHost(nc *nats.Conn, node, subject string, body []byte) (*nats.Subscription, error) {
	reply := protocol.AnswerSubject(node, nuid.Next())
	sub, err := nc.SubscribeSync(reply)
	if err != nil {
		return nil, err
	}
	if err := nc.PublishRequest(subject, reply, body); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	return sub, nil
}

// requestHost asks node's host on subject (sendHost) and returns its one
// answer: nats.ErrNoResponders if no host listens there, ctx's error if
// none comes within protocol.AnswerTimeout.
func requestHost(ctx context.Context, nc *nats.Conn, node, subject string, body []byte) (*nats.Msg, error) {
	sub, err := sendHost(nc, node, subject, body)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	wctx, cancel := context.WithTimeout(ctx, protocol.AnswerTimeout)
	defer cancel()
	m, err := sub.NextMsgWithContext(wctx)
	if err != nil {
		return nil, err
	}
	if noResponders(m) {
		return nil, nats.ErrNoResponders
	}
	return m, nil
}

// noResponders says m is the broker's word that nobody listened to the
// request m answers (a NATS 503 status), not an answer.
func noResponders(m *nats.Msg) bool {
	return len(m.Data) == 0 && m.Header.Get("Status") == "503"
}

// inHostInbox says reply lies in node's host's own inbox: the one place a
// controller answers a host's request to it.
func inHostInbox(node, reply string) bool {
	prefix := protocol.HostInboxPrefix(node) + "."
	return strings.HasPrefix(reply, prefix) && len(reply) > len(prefix)
}

// AskRequest is a tool asked of a module.
type AskRequest struct {
	Module, Tool string
	Input        []byte
	Node         string
	Timeout      time.Duration
}

// Ask asks a running module's tool and returns its answer: any running
// instance (queue group), or the one on Node. Refused: a tool its manifest
// does not name, a node it is not assigned to, no instance running to
// answer, no answer within the timeout.
func (c *Modules) Ask(ctx context.Context, r AskRequest) ([]byte, error) {
	if err := CheckNames(r.Module, r.Tool); err != nil {
		return nil, err
	}
	if r.Node != "" {
		if err := CheckName(r.Node); err != nil {
			return nil, err
		}
	}
	if len(r.Input) == 0 {
		r.Input = []byte("{}")
	}
	if !json.Valid(r.Input) {
		return nil, fmt.Errorf("the input %w: give one JSON value, such as '{}'", ErrNotJSON)
	}
	if r.Timeout <= 0 {
		r.Timeout = 10 * time.Second
	}
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return nil, err
	}
	if _, ok := snap.Current[r.Module]; !ok {
		return nil, fmt.Errorf("module %s %w", r.Module, inventory.ErrModuleNotFound)
	}
	// The tools of every version assigned, and of the current one.
	tools := map[string]bool{}
	versions := []string{snap.Current[r.Module]}
	for _, a := range snap.Assignments {
		if a.Module == r.Module && (r.Node == "" || a.Node == r.Node) {
			versions = append(versions, a.Version)
		}
	}
	for _, v := range versions {
		for _, t := range snap.Manifests[r.Module][v].Tools {
			tools[t.Name] = true
		}
	}
	if !tools[r.Tool] {
		names := slices.Sorted(func(yield func(string) bool) {
			for t := range tools {
				if !yield(t) {
					return
				}
			}
		})
		if len(names) == 0 {
			return nil, fmt.Errorf("module %s %w %s: its manifest names no tools", r.Module, ErrNoSuchTool, r.Tool)
		}
		return nil, fmt.Errorf("module %s %w %s: its tools are %s", r.Module, ErrNoSuchTool, r.Tool, strings.Join(names, ", "))
	}
	subject := protocol.ToolSubject(r.Module, r.Tool)
	where := "of " + r.Module
	if r.Node != "" {
		if snap.VersionOn(r.Node, r.Module) == "" {
			return nil, fmt.Errorf("module %s %w %s", r.Module, ErrNotOnNode, r.Node)
		}
		subject = protocol.ToolSubjectOn(r.Module, r.Tool, r.Node)
		where = "of " + r.Module + " on " + r.Node
	}
	nc, err := c.dialBroker(ctx, st.Identity)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	actx, cancel := context.WithTimeout(ctx, r.Timeout)
	defer cancel()
	m, err := nc.RequestWithContext(actx, subject, r.Input)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return nil, fmt.Errorf("%w %s to answer %s", ErrNoInstance, where, r.Tool)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return nil, fmt.Errorf("%s %w %s within %s", r.Module, ErrNoAnswer, r.Tool, r.Timeout)
	case err != nil:
		return nil, err
	}
	return m.Data, nil
}
