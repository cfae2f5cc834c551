package app

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strings"

	"mesh-controller/app/daemon"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/health"
	"mesh-controller/contexts/inventory"
)

// ErrNotAnObject means a declaration file is not one JSON object.
var ErrNotAnObject = errors.New("the declaration file is not one JSON object")

// ErrTooLarge means an input is over the size it may be; the error says both.
var ErrTooLarge = errors.New("too large")

// DeclareRequest is a hand-written declaration body for a node.
type DeclareRequest struct {
	Node string
	// Body is the file's content: a JSON object; node, serial and issued_at are filled in.
	Body []byte
	// From names the file, for the hand-act record.
	From string
	Why  string
}

// Declared is what declare did.
type Declared struct {
	Node   string
	Serial int64
	Joined bool
	// Sent says it was published to the node now; otherwise NotSent says why
	// and the node gets it when it next asks (at latest when serve runs).
	Sent    bool
	NotSent string
}

// Declare signs a hand-written declaration for a node, keeps it as the
// node's latest, records the hand act, and sends it if a broker is reachable.
func (c *Modules) Declare(ctx context.Context, r DeclareRequest) (Declared, error) {
	if err := CheckName(r.Node); err != nil {
		return Declared{}, err
	}
	if r.Why == "" {
		return Declared{}, health.ErrNoWhy
	}
	if len(r.Body) > protocol.MaxDeclarationBytes {
		return Declared{}, fmt.Errorf("%s: %w (%d bytes; at most %d)", r.From, ErrTooLarge, len(r.Body), protocol.MaxDeclarationBytes)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(r.Body, &obj); err != nil || obj == nil {
		return Declared{}, fmt.Errorf("%s: %w", r.From, ErrNotAnObject)
	}
	var body protocol.Declaration
	dec := json.NewDecoder(bytes.NewReader(r.Body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		// A typo must not pass silently: an unknown field, or one of the wrong type.
		return Declared{}, refuse("declare "+r.Node+" "+r.From, []string{r.From + ": " + strings.TrimPrefix(err.Error(), "json: ")})
	}
	st, err := c.stores(ctx)
	if err != nil {
		return Declared{}, err
	}
	inv, ids, hl := st.Inventory, st.Identity, st.Health
	node, err := inv.Node(ctx, r.Node)
	if err != nil {
		return Declared{}, err
	}
	key, err := ids.SigningKey(ctx)
	if err != nil {
		return Declared{}, err
	}
	// The host fills in nothing: what is signed is what it judges.
	body.Node = r.Node
	if body.Mode == "" {
		body.Mode = string(node.Mode)
	}
	for i, m := range body.Modules {
		if len(m.Settings) > 0 {
			if body.Modules[i].Settings, err = protocol.Canonical(m.Settings); err != nil {
				return Declared{}, refuse("declare "+r.Node+" "+r.From, []string{fmt.Sprintf("%s: modules[%d].settings: %v", r.From, i, err)})
			}
		}
	}
	// Judged by the rules the host applies, before anything is signed.
	if problems := body.Problems(); len(problems) > 0 {
		for i := range problems {
			problems[i] = r.From + ": " + problems[i]
		}
		return Declared{}, refuse("declare "+r.Node+" "+r.From, problems)
	}
	if body.Overlay != nil {
		facts, _, err := inv.Facts(ctx, r.Node)
		if err != nil {
			return Declared{}, err
		}
		own := ""
		for _, f := range facts {
			if f.Name == protocol.FactWireGuardKey {
				own = f.Value
			}
		}
		if err := protocol.CheckOverlay(body.Overlay, own); err != nil {
			return Declared{}, refuse("declare "+r.Node+" "+r.From, []string{r.From + ": overlay: " + err.Error()})
		}
	}
	d := &declarer{key: key}
	decl, err := inv.SaveDeclaration(ctx, r.Node, inventory.CurrentPlan, d.signer(body), c.Now())
	if err != nil {
		return Declared{}, err
	}
	out := Declared{Node: r.Node, Serial: decl.Serial, Joined: node.JoinedAt != nil}
	if _, err := hl.RecordHandAct(ctx, health.HandAct{At: c.Now(), What: fmt.Sprintf("declare %s serial %d from %s", r.Node, decl.Serial, r.From),
		Why: r.Why, Cause: "declare", Who: who()}); err != nil {
		return out, err
	}
	nc, err := c.dialBroker(ctx, ids)
	if err != nil {
		out.NotSent = err.Error()
		return out, nil
	}
	defer nc.Close()
	if err := daemon.PublishDeclaration(nc, decl); err != nil {
		out.NotSent = err.Error()
		return out, nil
	}
	if err := nc.FlushTimeout(protocol.AnswerTimeout); err != nil {
		out.NotSent = err.Error()
		return out, nil
	}
	out.Sent = true
	return out, nil
}

// who names the person running a command: user@host.
func who() string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	host, _ := os.Hostname()
	return name + "@" + host
}
