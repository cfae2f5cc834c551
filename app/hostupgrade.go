package app

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"mesh-controller/app/protocol"
	"mesh-controller/contexts/health"
	"mesh-controller/contexts/inventory"
)

// The hosts upgrade themselves (issue 31): a host release is declared to
// their nodes in a roll-out of kind host, moved and judged batch by batch
// by the same driver as a module's (rollout.go), rolled back the same way.
// A host is ready at the new release once it reports the declaration
// applied, says it runs the release, beats, and its modules that were
// ready before it moved are ready with the same pids: none was restarted
// by its upgrade.

// HostUpgradeRequest asks for the hosts' upgrade: shown (no To, no
// Rollback), rolled out to To, or the last roll-out rolled back.
type HostUpgradeRequest struct {
	// To is the host release to roll out; Nodes, if any, the only nodes
	// moved (else every joined node whose host runs another version).
	To    string
	Nodes []string
	// Rollback returns the nodes the last host roll-out moved (Why
	// required).
	Rollback bool
	Why      string
	// The roll-out's options, as a module's (UpgradeRequest).
	Canary      int
	Batch       string
	Wait, Soak  time.Duration
	MaxFailures int
	// Progress, if set, is told each step as it happens.
	Progress func(string)
	// Tally is UpgradeRequest's: how far the roll-out is, in place of a
	// line a host.
	Tally func(RollOutTally)
}

// HostNode is one node's host as the hosts' upgrade shows it.
type HostNode struct {
	Node   string `json:"node"`
	Joined bool   `json:"joined"`
	// Runs is the version its host says it runs; Declared the host release
	// declared to it ("" for none: it is left on what it runs).
	Runs     string `json:"runs"`
	Declared string `json:"declared,omitempty"`
}

// HostUpgradeView is the hosts' upgrade: what each host runs and is
// declared, and the last host roll-out node by node.
type HostUpgradeView struct {
	// To is the release rolled out (or the last roll-out's).
	To      string             `json:"to,omitempty"`
	Nodes   []HostNode         `json:"nodes"`
	RollOut *inventory.RollOut `json:"roll_out,omitempty"`
	// Started says this act started a roll-out (false with --to: every
	// host named runs the release already).
	Started bool `json:"started,omitempty"`
}

// ErrNoSuchHostRelease means a host upgrade names a version the
// controller keeps no release of.
var ErrNoSuchHostRelease = errors.New("no host release of that version is kept")

// HostUpgrade shows the hosts' upgrade, rolls a host release out (canary,
// batches, health-gated, rolled back past --max-failures) or rolls the
// last host roll-out back, as r asks; a roll-out is driven by the serving
// controller, and followed until it ends.
func (c *Modules) HostUpgrade(ctx context.Context, r HostUpgradeRequest) (HostUpgradeView, error) {
	if r.Progress == nil {
		r.Progress = func(string) {}
	}
	if r.Wait <= 0 {
		r.Wait = 2 * time.Minute
	}
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return HostUpgradeView{}, err
	}
	hv := HostUpgradeView{Nodes: []HostNode{}}
	runs, err := c.hostVersions(ctx, st, snap)
	if err != nil {
		return hv, err
	}
	for _, name := range snap.NodeNames {
		n := snap.Nodes[name]
		hv.Nodes = append(hv.Nodes, HostNode{Node: name, Joined: n.Joined, Runs: runs[name], Declared: n.HostRelease})
	}
	ro, ok, err := st.Inventory.RollOut(ctx, inventory.HostRollOut)
	if err != nil {
		return hv, err
	}
	if ok {
		hv.RollOut, hv.To = &ro, ro.To
	}
	ur := UpgradeRequest{Module: hostRolled.label, Canary: r.Canary, Batch: r.Batch, Wait: r.Wait, Soak: r.Soak, MaxFailures: r.MaxFailures,
		Why: r.Why, Progress: r.Progress, Tally: r.Tally}
	var v UpgradeView
	switch {
	case r.Rollback:
		v = UpgradeView{Module: hostRolled.label, Current: hv.To, Steps: []UpgradeStep{}}
		if ok {
			for _, n := range ro.Nodes {
				v.Steps = append(v.Steps, UpgradeStep{Node: n.Node, From: n.From, To: ro.To})
			}
		}
		v, err = c.rollBackRolled(ctx, st, snap, hostRolled, v, ur)
	case r.To != "":
		v, err = c.startHostRollOut(ctx, st, snap, runs, r, ur)
		if v.RollOut == nil && err == nil {
			hv.To = r.To
			return hv, nil // nothing to move
		}
		hv.Started = v.RollOut != nil
	default:
		return hv, nil
	}
	if v.RollOut != nil {
		hv.RollOut, hv.To = v.RollOut, v.RollOut.To
	}
	if err != nil && ctx.Err() != nil {
		err = interrupted(hostRolled, v, ctx.Err())
	}
	return hv, err
}

