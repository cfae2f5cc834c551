package app

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"mesh-controller/app/protocol"

	"mesh-controller/contexts/identity"
	"mesh-controller/contexts/inventory"
	"mesh-controller/contexts/secrets"
)

// bindingKey names one consumer's need.
func bindingKey(node, module, provision string) string { return node + "/" + module + "/" + provision }

// providersOf lists the assignments providing a provision, by node/module.
func providersOf(snap *inventory.Snapshot, provision string) []inventory.Holder {
	var out []inventory.Holder
	for _, a := range snap.Assignments {
		if provides(snap.Manifests[a.Module][a.Version], provision) {
			out = append(out, inventory.Holder{Node: a.Node, Module: a.Module})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// keepsPrecious says a provider keeps irreplaceable or costly data per
// consumer of a provision: its bindings do not move while it lives.
func keepsPrecious(snap *inventory.Snapshot, h inventory.Holder, provision string) (string, bool) {
	m := snap.Manifests[h.Module][versionOn(snap, h.Node, h.Module)]
	for _, p := range m.Provides {
		if p.Provision == provision && p.PerConsumer != nil && p.PerConsumer.Data != nil &&
			(p.PerConsumer.Data.Precious == inventory.Irreplaceable || p.PerConsumer.Data.Precious == inventory.Costly) {
			return p.PerConsumer.Data.Precious, true
		}
	}
	return "", false
}

// choice is a binding chosen, and why it is that one.
type choice struct {
	provider inventory.Holder
	why      string
}

// chooseBindings decides every consumer's provider: a pin; else the current
// binding while it is valid (stickiness); else a provider on the same node;
// else the one with the fewest consumers; ties by name.
func chooseBindings(snap *inventory.Snapshot) map[string]choice {
	out := map[string]choice{}
	load := map[inventory.Holder]int{}
	type need struct{ node, module, provision string }
	var needs []need
	for _, a := range snap.Assignments {
		for _, n := range snap.Manifests[a.Module][a.Version].Needs {
			needs = append(needs, need{a.Node, a.Module, n.Provision})
		}
	}
	valid := func(h inventory.Holder, cands []inventory.Holder) bool {
		for _, c := range cands {
			if c == h {
				return true
			}
		}
		return false
	}
	// First the needs already decided (pinned or sticky), so the loads of
	// the rest count them.
	pending := []need{}
	for _, n := range needs {
		cands := providersOf(snap, n.provision)
		key := bindingKey(n.node, n.module, n.provision)
		if p, ok := snap.Seats.Pins[n.node+"/"+n.provision]; ok && valid(p.Provider, cands) {
			out[key] = choice{p.Provider, "pinned by a person"}
		} else if b, ok := snap.Seats.Bindings[key]; ok && valid(b.Provider, cands) {
			why := "bound since " + b.Since.Format("2006-01-02") + " (bindings are sticky)"
			if level, precious := keepsPrecious(snap, b.Provider, n.provision); precious {
				why = fmt.Sprintf("bound since %s; it keeps %s data for this consumer, so only a pin moves it", b.Since.Format("2006-01-02"), level)
			}
			out[key] = choice{b.Provider, why}
		} else {
			pending = append(pending, n)
			continue
		}
		load[out[key].provider]++
	}
	for _, n := range pending {
		cands := providersOf(snap, n.provision)
		if len(cands) == 0 {
			continue
		}
		var pick inventory.Holder
		why := ""
		for _, c := range cands {
			if c.Node == n.node {
				pick, why = c, "a provider on the same node"
				break
			}
		}
		if why == "" {
			pick, why = cands[0], "the provider with the fewest consumers"
			for _, c := range cands[1:] {
				if load[c] < load[pick] {
					pick = c
				}
			}
		}
		out[bindingKey(n.node, n.module, n.provision)] = choice{pick, why}
		load[pick]++
	}
	return out
}

// syncBindings stores the bindings chosen, marks the consumers of each
// provider active or waiting for retirement, and makes per-consumer
// credentials; it returns the nodes whose plans moved.
func (c *Controller) syncBindings(ctx context.Context, inv *inventory.Store, ids *identity.Store, sec *secrets.Store) ([]string, error) {
	snap, err := inv.Snapshot(ctx)
	if err != nil {
		return nil, err
	}
	chosen := chooseBindings(snap)
	bumps := map[string]bool{}
	var bindings []inventory.Binding
	bound := map[string]inventory.Holder{} // consumer/provision -> provider
	for key, ch := range chosen {
		node, module, provision := splitKey(key)
		bindings = append(bindings, inventory.Binding{Node: node, Module: module, Provision: provision, Provider: ch.provider})
		if old, ok := snap.Seats.Bindings[key]; !ok || old.Provider != ch.provider {
			bumps[node], bumps[ch.provider.Node] = true, true
		}
		bound[node+"/"+module+"|"+provision] = ch.provider
	}
	var changes []inventory.ConsumerChange
	have := map[string]bool{}
	for _, cs := range snap.Seats.Consumers {
		have[cs.Provider.String()+"|"+cs.Consumer+"|"+cs.Provision] = true
		p, stillBound := bound[cs.Consumer+"|"+cs.Provision]
		switch {
		case stillBound && p == cs.Provider && cs.State != "active":
			changes = append(changes, inventory.ConsumerChange{Provider: cs.Provider, Consumer: cs.Consumer, Provision: cs.Provision, State: "active", Why: "bound again"})
			bumps[cs.Provider.Node] = true
		case (!stillBound || p != cs.Provider) && cs.State == "active":
			why := cs.Consumer + " was unassigned"
			if stillBound {
				why = cs.Consumer + "'s binding moved to " + p.String()
			}
			changes = append(changes, inventory.ConsumerChange{Provider: cs.Provider, Consumer: cs.Consumer, Provision: cs.Provision, State: "waiting", Why: why})
			bumps[cs.Provider.Node] = true
		}
	}
	for k, p := range bound {
		consumer, provision := k[:len(k)-len(provisionOf(k))-1], provisionOf(k)
		if !have[p.String()+"|"+consumer+"|"+provision] {
			changes = append(changes, inventory.ConsumerChange{Provider: p, Consumer: consumer, Provision: provision, State: "active", Why: "bound"})
		}
	}
	if err := inv.SetBindings(ctx, bindings, changes, nil, sortedKeys(bumps), c.Now()); err != nil {
		return nil, err
	}
	made, err := c.makeCredentials(ctx, inv, ids, sec)
	for _, n := range made {
		bumps[n] = true
	}
	return sortedKeys(bumps), err
}

func splitKey(key string) (node, module, provision string) {
	parts := [3]string{}
	i := 0
	start := 0
	for j := 0; j < len(key) && i < 2; j++ {
		if key[j] == '/' {
			parts[i] = key[start:j]
			i++
			start = j + 1
		}
	}
	parts[2] = key[start:]
	return parts[0], parts[1], parts[2]
}

func provisionOf(k string) string {
	for i := len(k) - 1; i >= 0; i-- {
		if k[i] == '|' {
			return k[i+1:]
		}
	}
	return ""
}

// credentialName is the secret a provider keeps for one consumer's credential.
func credentialName(consumerNode, consumerModule, provision string) string {
	return "consumer." + consumerNode + "." + consumerModule + "." + provision
}

// makeCredentials makes, for every active binding to a provider that gives
// each consumer a credential, the credential it lacks, sealed to the
// provider's node, the consumer's node and the operator key; it returns the
// nodes whose plans now carry a new credential.
func (c *Controller) makeCredentials(ctx context.Context, inv *inventory.Store, ids *identity.Store, sec *secrets.Store) ([]string, error) {
	snap, err := inv.Snapshot(ctx)
	if err != nil {
		return nil, err
	}
	var made []string
	for _, b := range snap.Seats.Bindings {
		if !givesCredential(snap, b.Provider, b.Provision) {
			continue
		}
		name := credentialName(b.Node, b.Module, b.Provision)
		if _, err := sec.Copy(ctx, b.Provider.Node, b.Provider.Module, name); err == nil {
			continue
		}
		if err := c.sealCredential(ctx, ids, sec, b, name); err != nil {
			if isNotReady(err) {
				continue // made when both nodes have joined and a key is set
			}
			return made, err
		}
		made = append(made, b.Node, b.Provider.Node)
	}
	if len(made) > 0 {
		if err := inv.BumpPlans(ctx, made); err != nil {
			return made, err
		}
	}
	return made, nil
}

func givesCredential(snap *inventory.Snapshot, h inventory.Holder, provision string) bool {
	for _, p := range snap.Manifests[h.Module][versionOn(snap, h.Node, h.Module)].Provides {
		if p.Provision == provision && p.PerConsumer != nil && p.PerConsumer.Credential {
			return true
		}
	}
	return false
}

// sealCredential makes a new credential for one binding and keeps it,
// sealed to both ends and the operator; the old value is not kept.
func (c *Controller) sealCredential(ctx context.Context, ids *identity.Store, sec *secrets.Store, b inventory.Binding, name string) error {
	provider, err := nodeRecipient(ctx, ids, b.Provider.Node)
	if err != nil {
		return err
	}
	consumer, err := nodeRecipient(ctx, ids, b.Node)
	if err != nil {
		return err
	}
	if _, err := sec.OperatorKey(ctx); err != nil {
		return err
	}
	v, err := newMeshSecret()
	if err != nil {
		return err
	}
	_, err = keepSealed(ctx, sec, provider, protocol.Label{Node: b.Provider.Node, Module: b.Provider.Module, Name: name}, "mesh", "made", v, c.Now(), consumer)
	return err
}

func isNotReady(err error) bool {
	return errors.Is(err, ErrNotJoined) || errors.Is(err, secrets.ErrNoOperatorKey)
}
