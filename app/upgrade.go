package app

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"mesh-controller/app/protocol"
	"mesh-controller/contexts/inventory"
)

// UpgradeStep is one node running an older version of a module.
type UpgradeStep struct {
	Node string `json:"node"`
	From string `json:"from"`
	To   string `json:"to"`
	// Recorded says upgrade record set it, and nothing was sent.
	Recorded bool `json:"recorded,omitempty"`
	// Serial is the declaration sent (roll-out); Applied says its host reported it applied.
	Serial  int64 `json:"serial,omitempty"`
	Applied bool  `json:"applied"`
	// Ready says its host reported the module ready at the new version;
	// a module with no run section is done once applied.
	Ready bool   `json:"ready"`
	Error string `json:"error,omitempty"`
	// Detail is its host's word on the module once ready (its prepare
	// ran, on which snapshot), if it said one.
	Detail string `json:"detail,omitempty"`
}

// UpgradeView is what happens when a module's current version moves.
type UpgradeView struct {
	Module  string        `json:"module"`
	Current string        `json:"current"`
	Steps   []UpgradeStep `json:"nodes"`
	// Stopped names the node a roll-out stopped at, and why.
	Stopped string `json:"stopped,omitempty"`
	// RollOut is the module's last roll-out as the store keeps it (its
	// phase, options, and what became of each node), if it had one.
	RollOut *inventory.RollOut `json:"roll_out,omitempty"`
}

// UpgradeRequest asks for a preview, a roll-out, a rollback or a record.
type UpgradeRequest struct {
	Module string
	// Action is "show", "roll-out", "rollback" or "record".
	Action string
	// Together is Canary 0 and Batch "100%": every node at once.
	Together bool
	// Canary is how many nodes move first, on their own (0: none); Batch
	// how many move together after them: "N" nodes or "P%" of the nodes
	// to move ("": 1).
	Canary int
	Batch  string
	// Wait bounds how long a roll-out waits for each batch to report
	// ready (and a rollback for its nodes to be back).
	Wait time.Duration
	// Soak is how long a batch must stay ready before the next moves.
	Soak time.Duration
	// MaxFailures is how many nodes may fail before the roll-out stops and
	// every node it moved goes back.
	MaxFailures int
	// WithoutSnapshot lets a roll-out's nodes prepare the new version
	// where the module's irreplaceable data cannot be snapshotted first.
	WithoutSnapshot bool
	// Why is why a rollback is asked, or a roll-out without a snapshot
	// (required for both).
	Why string
	// Progress, if set, is told each step as it happens.
	Progress func(string)
	// Tally, if set, is told how far a followed roll-out (or rollback) is
	// each time it is read, and Progress is then told only what is said
	// once (recorded, rolling back, no controller serving), not what each
	// node and each batch does: for one running line on a terminal.
	Tally func(RollOutTally)
}

// ErrRollOutStopped means a roll-out stopped at a node; the error says where.
var ErrRollOutStopped = errors.New("the roll-out stopped")

// Upgrade previews, rolls out or records a module's move to its current
// version on the nodes that do not run it yet: those whose assignment is at
// an older version (or has the current one only recorded), and those whose
// host has not yet applied the declaration that carries it — a roll-out
// judges by what hosts report applied.
func (c *Modules) Upgrade(ctx context.Context, r UpgradeRequest) (UpgradeView, error) {
	v, err := c.upgrade(ctx, r)
	if err != nil && ctx.Err() != nil && (r.Action == "roll-out" || r.Action == "rollback") {
		err = interrupted(moduleRolled(v.Module), v, ctx.Err())
	}
	return v, err
}

// ErrRollOutInterrupted means a roll-out was stopped by its command being
// interrupted (Ctrl-C) or its context ending.
var ErrRollOutInterrupted = errors.New("roll-out interrupted")