// hostVersions are what each node's host says it runs: from its beats,
// else as it said when it joined (a host that predates saying it in its
// beats, joined before the controller kept it with the node).
func (c uses) hostVersions(ctx context.Context, st *Stores, snap *inventory.Snapshot) (map[string]string, error) {
	out := make(map[string]string, len(snap.Nodes))
	missing := false
	for name, n := range snap.Nodes {
		out[name] = n.HostVersion
		missing = missing || (n.Joined && n.HostVersion == "")
	}
	if !missing {
		return out, nil
	}
	hosts, err := st.Identity.Hosts(ctx)
	if err != nil {
		return nil, err
	}
	for _, h := range hosts {
		if out[h.Node] == "" && snap.Nodes[h.Node].Joined {
			out[h.Node] = hostVersionOf(h.HostVersion)
		}
	}
	return out, nil
}

// startHostRollOut judges a host roll-out to r.To and records it for the
// serving controller to drive, then follows it. Refused in one line: a
// version with no release kept, nodes that did not join (or are not
// known), a roll-out under way. Nothing to move (every host named runs the
// release, and is declared it) is no roll-out.
func (c uses) startHostRollOut(ctx context.Context, st *Stores, snap *inventory.Snapshot, runs map[string]string, r HostUpgradeRequest, ur UpgradeRequest) (UpgradeView, error) {
	v := UpgradeView{Module: hostRolled.label, Current: r.To, Steps: []UpgradeStep{}}
	if err := CheckRollOut(ur); err != nil {
		return v, err
	}
	if _, ok := snap.HostReleases[r.To]; !ok {
		kept := make([]string, 0, len(snap.HostReleases))
		for ver := range snap.HostReleases {
			kept = append(kept, ver)
		}
		slices.Sort(kept)
		have := "none is kept"
		if len(kept) > 0 {
			have = "kept: " + strings.Join(kept, ", ")
		}
		return v, fmt.Errorf("mesh-host %s: %w (%s): add it with 'mesh-controller host release add FILE'", r.To, ErrNoSuchHostRelease, have)
	}
	names := r.Nodes
	if len(names) == 0 {
		for _, name := range snap.NodeNames {
			if snap.Nodes[name].Joined {
				names = append(names, name)
			}
		}
	}
	var unknown, unjoined, unsaid []string
	for _, name := range names {
		n, ok := snap.Nodes[name]
		switch {
		case !ok:
			unknown = append(unknown, name)
		case !n.Joined:
			unjoined = append(unjoined, name)
		case runs[name] == "":
			unsaid = append(unsaid, name)
		}
	}
	switch {
	case len(unknown) > 0:
		return v, fmt.Errorf("%s %w: name nodes 'mesh-controller node list' shows", strings.Join(clipNames(unknown), ", "), inventory.ErrNodeNotFound)
	case len(unjoined) > 0:
		them := "it"
		if len(unjoined) > 1 {
			them = "them"
		}
		return v, fmt.Errorf("%s did not join: a host upgrades itself once it runs; join %s first, or leave %s out of --nodes", strings.Join(clipNames(unjoined), ", "), them, them)
	case len(unsaid) > 0:
		return v, fmt.Errorf("%s: the host has not said the version it runs, which a rollback would return it to; leave it out of --nodes", strings.Join(clipNames(unsaid), ", "))
	}
	// One roll-out at a time: a module's would restart the modules a host
	// upgrade keeps running, and fail it.
	under, err := st.Inventory.RollOutsUnderWay(ctx)
	if err != nil {
		return v, err
	}
	if len(under) > 0 {
		what := rolledKey(under[0])
		return v, fmt.Errorf("a roll-out of %s is under way: follow it with '%s', and start the hosts' once it ended", what.label, what.show)
	}
	for _, name := range names {
		n := snap.Nodes[name]
		if runs[name] == r.To && n.HostRelease == r.To && !n.Undelivered() {
			continue
		}
		v.Steps = append(v.Steps, UpgradeStep{Node: name, From: runs[name], To: r.To})
	}
	if len(v.Steps) == 0 {
		return v, nil
	}
	return c.recordRollOut(ctx, st, hostRolled, inventory.RollOutOfHost, v, ur)
}

