package app

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"mesh-controller/contexts/inventory"
	"mesh-controller/contexts/secrets"
)

// AssignedModule is one module put on a node.
type AssignedModule struct {
	Module     string   `json:"module"`
	Version    string   `json:"version"`
	Unverified []string `json:"unverified"`
	// Unmet are optional needs nothing in the mesh provides.
	Unmet []string `json:"unmet_optional"`
}

// Assigned is what assign did.
type Assigned struct {
	Node    string           `json:"node"`
	Modules []AssignedModule `json:"modules"`
	Pushed  []Pushed         `json:"pushed"`
}

// Assign puts modules on a node, judged together: all or nothing, and every
// problem listed. Then the affected nodes are sent their declarations.
func (c *Controller) Assign(ctx context.Context, node string, modules []string) (Assigned, error) {
	what := "assign " + node + " " + strings.Join(modules, " ")
	var problems []string
	if err := CheckNames(append([]string{node}, modules...)...); err != nil {
		return Assigned{}, err
	}
	st, err := c.stores(ctx)
	if err != nil {
		return Assigned{}, err
	}
	inv, ids, sec := st.Inventory, st.Identity, st.Secrets
	snap, err := inv.Snapshot(ctx)
	if err != nil {
		return Assigned{}, err
	}
	if _, ok := snap.Nodes[node]; !ok {
		return Assigned{}, fmt.Errorf("node %s %w", node, inventory.ErrNodeNotFound)
	}
	factList, _, err := inv.Facts(ctx, node)
	if err != nil {
		return Assigned{}, err
	}
	facts := map[string]inventory.Fact{}
	for _, f := range factList {
		facts[f.Name] = f
	}
	here := map[string]inventory.Manifest{} // what the node will run
	for _, a := range snap.AssignmentsOf(node) {
		here[a.Module] = snap.Manifests[a.Module][a.Version]
	}
	var adding []inventory.Manifest
	seen := map[string]bool{}
	for _, name := range modules {
		switch {
		case seen[name]:
			problems = append(problems, name+" is named twice")
			continue
		case snap.Current[name] == "":
			problems = append(problems, fmt.Sprintf("module %s is not registered: add it with 'mesh-controller module add'", name))
			continue
		}
		seen[name] = true
		if _, ok := here[name]; ok {
			problems = append(problems, fmt.Sprintf("%s is already on %s", name, node))
			continue
		}
		adding = append(adding, snap.Manifests[name][snap.Current[name]])
	}
	out := Assigned{Node: node}
	bumps := map[string]bool{node: true}
	for _, m := range adding {
		am := AssignedModule{Module: m.Module, Version: m.Version, Unverified: []string{}, Unmet: []string{}}
		ps, unverified := inventory.JudgeRequirements(m, node, facts)
		problems = append(problems, ps...)
		am.Unverified = append(am.Unverified, unverified...)
		for _, need := range m.Needs {
			inCommand := false
			for _, other := range adding {
				inCommand = inCommand || inventory.Provides(other, need.Provision)
			}
			providers := snap.ProvidersOf(need.Provision)
			for _, p := range providers {
				bumps[p.Node] = true // its plan's reasons name this consumer
			}
			if len(providers) == 0 && !inCommand {
				if need.Optional {
					am.Unmet = append(am.Unmet, need.Provision)
				} else {
					problems = append(problems, fmt.Sprintf("%s needs %s: nothing in the mesh provides it; assign a provider first or in the same command", m.Module, need.Provision))
				}
			}
		}
		out.Modules = append(out.Modules, am)
	}
	// Ports: two modules on one node may not claim the same port.
	problems = append(problems, inventory.PortClashes(node, here, adding)...)
	if _, err := sec.OperatorKey(ctx); errors.Is(err, secrets.ErrNoOperatorKey) {
		problems = append(problems, secretsNeedKey(adding)...)
	} else if err != nil {
		return Assigned{}, err
	}
	if err := refuse(what, problems); err != nil {
		return Assigned{}, err
	}
	var as []inventory.Assignment
	for _, am := range out.Modules {
		as = append(as, inventory.Assignment{Node: node, Module: am.Module, Version: am.Version, AssignedAt: c.Now(), Unverified: am.Unverified})
	}
	if err := inv.Assign(ctx, as, sortedKeys(bumps)); err != nil {
		return Assigned{}, err
	}
	// An unheld seat is taken by the first assignment that can fill it.
	if snap, err = inv.Snapshot(ctx); err != nil {
		return out, err
	}
	var seats []inventory.SeatChange
	for _, m := range adding {
		for _, seat := range m.Seats {
			name := snap.Seats.SeatName(seat.Seat)
			if len(snap.Seats.Holders[name]) == 0 {
				seats = append(seats, inventory.SeatChange{Seat: name, Add: []inventory.Holder{{Node: node, Module: m.Module}}})
				snap.Seats.Holders[name] = []inventory.Holder{{Node: node, Module: m.Module}}
			}
		}
	}
	if len(seats) > 0 {
		if err := inv.ChangeSeats(ctx, seats, nil, nil, c.Now()); err != nil {
			return out, err
		}
	}
	moved, err := c.syncBindings(ctx, inv, ids, sec)
	if err != nil {
		return out, err
	}
	for _, n := range append(moved, backupHolderNodes(snap)...) {
		bumps[n] = true
	}
	// Secrets the mesh makes are made now (or when the node joins), sealed,
	// and their plaintext dropped.
	if snap, err = inv.Snapshot(ctx); err != nil {
		return out, err
	}
	if _, err := makeMeshSecrets(ctx, snap, ids, sec, node, c.Now()); err != nil {
		return out, err
	}
	out.Pushed, err = c.sendPlans(ctx, inv, ids, sec, sortedKeys(bumps))
	return out, err
}

