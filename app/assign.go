package app

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"mesh-controller/app/plan"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/health"
	"mesh-controller/contexts/inventory"
	"mesh-controller/contexts/licences"
	"mesh-controller/contexts/secrets"
)

// AssignedModule is one module put on a node.
type AssignedModule struct {
	Module     string   `json:"module"`
	Version    string   `json:"version"`
	Unverified []string `json:"unverified"`
	// Unmet are optional needs nothing in the mesh provides.
	Unmet []string `json:"unmet_optional"`
	// LicencesNotHeld are the licences its manifest needs: a module just
	// assigned holds none, and waits for each until 'licence use'.
	LicencesNotHeld []string `json:"licences_not_held,omitempty"`
}

// Assigned is what assign did.
type Assigned struct {
	Node    string           `json:"node"`
	Modules []AssignedModule `json:"modules"`
	Pushed  []Pushed         `json:"pushed"`
}

// Assign puts modules on a node, judged together: all or nothing, and every
// problem listed. Then the affected nodes are sent their declarations.
func (c *Modules) Assign(ctx context.Context, node string, modules []string) (Assigned, error) {
	r, err := c.AssignMany(ctx, ManyRequest{Nodes: []string{node}, Modules: modules})
	if len(r.Nodes) == 0 {
		return Assigned{}, err
	}
	out := r.Nodes[0]
	out.Pushed = r.Pushed
	return out, err
}

// ManyRequest names the nodes and modules of an act on many nodes at once.
type ManyRequest struct {
	Nodes, Modules []string
	// Progress, if set, is told how far the act is: a stage ("judged",
	// "declared") and how many of how many nodes.
	Progress func(stage string, done, total int)
	// Actor, if set, is who asked from elsewhere than this machine's shell
	// (the HTTP API's caller): the act is then kept as a hand act with that
	// who, since who() would name only the user the server runs as.
	Actor string
	// Taken, if set, records the assignments as taken (take: one node, one
	// module), the cutover their declaration carries.
	Taken *inventory.Take
}

// recordActor keeps an act asked by an Actor as a hand act once it has
// committed; an act without one is recorded as it always was (not at all).
func (c uses) recordActor(ctx context.Context, st *Stores, r ManyRequest, what string) error {
	if r.Actor == "" {
		return nil
	}
	_, err := st.Health.RecordHandAct(ctx, health.HandAct{At: c.Now(), What: what, Why: "asked through the HTTP API", Cause: "api", Who: r.Actor})
	return err
}

// AssignedMany is what assign --nodes did: each node's modules, and every
// declaration sent.
type AssignedMany struct {
	Nodes  []Assigned `json:"nodes"`
	Pushed []Pushed   `json:"pushed"`
}

// AssignMany puts the same modules on every node named, judged together
// exactly as Assign judges one node: all or nothing, every problem listed
// (each naming its node), then one write to each store and one declaration
// to each node affected.
func (c *Modules) AssignMany(ctx context.Context, r ManyRequest) (AssignedMany, error) {
	return retryAct(ctx, func() (AssignedMany, error) { return c.assignMany(ctx, r) })
}

func (c uses) assignMany(ctx context.Context, r ManyRequest) (AssignedMany, error) {
	ms, err := c.startMany(ctx, "assign", "to", r)
	if err != nil {
		return AssignedMany{}, err
	}
	what, st, snap, problems, onNode, progress := ms.what, ms.st, ms.snap, ms.problems, ms.onNode, ms.progress
	inv, sec := st.Inventory, st.Secrets
	// What every node is given: the modules named, each registered, once.
	var adding []inventory.Manifest
	seen := map[string]bool{}
	for _, name := range r.Modules {
		switch {
		case seen[name]:
			problems = append(problems, name+" is named twice")
			continue
		case snap.Current[name] == "":
			problems = append(problems, fmt.Sprintf("module %s is not registered: add it with 'mesh-controller module add'", name))
			ms.unknown = append(ms.unknown, name)
			continue
		}
		seen[name] = true
		adding = append(adding, snap.Manifests[name][snap.Current[name]])
	}
	if _, err := sec.OperatorKey(ctx); errors.Is(err, secrets.ErrNoOperatorKey) {
		problems = append(problems, secretsNeedKey(adding)...)
	} else if err != nil {
		return AssignedMany{}, err
	}
	facts, err := inv.FactsOf(ctx, r.Nodes)
	if err != nil {
		return AssignedMany{}, err
	}
	out := AssignedMany{Nodes: []Assigned{}}
	var as []inventory.Assignment
	var bumps []string
	now := c.Now()
	for i, node := range r.Nodes {
		if _, ok := snap.Nodes[node]; !ok {
			continue
		}
		one, ps := judgeAssign(snap, node, facts[node], onNode[node], adding)
		problems = append(problems, ps...)
		out.Nodes = append(out.Nodes, one.Assigned)
		bumps = append(bumps, one.bumps...)
		for _, am := range one.Modules {
			as = append(as, inventory.Assignment{Node: node, Module: am.Module, Version: am.Version, AssignedAt: now, Unverified: am.Unverified, Taken: r.Taken})
		}
		progress("judged", i+1, len(r.Nodes))
	}
	if err := ms.refuse(problems); err != nil {
		return AssignedMany{}, err
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
		return AssignedMany{}, err
	}
	if out.Pushed, err = c.commitActProgress(ctx, st, after, ch, "assign", progress); err != nil {
		return out, err
	}
	return out, c.recordActor(ctx, st, r, what)
}