// hostVersionOf is a version a host said it runs, "" if it is none a host
// version can be (ValidHostVersion): what a host says is bounded.
func hostVersionOf(v string) string {
	if !protocol.ValidHostVersion(v) {
		return ""
	}
	return v
}

// clipNames are at most ten names, and how many more there were.
func clipNames(names []string) []string {
	if len(names) <= 10 {
		return names
	}
	return append(slices.Clone(names[:10]), fmt.Sprintf("and %d more", len(names)-10))
}

// hostRoll moves hosts to a host release, and judges them (rollKind).
type hostRoll struct {
	c uses
	// before are, by node, the pids of its modules that were ready when it
	// was moved: ready with the same pids once it runs the release, and
	// through the soak. A driver started again (serve restarted) knows
	// none for what was moved before: those nodes are judged on their
	// modules being ready.
	before map[string]map[string]int
}

func (k *hostRoll) returning(snap *inventory.Snapshot, ro inventory.RollOut) []int {
	return returning(ro, func(node string) string { return snap.Nodes[node].HostRelease })
}

// move remembers the pids of each node's ready modules, then declares the
// nodes their step's release as one act. A node going back after it failed
// is not held to its modules' pids: they may have restarted with its
// failure (a release that could not come up ended them).
func (k *hostRoll) move(ctx context.Context, m *rollMover, ro *inventory.RollOut, v *UpgradeView, steps []int) (bool, error) {
	if k.before == nil {
		k.before = map[string]map[string]int{}
	}
	failed := map[string]bool{}
	for _, n := range ro.Nodes {
		failed[n.Node] = n.Result == "failed"
	}
	for _, i := range steps {
		node := v.Steps[i].Node
		if failed[node] {
			delete(k.before, node)
			continue
		}
		states, err := m.st.Health.ModuleStates(ctx, node)
		if err != nil {
			return false, err
		}
		k.before[node] = readyPids(states)
	}
	inv := m.st.Inventory
	return m.moveBy(ctx, v, steps, func() (inventory.Change, error) {
		return retryAct(ctx, func() (inventory.Change, error) {
			snap, err := inv.Snapshot(ctx)
			if err != nil {
				return inventory.Change{}, err
			}
			ch := inventory.Change{Based: snap.Revision}
			var problems []string
			for _, i := range steps {
				s := v.Steps[i]
				if n, ok := snap.Nodes[s.Node]; !ok || !n.Joined {
					problems = append(problems, s.Node+" is no longer a joined node")
					continue
				}
				ch.HostReleases = append(ch.HostReleases, inventory.NodeHostRelease{Node: s.Node, Version: s.To})
				ch.Bump = append(ch.Bump, s.Node)
			}
			if err := refuse("upgrade mesh-host to "+v.Steps[steps[0]].To, problems); err != nil {
				return inventory.Change{}, err
			}
			return ch, inv.Apply(ctx, ch, k.c.Now())
		})
	})
}

// readyPids are the pids of the ready modules among states, by module.
func readyPids(states []health.ModuleState) map[string]int {
	out := map[string]int{}
	for _, m := range states {
		if m.State == protocol.StateReady && m.Pid > 0 {
			out[m.Module] = m.Pid
		}
	}
	return out
}

// hostReady says whether a node's host, having applied its step's
// declaration, is ready at the step's release: it says it runs it, and
// every module that was ready before it moved is ready with the same pid
// ("" and done). A module with another pid is a failure (why, and done);
// anything else is waited for (why, and not done).
func (k *hostRoll) hostReady(n inventory.Node, s UpgradeStep, states []health.ModuleState) (why string, done bool) {
	if n.HostVersion != s.To {
		return fmt.Sprintf("applied declaration %d, but its host says it runs mesh-host %s, not %s", s.Serial, orUnknown(n.HostVersion), s.To), false
	}
	now := map[string]health.ModuleState{}
	for _, m := range states {
		now[m.Module] = m
	}
	for module, pid := range k.before[n.Name] {
		m, ok := now[module]
		switch {
		case !ok:
			return fmt.Sprintf("%s, ready before, is not reported since", module), false
		case m.Pid != 0 && m.Pid != pid:
			return fmt.Sprintf("%s was restarted across the host's upgrade (pid %d, now %d)", module, pid, m.Pid), true
		case m.State != protocol.StateReady:
			return fmt.Sprintf("%s is %s since the host's upgrade", module, m.State), false
		}
	}
	return "", true
}

func orUnknown(v string) string {
	if v == "" {
		return "(unknown)"
	}
	return v
}

