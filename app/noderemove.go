package app

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"mesh-controller/contexts/health"
	"mesh-controller/contexts/inventory"
	"mesh-controller/embedded/sqlite"
)

// NodeRemoveRequest asks for nodes to be decommissioned.
type NodeRemoveRequest struct {
	Names []string
	// AndUnassign takes off them whatever runs there first, as unassign
	// does (precious data retired and remembered); without it a node that
	// runs modules or holds a seat is refused.
	AndUnassign bool
	// Why, if given, is recorded in the hand-act log.
	Why string
}

// RemovedNode is one node removed, and what it left behind.
type RemovedNode struct {
	Name string `json:"name"`
	// Unassigned is what --and-unassign took off it; nil if nothing ran there.
	Unassigned *Unassigned `json:"unassigned"`
	// SeatsEmptied are the seats it held that now have no holder.
	SeatsEmptied []string `json:"seats_emptied"`
	// Kept is what it left on its disk: retired and dropped data, and what
	// its providers kept for consumers, listed by data and cleanup until a
	// person cleans it up.
	Kept []Cleanable `json:"kept"`
}

// NodesRemoved is what node remove did.
type NodesRemoved struct {
	Nodes []RemovedNode `json:"nodes"`
	// RemovedAt is when: the removal every kept record is listed under.
	RemovedAt time.Time `json:"removed_at"`
	// Revoked counts their broker users revoked (hosts' and modules').
	Revoked int `json:"revoked_users"`
	// Disconnected says the serving controller was told to close the
	// revoked users' connections; otherwise serve does when it starts.
	Disconnected bool `json:"disconnected"`
	// Cancelled are deletions asked of their hosts that none will carry out
	// now; what they named stays listed by cleanup.
	Cancelled []string `json:"cancelled_deletions"`
	// Cleared counts their open conditions, now cleared.
	Cleared int `json:"conditions_cleared"`
}

// maxListed bounds how many problems a refusal of thousands of nodes lists.
const maxListed = 20

// NodeRemove decommissions nodes, all or none: refused while a node runs
// modules or holds a seat (listing them) unless AndUnassign, which first
// unassigns them as unassign does; refused for a name not known. Their
// broker users are revoked and the serving controller told to close their
// connections; their records, facts, tokens and host keys go, their open
// conditions are cleared. What they keep on their disks stays listed, as
// retired (or dropped) on a removed node, until a person cleans it up.
// Each store is changed in one transaction, the inventory first (the act's
// commit point, judged on the snapshot it read: another act committed in
// between has it judged again), then the identity store and health. A
// removal killed after the inventory leaves the node's broker users alive
// until node remove is run again (a name the identity store alone still
// knows is finished there) or serve's catch-up forgets them (finishActs).
func (c *Nodes) NodeRemove(ctx context.Context, r NodeRemoveRequest) (NodesRemoved, error) {
	return retryAct(ctx, func() (NodesRemoved, error) { return c.nodeRemove(ctx, r) })
}

