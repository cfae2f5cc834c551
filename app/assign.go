package app

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"mesh-controller/app/plan"
	"mesh-controller/app/protocol"
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
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return Assigned{}, err
	}
	inv, sec := st.Inventory, st.Secrets
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
	bumps := []string{node}
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
				bumps = append(bumps, p.Node) // its plan's reasons name this consumer
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
	// The mesh as it will be, judged and planned in memory from this one
	// snapshot: seats taken, bindings chosen, declarations deliverable.
	after := snap.Clone()
	after.Assign(as...)
	// An unheld seat is taken by the first assignment that can fill it.
	seats := after.TakeUnheldSeats(as)
	// The backup seat's holders carry a line for every precious data set.
	ch := withBindings(after, inventory.Change{Assign: as, Seats: seats}, append(bumps, after.HolderNodes("backup")...)...)
	if err := refuse(what, undeliverable(after, ch.Bump)); err != nil {
		return Assigned{}, err
	}
	out.Pushed, err = c.commitAct(ctx, st, after, ch, "assign")
	return out, err
}

// undeliverable says which of these nodes' plans, on the mesh as it would
// be, could never reach their hosts: a declaration a host would refuse, or
// one heavier than the broker carries. An act is refused for them before
// anything is recorded (sealed secrets are not counted: they are made later,
// and MaxDeclarationBytes leaves room for them beneath the broker's limit).
func undeliverable(snap *inventory.Snapshot, nodes []string) []string {
	pl := plan.New(snap, nil)
	var problems []string
	for _, n := range nodes {
		p, err := pl.Plan(n)
		if err != nil {
			continue // a node named by a binding no longer in the mesh
		}
		d := p.Body
		d.Serial, d.IssuedAt = 1, time.Now()
		for _, pr := range d.Problems() {
			problems = append(problems, fmt.Sprintf("%s's declaration would be refused by its host: %s; assign fewer modules, or change their manifests", n, pr))
		}
		if b, err := d.Encode(); err != nil {
			problems = append(problems, fmt.Sprintf("%s's declaration cannot be encoded: %v", n, err))
		} else if len(b) > protocol.MaxDeclarationBytes {
			problems = append(problems, fmt.Sprintf("%s's declaration would be %d bytes, over the %d a declaration may be: it could never be delivered; assign fewer modules, or trim their manifests or settings", n, len(b), protocol.MaxDeclarationBytes))
		}
	}
	return problems
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
	st, snap, err := c.storesAndSnapshot(ctx)
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
	why := "unassigned from " + node + " on " + c.Now().UTC().Format("2006-01-02")
	ch := inventory.Change{}
	for _, m := range modules {
		a := here[m]
		ch.Unassign = append(ch.Unassign, inventory.Holder{Node: node, Module: m})
		for _, d := range snap.Manifests[m][a.Version].Data {
			state := "retired"
			if d.Precious == inventory.Rebuildable {
				state = "dropped"
			}
			out.Retirements = append(out.Retirements, inventory.Retirement{Node: node, Module: m, DataSet: d.Name, Path: d.Path,
				Precious: d.Precious, State: state, RetiredAt: c.Now(), Why: why})
		}
	}
	ch.Retirements = out.Retirements
	// The mesh as it will be: their consumers' providers keep what they kept
	// for them, and those consumers now wait for a person to retire them.
	after := snap.Clone()
	after.Unassign(ch.Unassign...)
	ch = withBindings(after, ch, append([]string{node}, after.HolderNodes("backup")...)...)
	for _, cs := range after.Seats.Consumers {
		if cs.State == "waiting" && consumerOf(cs.Consumer, node, modules) {
			out.Waiting = append(out.Waiting, cs)
		}
	}
	out.Pushed, err = c.commitAct(ctx, st, after, ch, "unassign")
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
