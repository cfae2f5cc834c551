package app

import (
	"context"
	"errors"
	"fmt"
	"time"

	"mesh-controller/contexts/inventory"
)

// UpgradeStep is one node running an older version of a module.
type UpgradeStep struct {
	Node string `json:"node"`
	From string `json:"from"`
	To   string `json:"to"`
	// Serial is the declaration sent (roll-out); Applied says its host reported it applied.
	Serial  int64  `json:"serial,omitempty"`
	Applied bool   `json:"applied"`
	Error   string `json:"error,omitempty"`
}

// UpgradeView is what happens when a module's current version moves.
type UpgradeView struct {
	Module  string        `json:"module"`
	Current string        `json:"current"`
	Steps   []UpgradeStep `json:"nodes"`
	// Stopped names the node a roll-out stopped at, and why.
	Stopped string `json:"stopped,omitempty"`
}

// UpgradeRequest asks for a preview, a roll-out or a record.
type UpgradeRequest struct {
	Module string
	// Action is "show", "roll-out" or "record".
	Action   string
	Together bool
	// Wait bounds how long a roll-out waits for each node to report applied.
	Wait time.Duration
	// Progress, if set, is told each step as it happens.
	Progress func(string)
}

// ErrRollOutStopped means a roll-out stopped at a node; the error says where.
var ErrRollOutStopped = errors.New("the roll-out stopped")

// Upgrade previews, rolls out or records a module's move to its current
// version on the nodes that run an older one.
func (c *Controller) Upgrade(ctx context.Context, r UpgradeRequest) (UpgradeView, error) {
	if err := CheckName(r.Module); err != nil {
		return UpgradeView{}, err
	}
	if r.Progress == nil {
		r.Progress = func(string) {}
	}
	if r.Wait <= 0 {
		r.Wait = 2 * time.Minute
	}
	st, err := c.stores(ctx)
	if err != nil {
		return UpgradeView{}, err
	}
	inv, ids, sec := st.Inventory, st.Identity, st.Secrets
	snap, err := inv.Snapshot(ctx)
	if err != nil {
		return UpgradeView{}, err
	}
	cur, ok := snap.Current[r.Module]
	if !ok {
		return UpgradeView{}, fmt.Errorf("module %s %w", r.Module, inventory.ErrModuleNotFound)
	}
	v := UpgradeView{Module: r.Module, Current: cur, Steps: []UpgradeStep{}}
	for _, a := range snap.Assignments {
		if a.Module == r.Module && inventory.CompareVersions(a.Version, cur) < 0 {
			v.Steps = append(v.Steps, UpgradeStep{Node: a.Node, From: a.Version, To: cur})
		}
	}
	switch r.Action {
	case "", "show":
		return v, nil
	case "record":
		for _, s := range v.Steps {
			if err := inv.SetVersion(ctx, s.Node, r.Module, cur, []string{s.Node}); err != nil {
				return v, err
			}
		}
		return v, nil
	}
	if len(v.Steps) == 0 {
		return v, nil
	}
	// A roll-out waits for hosts: it needs the broker.
	nc, err := c.dialBroker(ctx, ids)
	if err != nil {
		return v, err
	}
	nc.Close()
	waitFor := func(i int) error {
		s := &v.Steps[i]
		deadline := time.Now().Add(r.Wait)
		for {
			n, err := inv.Node(ctx, s.Node)
			if err != nil {
				return err
			}
			if n.SerialApplied >= s.Serial {
				s.Applied = true
				r.Progress(fmt.Sprintf("%s applied declaration %d (%s %s)", s.Node, s.Serial, r.Module, s.To))
				return nil
			}
			if o := n.LastOutcome; o != nil && !o.OK && o.Serial == s.Serial {
				s.Error = o.Error
				return fmt.Errorf("%w at %s: declaration %d failed there: %s", ErrRollOutStopped, s.Node, s.Serial, o.Error)
			}
			if time.Now().After(deadline) {
				s.Error = "not reported applied within " + r.Wait.String()
				return fmt.Errorf("%w at %s: declaration %d not reported applied within %s", ErrRollOutStopped, s.Node, s.Serial, r.Wait)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	send := func(i int) error {
		s := &v.Steps[i]
		if err := inv.SetVersion(ctx, s.Node, r.Module, cur, []string{s.Node}); err != nil {
			return err
		}
		pushed, err := c.sendPlans(ctx, inv, ids, sec, []string{s.Node})
		if err != nil {
			return err
		}
		p := pushed[0]
		s.Serial = p.Serial
		if p.Problem != "" || !p.Sent {
			s.Error = p.Problem + p.NotSent
			return fmt.Errorf("%w at %s: %s", ErrRollOutStopped, s.Node, s.Error)
		}
		r.Progress(fmt.Sprintf("%s sent declaration %d (%s %s -> %s)", s.Node, s.Serial, r.Module, s.From, s.To))
		return nil
	}
	if r.Together {
		// Every node moves at once: versions set in one pass, then one push
		// from one snapshot and one broker connection, not a round trip each.
		nodes := make([]string, len(v.Steps))
		for i, s := range v.Steps {
			if err := inv.SetVersion(ctx, s.Node, r.Module, cur, []string{s.Node}); err != nil {
				return v, err
			}
			nodes[i] = s.Node
		}
		pushed, err := c.sendPlans(ctx, inv, ids, sec, nodes)
		if err != nil {
			return v, err
		}
		byNode := map[string]Pushed{}
		for _, p := range pushed {
			byNode[p.Node] = p
		}
		for i := range v.Steps {
			p := byNode[v.Steps[i].Node]
			v.Steps[i].Serial = p.Serial
			if p.Problem != "" || !p.Sent {
				v.Steps[i].Error = p.Problem + p.NotSent
				v.Stopped = v.Steps[i].Node
				return v, fmt.Errorf("%w at %s: %s", ErrRollOutStopped, v.Steps[i].Node, v.Steps[i].Error)
			}
		}
		r.Progress(fmt.Sprintf("sent %s (%s %s)", Plural(len(nodes), "declaration"), r.Module, cur))
		var errs []error
		for i := range v.Steps {
			if err := waitFor(i); err != nil {
				errs = append(errs, err)
			}
		}
		return v, errors.Join(errs...)
	}
	for i := range v.Steps {
		if err := send(i); err != nil {
			v.Stopped = v.Steps[i].Node
			return v, err
		}
		if err := waitFor(i); err != nil {
			v.Stopped = v.Steps[i].Node
			return v, err
		}
	}
	return v, nil
}
