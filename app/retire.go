package app

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"mesh-controller/contexts/health"
	"mesh-controller/contexts/inventory"
)

// Waiting is a provider and its consumers waiting for a person to retire them.
type Waiting struct {
	Provider  string               `json:"provider"`
	Consumers []inventory.Consumer `json:"consumers"`
}

// Retire lists every provider waiting for a person to approve a retirement.
func (c *Seats) Retire(ctx context.Context) ([]Waiting, error) {
	_, snap, err := c.storesAndSnapshot(ctx)
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
func (c *Seats) RetireDecide(ctx context.Context, node, module, why string, approve bool) ([]inventory.Consumer, []Pushed, error) {
	type decision struct {
		decided []inventory.Consumer
		pushed  []Pushed
	}
	recorded := false // the hand act, once whatever the tries
	got, err := retryAct(ctx, func() (decision, error) {
		decided, pushed, err := c.retireDecide(ctx, node, module, why, approve, &recorded)
		return decision{decided, pushed}, err
	})
	return got.decided, got.pushed, err
}

func (c uses) retireDecide(ctx context.Context, node, module, why string, approve bool, recorded *bool) ([]inventory.Consumer, []Pushed, error) {
	if err := CheckNames(node, module); err != nil {
		return nil, nil, err
	}
	if why == "" {
		return nil, nil, health.ErrNoWhy
	}
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return nil, nil, err
	}
	inv := st.Inventory
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
	if !*recorded {
		if err := c.recordHand(ctx, fmt.Sprintf("%s %s (%s)", verb, provider, Plural(len(decided), "consumer")), why, "retire", ""); err != nil {
			return nil, nil, err
		}
		*recorded = true
	}
	if err := inv.Apply(ctx, inventory.Change{Consumers: changes, Bump: []string{node}, Based: snap.Revision}, c.Now()); err != nil {
		return nil, nil, err
	}
	pushed, err := c.sendPlans(ctx, st, []string{node})
	return decided, pushed, err
}
