package app

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"time"

	"mesh-controller/contexts/inventory"
)

// Waiting is a provider and its consumers waiting for a person to retire them.
type Waiting struct {
	Provider  string               `json:"provider"`
	Consumers []inventory.Consumer `json:"consumers"`
}

// Retire lists every provider waiting for a person to approve a retirement.
func (c *Controller) Retire(ctx context.Context) ([]Waiting, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return nil, err
	}
	snap, err := st.Inventory.Snapshot(ctx)
	if err != nil {
		return nil, err
	}
	by := map[string]*Waiting{}
	for _, cs := range snap.Seats.Consumers {
		if cs.State != "waiting" {
			continue
		}
		w, ok := by[cs.Provider.String()]
		if !ok {
			w = &Waiting{Provider: cs.Provider.String()}
			by[cs.Provider.String()] = w
		}
		w.Consumers = append(w.Consumers, cs)
	}
	out := []Waiting{}
	for _, k := range slices.Sorted(maps.Keys(by)) {
		out = append(out, *by[k])
	}
	return out, nil
}

// RetireDecide approves (access off, data kept) or rejects (kept active;
// retire.rejected stays open) the retirements a provider waits with: a hand act.
func (c *Controller) RetireDecide(ctx context.Context, node, module, why string, approve bool) ([]inventory.Consumer, []Pushed, error) {
	if err := CheckNames(node, module); err != nil {
		return nil, nil, err
	}
	if why == "" {
		return nil, nil, errNoWhy
	}
	ps, err := c.openPlanStores(ctx)
	if err != nil {
		return nil, nil, err
	}
	st, inv, snap := ps.st, ps.inv, ps.snap
	provider := inventory.Holder{Node: node, Module: module}
	state, verb := "retired", "retire approve"
	if !approve {
		state, verb = "rejected", "retire reject"
	}
	var changes []inventory.ConsumerChange
	var decided []inventory.Consumer
	for _, cs := range snap.Seats.Consumers {
		// A rejected retirement may still be approved later.
		if cs.Provider == provider && (cs.State == "waiting" || (approve && cs.State == "rejected")) {
			changes = append(changes, inventory.ConsumerChange{Provider: provider, Consumer: cs.Consumer, Provision: cs.Provision, State: state, Why: why})
			cs.State = state
			decided = append(decided, cs)
		}
	}
	if len(changes) == 0 {
		return nil, nil, fmt.Errorf("%s %w", provider, ErrNothingWaiting)
	}
	// The hand act is written first: a person's word of what they asked
	// outlives a process stopped before the act is recorded.
	if err := c.recordHand(ctx, fmt.Sprintf("%s %s (%s)", verb, provider, Plural(len(decided), "consumer")), why, "retire", ""); err != nil {
		return nil, nil, err
	}
	if err := inv.Apply(ctx, inventory.Change{Consumers: changes, Bump: []string{node}}, c.Now()); err != nil {
		return nil, nil, err
	}
	pushed, err := c.sendPlans(ctx, st, []string{node})
	return decided, pushed, err
}

var errNoWhy = fmt.Errorf("a hand act needs --why: say why it was done")

// Cleanable is one retired consumer or retired data set a provider keeps.
type Cleanable struct {
	Node     string    `json:"node"`
	Module   string    `json:"module"`
	Target   string    `json:"target"`
	Kind     string    `json:"kind"` // data or consumer
	Path     string    `json:"path,omitempty"`
	Precious string    `json:"precious"`
	Since    time.Time `json:"since"`
	AgeDays  int       `json:"age_days"`
	Bytes    *int64    `json:"bytes"`
	Why      string    `json:"why"`
	// Deleting says a deletion was asked and the host has not reported it done.
	Deleting bool `json:"deleting"`
}

func cleanables(snap *inventory.Snapshot, retirements []inventory.Retirement, data map[string][]inventory.DataSet, now time.Time) []Cleanable {
	asked := map[string]bool{}
	for _, d := range snap.Seats.Deletions {
		asked[d.Node+"/"+d.Module+"/"+d.Kind+"/"+d.Target] = true
	}
	out := []Cleanable{}
	for _, r := range retirements {
		if r.State != "retired" || r.Consumer != "" {
			continue
		}
		cl := Cleanable{Node: r.Node, Module: r.Module, Target: r.DataSet, Kind: "data", Path: r.Path, Precious: r.Precious, Since: r.RetiredAt,
			AgeDays: int(now.Sub(r.RetiredAt).Hours() / 24), Why: r.Why, Deleting: asked[r.Node+"/"+r.Module+"/data/"+r.DataSet]}
		if d := reportedSet(data[r.Node], r.Module, r.DataSet); d != nil {
			cl.Bytes = &d.Bytes
		}
		out = append(out, cl)
	}
	for _, cs := range snap.Seats.Consumers {
		if cs.State != "retired" {
			continue
		}
		precious := ""
		if level, ok := snap.KeepsPrecious(cs.Provider, cs.Provision); ok {
			precious = level
		}
		out = append(out, Cleanable{Node: cs.Provider.Node, Module: cs.Provider.Module, Target: cs.Consumer, Kind: "consumer", Precious: precious,
			Since: cs.Since, AgeDays: int(now.Sub(cs.Since).Hours() / 24), Why: cs.Why,
			Deleting: asked[cs.Provider.Node+"/"+cs.Provider.Module+"/consumer/"+cs.Consumer]})
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].Node+out[i].Module+out[i].Target < out[j].Node+out[j].Module+out[j].Target
	})
	return out
}