// interrupted says where a roll-out was when its command was interrupted
// and how to follow it: which nodes run the new version, which were sent
// it and not yet heard ready (their hosts go on applying it), which were
// not sent it yet. The serving controller drives the roll-out on.
func interrupted(what rolled, v UpgradeView, cause error) error {
	var done, sent, left []string
	for _, s := range v.Steps {
		switch {
		case s.Ready:
			done = append(done, s.Node)
		case s.Serial != 0:
			sent = append(sent, fmt.Sprintf("%s (declaration %d)", s.Node, s.Serial))
		default:
			left = append(left, s.Node)
		}
	}
	list := func(nodes []string) string {
		if len(nodes) == 0 {
			return "none"
		}
		if len(nodes) > 10 {
			return strings.Join(nodes[:10], ", ") + fmt.Sprintf(" and %d more", len(nodes)-10)
		}
		return strings.Join(nodes, ", ")
	}
	return fmt.Errorf("%w (%w): %s %s runs on %s of %d: %s; sent, not yet heard ready (their hosts go on applying it): %s; not sent yet: %s; the serving controller goes on with it: follow it with '%s', and once it ended, return the nodes it moved with '%s --why ...'",
		ErrRollOutInterrupted, cause, what.label, v.Current, Plural(len(done), "node"), len(v.Steps), list(done), list(sent), list(left), what.show, what.rollback)
}

func (c uses) upgrade(ctx context.Context, r UpgradeRequest) (UpgradeView, error) {
	if err := CheckName(r.Module); err != nil {
		return UpgradeView{}, err
	}
	if r.Progress == nil {
		r.Progress = func(string) {}
	}
	if r.Wait <= 0 {
		r.Wait = 2 * time.Minute
	}
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return UpgradeView{}, err
	}
	inv := st.Inventory
	cur, ok := snap.Current[r.Module]
	if !ok {
		return UpgradeView{}, fmt.Errorf("module %s %w", r.Module, inventory.ErrModuleNotFound)
	}
	v := UpgradeView{Module: r.Module, Current: cur, Steps: behind(snap, r.Module, cur, r.Action == "roll-out")}
	switch r.Action {
	case "", "show":
		if ro, ok, err := inv.RollOut(ctx, r.Module); err != nil || ok {
			v.RollOut = &ro
			return v, err
		}
		return v, nil
	case "rollback":
		return c.rollBackByHand(ctx, st, snap, v, r)
	case "record":
		// Recorded, not sent: the catch-up leaves these nodes alone until
		// 'push --behind' or a roll-out.
		all := make([]int, len(v.Steps))
		for i := range all {
			all[i] = i
		}
		_, err := c.moveVersions(ctx, inv, v, all, false)
		return v, err
	}
	if len(v.Steps) == 0 {
		return v, nil
	}
	return c.startRollOut(ctx, st, snap, v, r)
}

// behind are the steps that move module's nodes to cur: those whose
// assignment is at an older version, and for a roll-out those whose host
// has not applied the declaration that carries cur yet.
func behind(snap *inventory.Snapshot, module, cur string, rollOut bool) []UpgradeStep {
	steps := []UpgradeStep{}
	for _, a := range snap.Assignments {
		if a.Module != module {
			continue
		}
		switch {
		case inventory.CompareVersions(a.Version, cur) < 0:
			steps = append(steps, UpgradeStep{Node: a.Node, From: a.Version, To: cur, Recorded: a.Pending == cur})
		case rollOut && snap.Nodes[a.Node].Undelivered():
			// Declared, or about to be, but not yet applied by its host.
			steps = append(steps, UpgradeStep{Node: a.Node, From: a.Version, To: cur})
		}
	}
	return steps
}

// UpgradeAll previews every module's upgrade, by name: the nodes that run
// an older version than its current one, and its last roll-out. It is
// what 'upgrade' with no module shows.
func (c *Modules) UpgradeAll(ctx context.Context) ([]UpgradeView, error) {
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return nil, err
	}
	names := slices.Sorted(maps.Keys(snap.Current))
	out := make([]UpgradeView, 0, len(names))
	for _, m := range names {
		v := UpgradeView{Module: m, Current: snap.Current[m], Steps: behind(snap, m, snap.Current[m], false)}
		ro, ok, err := st.Inventory.RollOut(ctx, m)
		if err != nil {
			return nil, err
		}
		if ok {
			v.RollOut = &ro
		}
		out = append(out, v)
	}
	return out, nil
}

// rollMover moves a roll-out's nodes: one connection and one signing key
// serve every step; only the mesh is read again.
type rollMover struct {
	c  uses
	st *Stores
	d  *declarer
}

// newRollMover dials the broker and reads the signing key.
func (c uses) newRollMover(ctx context.Context, st *Stores) (*rollMover, error) {
	nc, err := c.dialBroker(ctx, st.Identity)
	if err != nil {
		return nil, err
	}
	d, err := c.newDeclarer(ctx, st)
	if err != nil {
		nc.Close()
		return nil, err
	}
	d.nc = nc
	return &rollMover{c: c, st: st, d: d}, nil
}