// manyStart is what an act on many nodes begins with: what it is called in
// a refusal, the stores and the mesh as read once, the problems with the
// nodes named (twice, not known), each node's assignments, and progress.
type manyStart struct {
	what     string
	st       *Stores
	snap     *inventory.Snapshot
	problems []string
	// unknown are the names given that name nothing (ProblemsError.Unknown).
	unknown  []string
	onNode   map[string][]inventory.Assignment
	progress func(stage string, done, total int)
}

// refuse refuses the act when problems were found, every one listed once,
// with the names given that name nothing.
func (ms manyStart) refuse(problems []string) error {
	err := refuse(ms.what, sameOnce(problems))
	if pe, ok := err.(*ProblemsError); ok {
		pe.Unknown = ms.unknown
	}
	return err
}

// startMany begins verb (assign, unassign) on the nodes of r. One node not
// known is an error, as for one node's act; several are a problem listed
// with the others.
func (c uses) startMany(ctx context.Context, verb, prep string, r ManyRequest) (manyStart, error) {
	ms := manyStart{what: verb + " " + strings.Join(r.Modules, " ") + " " + prep + " " + nodesSaid(r.Nodes), progress: r.Progress}
	if len(r.Nodes) == 1 {
		ms.what = verb + " " + r.Nodes[0] + " " + strings.Join(r.Modules, " ")
	}
	if ms.progress == nil {
		ms.progress = func(string, int, int) {}
	}
	if err := CheckNames(append(slices.Clone(r.Nodes), r.Modules...)...); err != nil {
		return ms, err
	}
	var err error
	if ms.st, ms.snap, err = c.storesAndSnapshot(ctx); err != nil {
		return ms, err
	}
	if dup := namedTwice(r.Nodes); len(dup) > 0 {
		ms.problems = append(ms.problems, "named twice: "+strings.Join(dup, ", "))
	}
	var missing []string
	for _, node := range r.Nodes {
		if _, ok := ms.snap.Nodes[node]; !ok {
			missing = append(missing, node)
		}
	}
	if len(missing) > 0 {
		if len(r.Nodes) == 1 {
			return ms, fmt.Errorf("node %s %w", missing[0], inventory.ErrNodeNotFound)
		}
		ms.problems = append(ms.problems, fmt.Sprintf("%s not known: add %s with 'mesh-controller node add'", Plural(len(missing), "node"), nameList(missing)))
		ms.unknown = append(ms.unknown, missing...)
	}
	ms.onNode = map[string][]inventory.Assignment{} // one pass, not one a node
	for _, a := range ms.snap.Assignments {
		ms.onNode[a.Node] = append(ms.onNode[a.Node], a)
	}
	return ms, nil
}

// judgedAssign is one node's part of an assign: what it is given, and the
// nodes whose plans name it.
type judgedAssign struct {
	Assigned
	bumps []string
}