// Unassigned is what unassign did.
type Unassigned struct {
	Node        string                 `json:"node"`
	Modules     []string               `json:"modules"`
	Retirements []inventory.Retirement `json:"retirements"`
	// Waiting are the consumers whose providers now wait for a person to retire them.
	Waiting []inventory.Consumer `json:"waiting"`
	Pushed  []Pushed             `json:"pushed"`
}

// Unassign takes modules off a node. Their precious data is retired and
// remembered (kept on the node, access off, deleted only by a person);
// rebuildable data is dropped, and that is said; per-consumer data kept for
// them by providers is retired on the provider.
func (c *Controller) Unassign(ctx context.Context, node string, modules []string) (Unassigned, error) {
	what := "unassign " + node + " " + strings.Join(modules, " ")
	if err := CheckNames(append([]string{node}, modules...)...); err != nil {
		return Unassigned{}, err
	}
	st, err := c.stores(ctx)
	if err != nil {
		return Unassigned{}, err
	}
	inv, ids, sec := st.Inventory, st.Identity, st.Secrets
	snap, err := inv.Snapshot(ctx)
	if err != nil {
		return Unassigned{}, err
	}
	if _, ok := snap.Nodes[node]; !ok {
		return Unassigned{}, fmt.Errorf("node %s %w", node, inventory.ErrNodeNotFound)
	}
	here := map[string]inventory.Assignment{}
	for _, a := range snap.AssignmentsOf(node) {
		here[a.Module] = a
	}
	leaving := map[string]bool{}
	var problems []string
	for _, m := range modules {
		if _, ok := here[m]; !ok {
			problems = append(problems, fmt.Sprintf("%s is not on %s", m, node))
		}
		leaving[m] = true
	}
	// A provider may not leave a consumer that still needs it with no other provider.
	problems = append(problems, snap.LastProvider(node, modules)...)
	if err := refuse(what, problems); err != nil {
		return Unassigned{}, err
	}
	out := Unassigned{Node: node, Modules: modules, Retirements: []inventory.Retirement{}}
	bumps := map[string]bool{node: true}
	why := "unassigned from " + node + " on " + c.Now().UTC().Format("2006-01-02")
	for _, m := range modules {
		a := here[m]
		man := snap.Manifests[m][a.Version]
		for _, d := range man.Data {
			state := "retired"
			if d.Precious == inventory.Rebuildable {
				state = "dropped"
			}
			out.Retirements = append(out.Retirements, inventory.Retirement{Node: node, Module: m, DataSet: d.Name, Path: d.Path,
				Precious: d.Precious, State: state, RetiredAt: c.Now(), Why: why})
		}
	}
	if err := inv.Unassign(ctx, node, modules, out.Retirements, sortedKeys(bumps)); err != nil {
		return Unassigned{}, err
	}
	// Their consumers' providers keep what they kept for them: those
	// consumers now wait for a person to retire them.
	moved, err := c.syncBindings(ctx, inv, ids, sec)
	if err != nil {
		return out, err
	}
	after, err := inv.Snapshot(ctx)
	if err != nil {
		return out, err
	}
	for _, cs := range after.Seats.Consumers {
		if cs.State == "waiting" && consumerOf(cs.Consumer, node, modules) {
			out.Waiting = append(out.Waiting, cs)
		}
	}
	for _, n := range append(moved, backupHolderNodes(after)...) {
		bumps[n] = true
	}
	out.Pushed, err = c.sendPlans(ctx, inv, ids, sec, sortedKeys(bumps))
	return out, err
}

func consumerOf(consumer, node string, modules []string) bool {
	for _, m := range modules {
		if consumer == node+"/"+m {
			return true
		}
	}
	return false
}

// backupHolderNodes are the nodes holding the backup seat: their backup
// lines follow every precious data set in the mesh.
func backupHolderNodes(snap *inventory.Snapshot) []string {
	var out []string
	for _, h := range snap.Seats.Holders[snap.Seats.SeatName("backup")] {
		out = append(out, h.Node)
	}
	return out
}