func (c uses) nodeRemove(ctx context.Context, r NodeRemoveRequest) (NodesRemoved, error) {
	if len(r.Names) == 0 {
		return NodesRemoved{}, fmt.Errorf("node remove %w", ErrNoNodes)
	}
	if len(r.Names) > MaxNodesAtOnce {
		return NodesRemoved{}, fmt.Errorf("node remove %w", ErrTooManyNodes)
	}
	if err := CheckNames(r.Names...); err != nil {
		return NodesRemoved{}, err
	}
	st, err := c.stores(ctx)
	if err != nil {
		return NodesRemoved{}, err
	}
	snap, err := st.Inventory.Snapshot(ctx)
	if err != nil {
		return NodesRemoved{}, err
	}
	what := "node remove " + nameList(r.Names)
	removing := make(map[string]bool, len(r.Names))
	var problems, inInventory []string
	var known map[string]bool // by the identity store: a removal to finish
	for _, n := range r.Names {
		if removing[n] {
			problems = append(problems, fmt.Sprintf("%s %v: name each node once", n, ErrNamedTwice))
		}
		removing[n] = true
		if _, ok := snap.Nodes[n]; ok {
			inInventory = append(inInventory, n)
			continue
		}
		if known == nil {
			names, err := st.Identity.KnownNodes(ctx)
			if err != nil {
				return NodesRemoved{}, err
			}
			known = map[string]bool{}
			for _, k := range names {
				known[k] = true
			}
		}
		if !known[n] {
			problems = append(problems, fmt.Sprintf("node %s %v: see 'mesh-controller node list'", n, inventory.ErrNodeNotFound))
		}
	}
	running := map[string][]string{} // node -> modules
	for _, a := range snap.Assignments {
		if removing[a.Node] {
			running[a.Node] = append(running[a.Node], a.Module)
		}
	}
	type heldSeat struct {
		seat string
		by   inventory.Holder
	}
	held := map[string][]heldSeat{} // by node
	for _, seat := range slices.Sorted(maps.Keys(snap.Seats.Holders)) {
		for _, h := range snap.Seats.Holders[seat] {
			if removing[h.Node] {
				held[h.Node] = append(held[h.Node], heldSeat{seat, h})
			}
		}
	}
	var order []string
	if !r.AndUnassign {
		for _, n := range slices.Sorted(maps.Keys(running)) {
			problems = append(problems, fmt.Sprintf("%s runs %s: unassign them first, or add --and-unassign (precious data is retired as unassign does)", n, strings.Join(running[n], ", ")))
		}
		for _, n := range slices.Sorted(maps.Keys(held)) {
			seats := make([]string, 0, len(held[n]))
			for _, hs := range held[n] {
				seats = append(seats, fmt.Sprintf("%s (%s)", hs.seat, hs.by))
			}
			problems = append(problems, fmt.Sprintf("%s holds seat %s: hand it over first ('mesh-controller seat NAME --to NODE/MODULE'), or add --and-unassign", n, strings.Join(seats, ", ")))
		}
	} else {
		var ps []string
		order, ps = unassignOrder(snap, running, removing)
		problems = append(problems, ps...)
	}
	if err := refuse(what, capProblems(problems)); err != nil {
		return NodesRemoved{}, err
	}

	now := c.Now().UTC().Truncate(time.Millisecond)
	out := NodesRemoved{RemovedAt: now, Cancelled: []string{}}
	byName := map[string]*RemovedNode{}
	for _, n := range r.Names {
		out.Nodes = append(out.Nodes, RemovedNode{Name: n, SeatsEmptied: []string{}, Kept: []Cleanable{}})
	}
	for i := range out.Nodes {
		byName[out.Nodes[i].Name] = &out.Nodes[i]
	}
	for _, n := range order {
		u, err := (&Modules{c}).Unassign(ctx, n, running[n])
		if err != nil {
			return out, fmt.Errorf("unassign what runs on %s (no node is removed yet; run node remove again): %w", n, err)
		}
		byName[n].Unassigned = &u
	}
	if len(order) > 0 {
		// What was unassigned left seats and consumers the snapshot still shows.
		if snap, err = st.Inventory.Snapshot(ctx); err != nil {
			return out, err
		}
	}
	for _, n := range slices.Sorted(maps.Keys(held)) {
		for _, hs := range held[n] {
			if len(snap.Seats.Holders[hs.seat]) == 0 && !slices.Contains(byName[n].SeatsEmptied, hs.seat) {
				byName[n].SeatsEmptied = append(byName[n].SeatsEmptied, hs.seat)
			}
		}
	}

	removal := inventory.Removal{}
	if len(inInventory) > 0 {
		if removal, err = st.Inventory.RemoveNodes(ctx, inInventory, consumerDataOn(snap, removing, now), snap.Revision, now); err != nil {
			return out, err
		}
	}
	fault("node-remove:after-inventory")
	forgotten, err := st.Identity.ForgetNodes(ctx, r.Names, now)
	if err != nil {
		return out, fmt.Errorf("%w (the nodes are out of the inventory; their broker users are not revoked yet: run node remove again)", err)
	}
	out.Revoked = forgotten.Revoked
	for _, d := range removal.Cancelled {
		out.Cancelled = append(out.Cancelled, fmt.Sprintf("%s/%s %s (%s)", d.Node, d.Module, d.Target, d.Kind))
	}
	var acts []health.HandAct
	if r.Why != "" {
		act := what
		if len(order) > 0 {
			act += " (and unassigned what ran on " + nameList(order) + ")"
		}
		acts = append(acts, health.HandAct{At: now, What: act, Why: r.Why, Cause: "node", Who: who()})
	}
	f, err := st.Health.ForgetMachines(ctx, r.Names, "its node was removed", acts, now)
	if err != nil {
		return out, err
	}
	out.Cleared = len(f.Cleared)
	if out.Revoked > 0 {
		out.Disconnected = c.announceRevoked(ctx, st)
	}
	// A removed node's rows are judged from the retirement alone and the
	// manifests, which removal leaves as they were: the snapshot already
	// read serves, with no data reports (theirs went with them).
	rs, err := st.Inventory.Retirements(ctx, "")
	if err != nil {
		return out, err
	}
	stamp := sqlite.FormatTime(now)
	for _, cl := range cleanables(snap, rs, nil, c.Now()) {
		if cl.OnRemovedNode() && sqlite.FormatTime(*cl.NodeRemovedAt) == stamp && byName[cl.Node] != nil {
			byName[cl.Node].Kept = append(byName[cl.Node].Kept, cl)
		}
	}
	return out, nil
}