func (c *Controller) readCleanup(ctx context.Context, inv *inventory.Store) (*inventory.Snapshot, []Cleanable, error) {
	snap, err := inv.Snapshot(ctx)
	if err != nil {
		return nil, nil, err
	}
	rs, err := inv.Retirements(ctx, "")
	if err != nil {
		return nil, nil, err
	}
	data, err := inv.AllDataSets(ctx)
	if err != nil {
		return nil, nil, err
	}
	return snap, cleanables(snap, rs, data, c.Now()), nil
}

// Cleanup lists every retired consumer and retired data set per provider.
func (c *Controller) Cleanup(ctx context.Context) ([]Cleanable, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return nil, err
	}
	_, out, err := c.readCleanup(ctx, st.Inventory)
	return out, err
}

// CleanupRequest is a cleanup delete: one target, or every one older than some days.
type CleanupRequest struct {
	Node, Module, Target string
	OlderThanDays        int
	Why                  string
	// Confirm carries out an --older-than deletion; without it, it only lists.
	Confirm bool
}

// CleanupDelete has providers delete retired data: one target, or (with
// OlderThanDays) every one older, only with Confirm. It returns what is (or
// would be) deleted.
func (c *Controller) CleanupDelete(ctx context.Context, r CleanupRequest) ([]Cleanable, []Pushed, error) {
	if r.Why == "" {
		return nil, nil, errNoWhy
	}
	st, err := c.stores(ctx)
	if err != nil {
		return nil, nil, err
	}
	inv := st.Inventory
	_, all, err := c.readCleanup(ctx, inv)
	if err != nil {
		return nil, nil, err
	}
	var chosen []Cleanable
	for _, cl := range all {
		if cl.Deleting {
			continue
		}
		if r.OlderThanDays > 0 {
			if cl.AgeDays >= r.OlderThanDays {
				chosen = append(chosen, cl)
			}
		} else if cl.Node == r.Node && cl.Module == r.Module && cl.Target == r.Target {
			chosen = append(chosen, cl)
		}
	}
	if r.OlderThanDays == 0 && len(chosen) == 0 {
		return nil, nil, fmt.Errorf("%s/%s %s %w", r.Node, r.Module, r.Target, ErrNotRetired)
	}
	if r.OlderThanDays > 0 && !r.Confirm {
		return chosen, nil, nil
	}
	nodes := map[string]bool{}
	for _, cl := range chosen {
		if err := inv.AskDeletion(ctx, inventory.Deletion{Node: cl.Node, Module: cl.Module, Target: cl.Target, Kind: cl.Kind, Path: cl.Path, Why: r.Why}, c.Now()); err != nil {
			return chosen, nil, err
		}
		if err := c.recordHand(ctx, fmt.Sprintf("cleanup delete %s/%s %s (%s)", cl.Node, cl.Module, cl.Target, cl.Kind), r.Why, "cleanup", ""); err != nil {
			return chosen, nil, err
		}
		nodes[cl.Node] = true
	}
	pushed, err := c.sendPlans(ctx, st, slices.Sorted(maps.Keys(nodes)))
	return chosen, pushed, err
}

// DataView is one data set a machine declares, as last found.
type DataView struct {
	Node         string     `json:"node"`
	Module       string     `json:"module"`
	Name         string     `json:"name"`
	Path         string     `json:"path"`
	Bytes        *int64     `json:"bytes"`
	Precious     string     `json:"precious"`
	State        string     `json:"state"` // active or retired
	LastBackup   *time.Time `json:"last_backup"`
	BackupHolder string     `json:"backup_holder"`
	Since        *time.Time `json:"since,omitempty"`
}

// Data lists every data set every machine declares: active ones from the
// assignments, retired ones remembered after their module left.
func (c *Controller) Data(ctx context.Context) ([]DataView, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return nil, err
	}
	inv := st.Inventory
	snap, err := inv.Snapshot(ctx)
	if err != nil {
		return nil, err
	}
	data, err := inv.AllDataSets(ctx)
	if err != nil {
		return nil, err
	}
	rs, err := inv.Retirements(ctx, "")
	if err != nil {
		return nil, err
	}
	return dataViews(snap, data, rs), nil
}

func dataViews(snap *inventory.Snapshot, data map[string][]inventory.DataSet, rs []inventory.Retirement) []DataView {
	holder := snap.BackupHolders()
	out := []DataView{}
	fill := func(v DataView) DataView {
		if d := reportedSet(data[v.Node], v.Module, v.Name); d != nil {
			v.Bytes, v.LastBackup = &d.Bytes, d.LastBackup
		}
		if t, ok := snap.Seats.Backups[v.Node+"/"+v.Module+"/"+v.Name]; ok && (v.LastBackup == nil || t.After(*v.LastBackup)) {
			v.LastBackup = &t
		}
		if v.Precious != inventory.Rebuildable {
			v.BackupHolder = holder
		}
		return v
	}
	for _, a := range snap.Assignments {
		for _, d := range snap.Manifests[a.Module][a.Version].Data {
			out = append(out, fill(DataView{Node: a.Node, Module: a.Module, Name: d.Name, Path: d.Path, Precious: d.Precious, State: "active"}))
		}
	}
	for _, r := range rs {
		if r.State != "retired" || r.Consumer != "" {
			continue
		}
		since := r.RetiredAt
		out = append(out, fill(DataView{Node: r.Node, Module: r.Module, Name: r.DataSet, Path: r.Path, Precious: r.Precious, State: "retired", Since: &since}))
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		return a.Node+"/"+a.Module+"/"+a.Name < b.Node+"/"+b.Module+"/"+b.Name
	})
	return out
}
