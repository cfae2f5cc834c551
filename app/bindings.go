package app

import (
	"context"
	"errors"
	"strings"

	"mesh-controller/app/protocol"

	"mesh-controller/contexts/identity"
	"mesh-controller/contexts/inventory"
	"mesh-controller/contexts/secrets"
)

// syncBindings stores the bindings chosen, marks the consumers of each
// provider active or waiting for retirement, and makes per-consumer
// credentials; it returns the nodes whose plans moved.
func (c *Controller) syncBindings(ctx context.Context, inv *inventory.Store, ids *identity.Store, sec *secrets.Store) ([]string, error) {
	snap, err := inv.Snapshot(ctx)
	if err != nil {
		return nil, err
	}
	chosen := snap.ChooseBindings()
	bumps := map[string]bool{}
	var bindings []inventory.Binding
	bound := map[string]inventory.Holder{} // consumer/provision -> provider
	for key, ch := range chosen {
		node, module, provision := inventory.SplitBindingKey(key)
		bindings = append(bindings, inventory.Binding{Node: node, Module: module, Provision: provision, Provider: ch.Provider})
		if old, ok := snap.Seats.Bindings[key]; !ok || old.Provider != ch.Provider {
			bumps[node], bumps[ch.Provider.Node] = true, true
		}
		bound[node+"/"+module+"|"+provision] = ch.Provider
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
		consumer, provision, _ := strings.Cut(k, "|")
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
		if !snap.GivesCredential(b.Provider, b.Provision) {
			continue
		}
		name := inventory.CredentialName(b.Node, b.Module, b.Provision)
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