// wait waits, with one deadline for them all, until each step's host
// reports its declaration applied and is ready at its release (hostReady),
// or its apply failed there (the host refused the release, or came back on
// another version and said why).
func (k *hostRoll) wait(ctx context.Context, st *Stores, snap *inventory.Snapshot, v *UpgradeView, steps []int, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	waiting := slices.Clone(steps)
	why := map[int]string{}
	var errs []error
	for len(waiting) > 0 {
		byName, err := stepNodes(ctx, st, v, waiting)
		if err != nil {
			return err
		}
		var still []int
		for _, i := range waiting {
			s := &v.Steps[i]
			n := byName[s.Node]
			if o := n.LastOutcome; o != nil && !o.OK && o.Serial == s.Serial {
				s.Error = o.Error
				errs = append(errs, fmt.Errorf("%w at %s: declaration %d failed there: %s", ErrRollOutStopped, s.Node, s.Serial, s.Error))
				continue
			}
			if n.SerialApplied < s.Serial {
				why[i] = "not reported applied"
				still = append(still, i)
				continue
			}
			s.Applied = true
			states, err := st.Health.ModuleStates(ctx, s.Node)
			if err != nil {
				return err
			}
			w, done := k.hostReady(n, *s, states)
			switch {
			case done && w == "":
				s.Ready = true
			case done:
				s.Error = w
				errs = append(errs, fmt.Errorf("%w at %s: %s", ErrRollOutStopped, s.Node, w))
			default:
				why[i] = w
				still = append(still, i)
			}
		}
		waiting = still
		if len(waiting) == 0 {
			break
		}
		if time.Now().After(deadline) {
			var lines []string
			for _, i := range waiting {
				s := &v.Steps[i]
				s.Error = fmt.Sprintf("%s within %s", why[i], wait)
				if why[i] == "not reported applied" {
					s.Error = fmt.Sprintf("not back on mesh-host %s within %s: declaration %d not reported applied", s.To, wait, s.Serial)
				}
				lines = append(lines, s.Node+": "+s.Error)
			}
			errs = append(errs, fmt.Errorf("%w: %s", ErrRollOutStopped, strings.Join(lines, "; ")))
			break
		}
		if err := pause(ctx, followEvery); err != nil {
			return err
		}
	}
	return errors.Join(errs...)
}

// stepNodes reads the nodes of these steps of v (only those: this is read
// every followEvery), by name.
func stepNodes(ctx context.Context, st *Stores, v *UpgradeView, steps []int) (map[string]inventory.Node, error) {
	names := make([]string, len(steps))
	for j, i := range steps {
		names[j] = v.Steps[i].Node
	}
	nodes, err := st.Inventory.NodesNamed(ctx, names)
	if err != nil {
		return nil, err
	}
	byName := make(map[string]inventory.Node, len(nodes))
	for _, n := range nodes {
		byName[n.Name] = n
	}
	return byName, nil
}

// soaks: a host is watched through the soak, whatever it runs.
func (k *hostRoll) soaks(*inventory.Snapshot, inventory.RollOut) bool { return true }

// soak watches these ready hosts for d: a host that says it runs another
// version, falls silent (three of its beats), or whose modules are no
// longer ready with the pids they had, is no longer Ready.
func (k *hostRoll) soak(ctx context.Context, st *Stores, v *UpgradeView, steps []int, d time.Duration) error {
	until := time.Now().Add(d)
	left := slices.Clone(steps)
	for len(left) > 0 {
		byName, err := stepNodes(ctx, st, v, left)
		if err != nil {
			return err
		}
		var still []int
		for _, i := range left {
			s := &v.Steps[i]
			n := byName[s.Node]
			states, err := st.Health.ModuleStates(ctx, s.Node)
			if err != nil {
				return err
			}
			silent := n.LastHeard == nil || (n.HeartbeatIntervalS > 0 && k.c.Now().Sub(*n.LastHeard) > 3*time.Duration(n.HeartbeatIntervalS*float64(time.Second)))
			switch w, _ := k.hostReady(n, *s, states); {
			case silent:
				s.Ready, s.Error = false, fmt.Sprintf("ready, then silent within the %s soak", d)
			case w != "":
				s.Ready, s.Error = false, fmt.Sprintf("ready, then within the %s soak: %s", d, w)
			default:
				still = append(still, i)
			}
		}
		left = still
		if !time.Now().Before(until) {
			return nil
		}
		if err := pause(ctx, min(followEvery, time.Until(until))); err != nil {
			return err
		}
	}
	return nil
}

// details: a host back on its release has no more to say.
func (k *hostRoll) details(context.Context, *Stores, inventory.RollOut, []string) (map[string]string, error) {
	return map[string]string{}, nil
}