// judgeAssign judges the modules adding on one node of snap: what its
// host reported (its facts: requirements), what it runs already (onNode:
// twice, ports), what the modules need. Each problem names the node.
func judgeAssign(snap *inventory.Snapshot, node string, factList []inventory.Fact, onNode []inventory.Assignment, adding []inventory.Manifest) (judgedAssign, []string) {
	var problems []string
	facts := map[string]inventory.Fact{}
	for _, f := range factList {
		facts[f.Name] = f
	}
	here := map[string]inventory.Manifest{} // what the node will run
	for _, a := range onNode {
		here[a.Module] = snap.Manifests[a.Module][a.Version]
	}
	out := judgedAssign{Assigned: Assigned{Node: node, Modules: []AssignedModule{}}, bumps: []string{node}}
	var given []inventory.Manifest
	for _, m := range adding {
		if _, ok := here[m.Module]; ok {
			problems = append(problems, fmt.Sprintf("%s is already on %s", m.Module, node))
			continue
		}
		given = append(given, m)
	}
	for _, m := range given {
		am := AssignedModule{Module: m.Module, Version: m.Version, Unverified: []string{}, Unmet: []string{}}
		for _, l := range m.Licences {
			am.LicencesNotHeld = append(am.LicencesNotHeld, l.Name)
		}
		ps, unverified := inventory.JudgeRequirements(m, node, facts)
		problems = append(problems, ps...)
		am.Unverified = append(am.Unverified, unverified...)
		for _, need := range m.Needs {
			inCommand := false
			for _, other := range given {
				inCommand = inCommand || inventory.Provides(other, need.Provision)
			}
			providers := snap.ProvidersOf(need.Provision)
			for _, p := range providers {
				out.bumps = append(out.bumps, p.Node) // its plan's reasons name this consumer
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
	problems = append(problems, inventory.PortClashes(node, here, given)...)
	// Data: two modules on one node may not keep one place.
	problems = append(problems, inventory.DataPathClashes(node, here, given)...)
	return out, problems
}

// namedTwice are the names given more than once, each once, in order.
func namedTwice(names []string) []string {
	seen, twice := map[string]int{}, []string{}
	for _, n := range names {
		seen[n]++
		if seen[n] == 2 {
			twice = append(twice, n)
		}
	}
	return twice
}

// nodesSaid names the nodes of an act: all of a few, or how many.
func nodesSaid(nodes []string) string {
	if len(nodes) <= 5 {
		return strings.Join(nodes, " ")
	}
	return Plural(len(nodes), "node")
}

// undeliverable says which of these nodes' plans, on the mesh as it would
// be, could never reach their hosts: a declaration a host would refuse, or
// one heavier than the broker carries. An act is refused for them before
// anything is recorded (sealed secrets are not counted: they are made later,
// and MaxDeclarationBytes leaves room for them beneath the broker's limit).
func undeliverable(snap *inventory.Snapshot, nodes []string) []string {
	// A filter is weighed as rendered with the default SSH port: the
	// port's digits change nothing that matters here.
	pl := plan.New(snap, nil).WithFilter(filterRender(nil))
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
	// Licences are the licences its modules held, taken away from them.
	Licences []string `json:"licences,omitempty"`
	// Empty says, of each consumer moved off a provider taken off this
	// node, that its new provider starts without what the old one kept.
	Empty  []string `json:"empty,omitempty"`
	Pushed []Pushed `json:"pushed"`
}

// Unassign takes modules off a node. Their precious data is retired and
// remembered (kept on the node, access off, deleted only by a person);
// rebuildable data is dropped, and that is said; per-consumer data kept for
// them by providers is retired on the provider.
func (c *Modules) Unassign(ctx context.Context, node string, modules []string) (Unassigned, error) {
	r, err := c.UnassignMany(ctx, ManyRequest{Nodes: []string{node}, Modules: modules})
	if len(r.Nodes) == 0 {
		return Unassigned{}, err
	}
	out := r.Nodes[0]
	out.Pushed = r.Pushed
	return out, err
}

// UnassignedMany is what unassign --nodes did: each node's part, and every
// declaration sent.
type UnassignedMany struct {
	Nodes  []Unassigned `json:"nodes"`
	Pushed []Pushed     `json:"pushed"`
}

// UnassignMany takes the same modules off every node named, judged together
// exactly as Unassign judges one node (all or nothing, every problem
// listed; a provision whose every provider leaves is judged as one), then
// one write to each store and one declaration to each node affected.
func (c *Modules) UnassignMany(ctx context.Context, r ManyRequest) (UnassignedMany, error) {
	return retryAct(ctx, func() (UnassignedMany, error) { return c.unassignMany(ctx, r) })
}

func (c uses) unassignMany(ctx context.Context, r ManyRequest) (UnassignedMany, error) {
	ms, err := c.startMany(ctx, "unassign", "from", r)
	if err != nil {
		return UnassignedMany{}, err
	}
	what, st, snap, problems, onNode, progress := ms.what, ms.st, ms.snap, ms.problems, ms.onNode, ms.progress
	if dup := namedTwice(r.Modules); len(dup) > 0 {
		problems = append(problems, "named twice: "+strings.Join(dup, ", "))
	}
	// A module not registered is on no node: said once, as itself, not
	// as "not on" each node.
	registered := map[string]bool{}
	for _, m := range r.Modules {
		registered[m] = snap.Current[m] != ""
		if !registered[m] && !slices.Contains(ms.unknown, m) {
			problems = append(problems, fmt.Sprintf("module %s is not registered: see 'mesh-controller module list'", m))
			ms.unknown = append(ms.unknown, m)
		}
	}
	out := UnassignedMany{Nodes: []Unassigned{}}
	ch := inventory.Change{}
	bumps := []string{}
	now := c.Now()
	why := "unassigned from %s on " + now.UTC().Format("2006-01-02")
	for i, node := range r.Nodes {
		if _, ok := snap.Nodes[node]; !ok {
			continue
		}
		here := map[string]inventory.Assignment{}
		for _, a := range onNode[node] {
			here[a.Module] = a
		}
		one := Unassigned{Node: node, Modules: r.Modules, Retirements: []inventory.Retirement{}}
		for _, m := range r.Modules {
			a, ok := here[m]
			if !ok {
				if registered[m] {
					problems = append(problems, fmt.Sprintf("%s is not on %s", m, node))
				}
				continue
			}
			ch.Unassign = append(ch.Unassign, inventory.Holder{Node: node, Module: m})
			for _, d := range snap.Manifests[m][a.Version].Data {
				state := "retired"
				if d.Precious == inventory.Rebuildable {
					state = "dropped"
				}
				one.Retirements = append(one.Retirements, inventory.Retirement{Node: node, Module: m, DataSet: d.Name, Path: d.Path,
					Precious: d.Precious, State: state, RetiredAt: now, Why: fmt.Sprintf(why, node)})
			}
		}
		ch.Retirements = append(ch.Retirements, one.Retirements...)
		out.Nodes = append(out.Nodes, one)
		bumps = append(bumps, node)
		progress("judged", i+1, len(r.Nodes))
	}
	// A provider may not leave a consumer that still needs it with no other provider.
	problems = append(problems, snap.LastProviders(bumps, r.Modules)...)
	if err := ms.refuse(problems); err != nil {
		return UnassignedMany{}, err
	}
	// The mesh as it will be: their consumers' providers keep what they kept
	// for them, and those consumers now wait for a person to retire them.
	after := snap.Clone()
	after.Unassign(ch.Unassign...)
	ch = withBindings(after, ch, append(bumps, after.HolderNodes("backup")...)...)
	// A consumer bound to a provider that leaves moves to another, which
	// starts without what the old one kept for it: said, and raised
	// (data.empty-replacement) until a person records it or the data is
	// reported there.
	for _, b := range ch.Bindings {
		old, ok := snap.Seats.Bindings[inventory.BindingKey(b.Node, b.Module, b.Provision)]
		if !ok || old.Provider == b.Provider || !slices.Contains(ch.Unassign, old.Provider) {
			continue
		}
		level, precious := snap.KeepsPrecious(old.Provider, b.Provision)
		if !precious {
			continue
		}
		empty := fmt.Sprintf("%s/%s's %s data (%s) stays on %s; %s starts without it", b.Node, b.Module, b.Provision, level, old.Provider, b.Provider)
		ch.Replacements = append(ch.Replacements, inventory.Replacement{What: "binding " + b.Node + " " + b.Provision, NewHolder: b.Provider.String(),
			OldHolder: old.Provider.String(), Data: empty})
		for i := range out.Nodes {
			if out.Nodes[i].Node == old.Provider.Node {
				out.Nodes[i].Empty = append(out.Nodes[i].Empty, empty)
			}
		}
	}
	for i := range out.Nodes {
		for _, cs := range after.Seats.Consumers {
			if cs.State == "waiting" && consumerOf(cs.Consumer, out.Nodes[i].Node, r.Modules) {
				out.Nodes[i].Waiting = append(out.Nodes[i].Waiting, cs)
			}
		}
	}
	// The licences they held are taken away once the act has committed (a
	// kill in between leaves holdings of modules no longer assigned, which
	// serve's catch-up forgets: finishActs).
	var holders []licences.Holder
	for _, h := range ch.Unassign {
		holders = append(holders, licences.Holder{Node: h.Node, Module: h.Module})
	}
	forget := func(ctx context.Context) error {
		stopped, err := st.Licences.Forget(ctx, holders, now)
		if err != nil {
			return err
		}
		for i, one := range out.Nodes {
			out.Nodes[i].Licences = nil
			for _, m := range r.Modules {
				out.Nodes[i].Licences = append(out.Nodes[i].Licences, stopped[one.Node+"/"+m]...)
			}
		}
		return nil
	}
	if out.Pushed, err = c.commitActWith(ctx, st, after, ch, "unassign", progress, forget); err != nil {
		return out, err
	}
	return out, c.recordActor(ctx, st, r, what)
}

// sameOnce keeps each problem once, saying how many times it was found
// when more than once: a problem that does not name its node is the same
// on every node of a many-node act.
func sameOnce(problems []string) []string {
	count := map[string]int{}
	var out []string
	for _, p := range problems {
		if count[p] == 0 {
			out = append(out, p)
		}
		count[p]++
	}
	for i, p := range out {
		if n := count[p]; n > 1 {
			out[i] = fmt.Sprintf("%s (%d times)", p, n)
		}
	}
	return out
}

func consumerOf(consumer, node string, modules []string) bool {
	for _, m := range modules {
		if consumer == node+"/"+m {
			return true
		}
	}
	return false
}
