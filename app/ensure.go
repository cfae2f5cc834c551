package app

import (
	"context"
	"maps"
	"slices"

	"mesh-controller/app/protocol"
	"mesh-controller/contexts/inventory"
	"mesh-controller/contexts/secrets"
)

// An act changes several stores, which are separate files by design. Its
// first write, to the inventory, is its commit point; what follows — the
// secrets the mesh makes for it, the declarations it sends — is redone,
// idempotently, by the daemon's catch-up (ensureSecrets, then the nodes
// whose plan moved past their declaration are declared). So a process
// killed between two writes leaves the act done whole once serve catches
// up, or not done at all. Fault points (fault, in a test build) prove it.

// wantedSecret is one secret the mesh makes and an assignment needs.
type wantedSecret struct {
	label protocol.Label
	// nodes are the nodes it is sealed to (a credential: provider and consumer).
	nodes []string
}

// wantedSecrets lists every secret the mesh makes for the snapshot's
// assignments: each module's mesh-made secrets, and each per-consumer
// credential of a binding to a provider that gives one.
func wantedSecrets(snap *inventory.Snapshot) []wantedSecret {
	var out []wantedSecret
	for _, a := range snap.Assignments {
		for _, s := range snap.Manifests[a.Module][a.Version].Secrets {
			if s.MadeBy == "mesh" {
				out = append(out, wantedSecret{protocol.Label{Node: a.Node, Module: a.Module, Name: s.Name}, []string{a.Node}})
			}
		}
	}
	for _, key := range slices.Sorted(maps.Keys(snap.Seats.Bindings)) {
		b := snap.Seats.Bindings[key]
		if snap.VersionOn(b.Node, b.Module) == "" || !snap.GivesCredential(b.Provider, b.Provision) {
			continue
		}
		out = append(out, wantedSecret{protocol.Label{Node: b.Provider.Node, Module: b.Provider.Module, Name: inventory.CredentialName(b.Node, b.Module, b.Provision)},
			[]string{b.Provider.Node, b.Node}})
	}
	return out
}

// ensureSecrets makes every secret the mesh makes that the snapshot's
// assignments lack and that can be made now (every node it is sealed to
// has joined, and an operator key is set), in one secrets transaction. A
// secret made already is never made again (secrets.Keeping.IfMissing), so
// an act and a catch-up asking at once make it once. The plans of the nodes
// it is for are moved first, unless already moved (bumped): a process that
// stops after this leaves those nodes behind their plan, and the catch-up
// declares them. It returns the nodes whose plans carry new secrets.
func (c uses) ensureSecrets(ctx context.Context, st *Stores, snap *inventory.Snapshot, bumped []string) ([]string, error) {
	have, err := st.Secrets.Names(ctx)
	if err != nil {
		return nil, err
	}
	var missing []wantedSecret
	for _, w := range wantedSecrets(snap) {
		if !have[w.label.Node+"/"+w.label.Module+"/"+w.label.Name] {
			missing = append(missing, w)
		}
	}
	if len(missing) == 0 {
		return nil, nil
	}
	if _, err := st.Secrets.OperatorKey(ctx); err != nil {
		if err == secrets.ErrNoOperatorKey {
			return nil, nil // made once one is set
		}
		return nil, err
	}
	recipients, err := hostRecipients(ctx, st.Identity)
	if err != nil {
		return nil, err
	}
	var keeps []secrets.Keeping
	nodes := map[string]bool{}
	for _, w := range missing {
		var rs []string
		for _, n := range w.nodes {
			rs = append(rs, recipients[n])
		}
		if slices.Contains(rs, "") {
			continue // a node has not joined: made when it joins
		}
		v, err := newMeshSecret()
		if err != nil {
			return nil, err
		}
		k, err := keeping(w.label, "mesh", "made", v, rs...)
		if err != nil {
			return nil, err
		}
		k.IfMissing = true
		keeps = append(keeps, k)
		for _, n := range w.nodes {
			nodes[n] = true
		}
	}
	if len(keeps) == 0 {
		return nil, nil
	}
	if moved, err := bumpFirst(ctx, st, nodes, bumped); err != nil {
		return nil, err
	} else if moved {
		fault("secrets:after-bump")
	}
	kept, err := st.Secrets.KeepAll(ctx, keeps, c.Now())
	if err != nil {
		return nil, err
	}
	made := map[string]bool{}
	for _, k := range kept {
		for _, w := range missing {
			if w.label.Node == k.Node && w.label.Module == k.Module && w.label.Name == k.Name {
				for _, n := range w.nodes {
					made[n] = true
				}
			}
		}
	}
	return slices.Sorted(maps.Keys(made)), nil
}

// bumpFirst moves the plans of the nodes something new is made for, those
// not moved already (bumped), before it is kept: a process that stops in
// between leaves them behind their plan, and the catch-up declares them. It
// says whether it moved any.
func bumpFirst(ctx context.Context, st *Stores, nodes map[string]bool, bumped []string) (bool, error) {
	// A set, not slices.Contains: an act on 10,000 nodes bumps them all.
	already := make(map[string]bool, len(bumped))
	for _, n := range bumped {
		already[n] = true
	}
	var toBump []string
	for _, n := range slices.Sorted(maps.Keys(nodes)) {
		if !already[n] {
			toBump = append(toBump, n)
		}
	}
	if len(toBump) == 0 {
		return false, nil
	}
	return true, st.Inventory.BumpPlans(ctx, toBump)
}