// unassignOrder orders the nodes to unassign so that no unassign leaves a
// consumer assigned without its last provider (consumers first), and says
// why none can: a consumer that stays loses its last provider, or nodes
// being removed provide to each other.
func unassignOrder(snap *inventory.Snapshot, running map[string][]string, removing map[string]bool) ([]string, []string) {
	var problems []string
	manifest := func(a inventory.Assignment) inventory.Manifest { return snap.Manifests[a.Module][a.Version] }
	for _, a := range snap.Assignments {
		if removing[a.Node] {
			continue
		}
		for _, need := range manifest(a).Needs {
			if need.Optional {
				continue
			}
			var stays, goes []string
			for _, p := range snap.Assignments {
				if inventory.Provides(manifest(p), need.Provision) {
					if removing[p.Node] {
						goes = append(goes, p.Node+"/"+p.Module)
					} else {
						stays = append(stays, p.Node+"/"+p.Module)
					}
				}
			}
			if len(stays) == 0 && len(goes) > 0 {
				problems = append(problems, fmt.Sprintf("%s/%s needs %s, which only %s provides: unassign %s first, or assign another provider",
					a.Node, a.Module, need.Provision, strings.Join(goes, ", "), a.Module))
			}
		}
	}
	if len(problems) > 0 {
		return nil, problems
	}
	// As each Unassign will judge it: a node may go once no assignment still
	// left needs what only it provides.
	left := map[string]bool{}
	for n := range running {
		left[n] = true
	}
	gone := map[string]bool{}
	blocks := func(n string) bool {
		for _, a := range snap.Assignments {
			if a.Node != n {
				continue
			}
			for _, prov := range manifest(a).Provides {
				other, needed := false, false
				for _, b := range snap.Assignments {
					if b.Node == n || gone[b.Node] {
						continue
					}
					other = other || inventory.Provides(manifest(b), prov.Provision)
					for _, need := range manifest(b).Needs {
						needed = needed || (need.Provision == prov.Provision && !need.Optional)
					}
				}
				if needed && !other {
					return true
				}
			}
		}
		return false
	}
	var order []string
	for len(left) > 0 {
		progress := false
		for _, n := range slices.Sorted(maps.Keys(left)) {
			if !blocks(n) {
				order = append(order, n)
				gone[n] = true
				delete(left, n)
				progress = true
			}
		}
		if !progress {
			return nil, []string{fmt.Sprintf("%s provide to each other: unassign one side first with 'mesh-controller unassign'", strings.Join(slices.Sorted(maps.Keys(left)), ", "))}
		}
	}
	return order, nil
}

// consumerDataOn is what providers on removed nodes kept for their
// consumers, to be remembered as retired on the removed node: data kept
// for a consumer is still on that disk whatever its state was (access is
// off, since the node is gone). A provider that keeps no data per consumer
// leaves nothing to remember.
func consumerDataOn(snap *inventory.Snapshot, removing map[string]bool, now time.Time) []inventory.Retirement {
	var out []inventory.Retirement
	for _, cs := range snap.Seats.Consumers {
		if !removing[cs.Provider.Node] || cs.State == "deleted" {
			continue
		}
		precious := perConsumerPrecious(snap, cs.Provider, cs.Provision)
		if precious == "" {
			continue
		}
		r := inventory.Retirement{Node: cs.Provider.Node, Module: cs.Provider.Module, DataSet: cs.Provision, Precious: precious,
			Consumer: cs.Consumer, State: "retired", RetiredAt: cs.Since, Why: cs.Why}
		if cs.State != "retired" {
			r.RetiredAt, r.Why = now, fmt.Sprintf("%s (%s) when its provider's node was removed", cs.Why, cs.State)
		}
		if precious == inventory.Rebuildable {
			r.State = "dropped"
		}
		out = append(out, r)
	}
	return out
}

// capProblems keeps a refusal of thousands of names readable.
func capProblems(ps []string) []string {
	if len(ps) <= maxListed {
		return ps
	}
	return append(ps[:maxListed:maxListed], fmt.Sprintf("and %d more", len(ps)-maxListed))
}

// nameList names nodes for a person: all of a few, the first of many.
func nameList(names []string) string {
	if len(names) <= 10 {
		return strings.Join(names, ", ")
	}
	sorted := slices.Clone(names)
	sort.Strings(sorted)
	return fmt.Sprintf("%s … %s (%d nodes)", strings.Join(sorted[:3], ", "), sorted[len(sorted)-1], len(names))
}

// announceRevoked tells the serving controller that broker users were
// revoked: the broker disconnects a revoked user only when told, by the
// account JWT the serving controller then gives it. It says whether the
// word was delivered (otherwise serve does it when it starts).
func (c uses) announceRevoked(ctx context.Context, st *Stores) bool {
	nc, err := c.dialBroker(ctx, st.Identity)
	if err != nil {
		return false
	}
	defer nc.Close()
	return nc.Publish(RevokedSubject, []byte("{}")) == nil && nc.FlushTimeout(3*time.Second) == nil
}