// close lets the broker connection go.
func (m *rollMover) close() {
	if m.d.nc != nil {
		m.d.nc.Close()
	}
}

// move moves these steps (each to its To) as one act and sends their
// declarations; committed says the move was committed, whatever became of
// the sending (a declaration not sent is kept, and the step's Error says
// why).
func (m *rollMover) move(ctx context.Context, v *UpgradeView, steps []int) (committed bool, err error) {
	return m.moveBy(ctx, v, steps, func() (inventory.Change, error) { return m.c.moveVersions(ctx, m.st.Inventory, *v, steps, true) })
}

// moveBy moves these steps as move does, the act committed by commit (which
// judges and writes it, and returns the change it wrote).
func (m *rollMover) moveBy(ctx context.Context, v *UpgradeView, steps []int, commit func() (inventory.Change, error)) (committed bool, err error) {
	c, st, d, inv := m.c, m.st, m.d, m.st.Inventory
	under, err := inv.BeginAct(ctx, "roll-out", c.Now().Add(actUnderWayFor))
	if err != nil {
		return false, err
	}
	defer inv.EndAct(context.WithoutCancel(ctx), under, c.Now())
	ch, err := commit()
	if err != nil {
		return false, err
	}
	// Declared from the mesh as just written: a declaration records the
	// plan version it was made from.
	snap, err := inv.Snapshot(ctx)
	if err != nil {
		return true, err
	}
	// What the new version needs made (its broker user, new secrets)
	// goes in the same declaration, as any act's does.
	if _, err := c.ensureMade(ctx, st, snap, ch.Bump); err != nil {
		return true, err
	}
	if d.nc == nil || d.nc.IsClosed() {
		// The broker went away between steps (serve restarted, say):
		// dial again; if none answers, the declaration is kept and the
		// step says why.
		d.nc, d.notSent = nil, ""
		if nc, err := c.dialBroker(ctx, st.Identity); err != nil {
			d.notSent = err.Error()
		} else {
			d.nc = nc
		}
	}
	pushed := d.declare(ctx, snap, ch.Bump)
	var errs []error
	for k, i := range steps {
		s, p := &v.Steps[i], pushed[k]
		s.Serial = p.Serial
		if p.Problem != "" || !p.Sent {
			s.Error = p.Problem + p.NotSent
			v.Stopped = s.Node
			errs = append(errs, fmt.Errorf("%w at %s: %s", ErrRollOutStopped, s.Node, s.Error))
		}
	}
	return true, errors.Join(errs...)
}

// waitApplied waits, with one deadline for them all, until the hosts of
// these steps report their declarations applied or failed; a node silent
// past the deadline is said, not waited for one after another.
func (c uses) waitApplied(ctx context.Context, st *Stores, snap *inventory.Snapshot, v *UpgradeView, steps []int, r UpgradeRequest) error {
	inv := st.Inventory
	deadline := time.Now().Add(r.Wait)
	// A module that runs is waited for until its host reports it ready at
	// the new version, and stops the roll-out where it failed or loops.
	runs := func(version string) bool { return snap.Manifests[r.Module][version].Run != nil }
	waiting := slices.Clone(steps)
	var errs []error
	for len(waiting) > 0 {
		names := make([]string, len(waiting))
		for k, i := range waiting {
			names[k] = v.Steps[i].Node
		}
		// Only the nodes still waited on: this is read every 50 ms.
		nodes, err := inv.NodesNamed(ctx, names)
		if err != nil {
			return err
		}
		byName := make(map[string]inventory.Node, len(nodes))
		for _, n := range nodes {
			byName[n.Name] = n
		}
		states, err := st.Health.ModuleStatesOn(ctx, r.Module, names)
		if err != nil {
			return err
		}
		waiting = slices.DeleteFunc(waiting, func(i int) bool {
			s := &v.Steps[i]
			n := byName[s.Node]
			if !s.Applied && n.SerialApplied >= s.Serial {
				s.Applied = true
				r.Progress(fmt.Sprintf("%s applied declaration %d (%s %s)", s.Node, s.Serial, r.Module, s.To))
				if !runs(s.To) {
					s.Ready = true
					return true
				}
			}
			if m, ok := states[s.Node]; s.Applied && ok && m.Version == s.To {
				switch m.State {
				case protocol.StateReady:
					s.Ready, s.Detail = true, m.Detail
					r.Progress(fmt.Sprintf("%s runs %s %s: ready", s.Node, r.Module, s.To))
					return true
				case protocol.StateFailed, protocol.StateCrashLooping:
					s.Error = fmt.Sprintf("%s %s is %s there", r.Module, s.To, m.State)
					if why := strings.TrimSpace(m.Detail + " " + m.LastExit); why != "" {
						s.Error += ": " + why
					}
					errs = append(errs, fmt.Errorf("%w at %s: %s", ErrRollOutStopped, s.Node, s.Error))
					return true
				}
			}
			switch {
			case s.Applied:
				return false
			case n.LastOutcome != nil && !n.LastOutcome.OK && n.LastOutcome.Serial == s.Serial:
				s.Error = n.LastOutcome.Error
				errs = append(errs, fmt.Errorf("%w at %s: declaration %d failed there: %s", ErrRollOutStopped, s.Node, s.Serial, s.Error))
				return true
			}
			return false
		})
		if len(waiting) == 0 {
			break
		}
		if time.Now().After(deadline) {
			var silent []string
			var notReady []string
			for _, i := range waiting {
				if v.Steps[i].Applied {
					v.Steps[i].Error = "applied, but " + r.Module + " not reported ready within " + r.Wait.String()
					notReady = append(notReady, v.Steps[i].Node)
					continue
				}
				v.Steps[i].Error = "not reported applied within " + r.Wait.String()
				silent = append(silent, v.Steps[i].Node)
			}
			if len(silent) > 0 {
				errs = append(errs, fmt.Errorf("%w: %s did not report declaration applied within %s", ErrRollOutStopped, strings.Join(silent, ", "), r.Wait))
			}
			if len(notReady) > 0 {
				errs = append(errs, fmt.Errorf("%w: %s did not report %s ready within %s", ErrRollOutStopped, strings.Join(notReady, ", "), r.Module, r.Wait))
			}
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return errors.Join(errs...)
}

// moveVersions judges and commits, as one act, these steps of an upgrade
// (each to its To: the current version, or back to the version it ran):
// each node still runs the module, and
// the new version claims no port or data path another module there has.
// They are recorded pending (a record) or moved (a roll-out's step, its
// nodes' plans with them) in one transaction, judged again if another act
// committed in between. It returns the change committed.
func (c uses) moveVersions(ctx context.Context, inv *inventory.Store, v UpgradeView, steps []int, move bool) (inventory.Change, error) {
	if len(steps) == 0 {
		return inventory.Change{}, nil
	}
	return retryAct(ctx, func() (inventory.Change, error) {
		snap, err := inv.Snapshot(ctx)
		if err != nil {
			return inventory.Change{}, err
		}
		ch := inventory.Change{Based: snap.Revision}
		var problems []string
		for _, i := range steps {
			node, to := v.Steps[i].Node, v.Steps[i].To
			m, ok := snap.Manifests[v.Module][to]
			if !ok {
				return inventory.Change{}, fmt.Errorf("module %s %s %w", v.Module, to, inventory.ErrModuleNotFound)
			}
			here := map[string]inventory.Manifest{}
			on := false
			for _, a := range snap.AssignmentsOf(node) {
				if a.Module == v.Module {
					on = true
					continue
				}
				here[a.Module] = snap.Manifests[a.Module][a.Version]
			}
			if !on {
				problems = append(problems, fmt.Sprintf("%s is no longer on %s", v.Module, node))
				continue
			}
			problems = append(problems, inventory.PortClashes(node, here, []inventory.Manifest{m})...)
			problems = append(problems, inventory.DataPathClashes(node, here, []inventory.Manifest{m})...)
			a := inventory.Assignment{Node: node, Module: v.Module, Version: to}
			if move {
				ch.Versions = append(ch.Versions, a)
				ch.Bump = append(ch.Bump, node)
			} else {
				ch.Pending = append(ch.Pending, a)
			}
		}
		if err := refuse("upgrade "+v.Module+" to "+v.Steps[steps[0]].To, problems); err != nil {
			return inventory.Change{}, err
		}
		// One transaction for every node moved at once.
		return ch, inv.Apply(ctx, ch, c.Now())
	})
}
