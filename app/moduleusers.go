package app

import (
	"context"
	"maps"
	"runtime"
	"slices"
	"time"

	"filippo.io/age"
	"golang.org/x/sync/errgroup"

	"mesh-controller/app/protocol"
	"mesh-controller/contexts/identity"
	"mesh-controller/contexts/inventory"
	"mesh-controller/embedded/broker"
)

// CredsName is the name a module's own broker user carries in its sealed
// label, and its file's name in the module's directory on its host.
const CredsName = protocol.BrokerCredsName

// ensureMade makes what the mesh makes for the snapshot's assignments: each
// module's own broker user, then its secrets and credentials (ensureSecrets).
// It returns the nodes whose plans carry something new.
func (c uses) ensureMade(ctx context.Context, st *Stores, snap *inventory.Snapshot, bumped []string) ([]string, error) {
	users, err := c.ensureModuleUsers(ctx, st, snap, bumped)
	if err != nil {
		return nil, err
	}
	secrets, err := c.ensureSecrets(ctx, st, snap, append(bumped, users...))
	if err != nil {
		return nil, err
	}
	set := map[string]bool{}
	for _, n := range append(users, secrets...) {
		set[n] = true
	}
	return slices.Sorted(maps.Keys(set)), nil
}

// ensureModuleUsers gives every assigned module on a joined node its own
// broker user, allowed what its manifest's version says (manifest.md:
// emits, consumes, tools), sealed to that node alone: no operator key is
// needed, for it can always be issued again. A user made for another
// version is replaced, and one whose module is no longer on its node is
// revoked, with every user issued by hand for it there (module issue);
// the serving controller is told, so the broker refuses them. The
// plans of the nodes concerned move first, as ensureSecrets does.
func (c uses) ensureModuleUsers(ctx context.Context, st *Stores, snap *inventory.Snapshot, bumped []string) ([]string, error) {
	have, err := st.Identity.ModuleUsersUnsealed(ctx)
	if err != nil {
		return nil, err
	}
	// Every host's recipient is read only once a user must be made: the
	// catch-up calls this every few seconds, and most times nothing is.
	var recipients map[string]string
	wanted := map[string]bool{}
	var made, kept []identity.ModuleUser
	var revoke []string
	nodes := map[string]bool{}
	var keys *broker.Keys
	// toMake are the users to make, sealed to their hosts' recipients.
	type user struct {
		a    inventory.Assignment
		rcpt string
	}
	var toMake []user
	for _, a := range snap.Assignments {
		key := a.Node + "/" + a.Module
		wanted[key] = true
		old, ok := have[key]
		if ok && old.Version == a.Version {
			continue
		}
		if ok && samePermissions(snap.Manifests[a.Module][old.Version], snap.Manifests[a.Module][a.Version], a.Node) {
			// A new version that emits, consumes and answers the same keeps
			// its user: an upgrade revokes nothing, so the broker's list of
			// revoked users grows only when what a module may do changes.
			old.Version = a.Version
			kept = append(kept, old)
			continue
		}
		if recipients == nil {
			if recipients, err = hostRecipients(ctx, st.Identity); err != nil {
				return nil, err
			}
		}
		rcpt := recipients[a.Node]
		if rcpt == "" {
			continue // made when the node joins
		}
		if keys == nil {
			k, err := brokerKeys(ctx, st.Identity)
			if err != nil {
				return nil, err
			}
			keys = &k
		}
		toMake = append(toMake, user{a, rcpt})
		if ok {
			revoke = append(revoke, old.Pub)
		}
		nodes[a.Node] = true
	}
	// Made on every core: an assign to ten thousand nodes makes ten
	// thousand, each a key pair, a signed JWT and a sealing.
	made = make([]identity.ModuleUser, len(toMake))
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	now := c.Now()
	for i, m := range toMake {
		g.Go(func() (err error) {
			made[i], err = sealModuleUser(*keys, snap.Manifests[m.a.Module][m.a.Version], m.a.Node, m.a.Version, m.rcpt, now)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	for key, u := range have {
		if !wanted[key] {
			revoke = append(revoke, u.Pub)
			if snap.Nodes[u.Node].Name != "" {
				nodes[u.Node] = true
			}
		}
	}
	// A user issued by hand (module issue) ends with its module on its
	// node too; no plan carries it, so none moves.
	issued, err := st.Identity.HandIssuedModuleUsers(ctx)
	if err != nil {
		return nil, err
	}
	for _, u := range issued {
		if !wanted[u.Node+"/"+u.Module] {
			revoke = append(revoke, u.Pub)
		}
	}
	if len(made) == 0 && len(revoke) == 0 {
		if len(kept) > 0 {
			return nil, st.Identity.KeepModuleUsers(ctx, nil, nil, kept, c.Now())
		}
		return nil, nil
	}
	if _, err := bumpFirst(ctx, st, nodes, bumped); err != nil {
		return nil, err
	}
	if err := st.Identity.KeepModuleUsers(ctx, made, revoke, kept, c.Now()); err != nil {
		return nil, err
	}
	if len(revoke) > 0 {
		c.tellRevoked(ctx, st.Identity)
	}
	return slices.Sorted(maps.Keys(nodes)), nil
}

// sealModuleUser makes a module's broker user on a node and seals its
// .creds to the node's age recipient; the plaintext is dropped here.
func sealModuleUser(keys broker.Keys, m inventory.Manifest, node, version, recipient string, now time.Time) (identity.ModuleUser, error) {
	userJWT, seed, err := keys.NewUser("module "+m.Module+" on "+node, modulePermissions(m, node))
	if err != nil {
		return identity.ModuleUser{}, err
	}
	pub, err := broker.PublicOfSeed(seed)
	if err != nil {
		return identity.ModuleUser{}, err
	}
	creds, err := broker.Creds(userJWT, seed)
	if err != nil {
		return identity.ModuleUser{}, err
	}
	r, err := age.ParseX25519Recipient(recipient)
	if err != nil {
		return identity.ModuleUser{}, err
	}
	sealed, err := protocol.SealSecret(protocol.NewSecret([]byte(creds)),
		protocol.Label{Node: node, Module: m.Module, Name: CredsName, Version: now.UnixMilli()}, r)
	if err != nil {
		return identity.ModuleUser{}, err
	}
	return identity.ModuleUser{Pub: pub, Node: node, Module: m.Module, Version: version, Sealed: sealed}, nil
}

// moduleCreds are the sealed module users a planner gives each module.
func moduleCreds(ctx context.Context, ids *identity.Store) (map[string]string, error) {
	users, err := ids.ModuleUsers(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(users))
	for k, u := range users {
		out[k] = u.Sealed
	}
	return out, nil
}

// tellRevoked tells a serving controller that users were revoked, so its
// broker refuses them and closes their connections; with none serving,
// serve reads them when it starts.
func (c uses) tellRevoked(ctx context.Context, ids *identity.Store) bool {
	nc, err := c.dialBroker(ctx, ids)
	if err != nil {
		return false
	}
	defer nc.Close()
	return nc.Publish(RevokedSubject, []byte("{}")) == nil && nc.FlushTimeout(protocol.AnswerTimeout) == nil
}

// samePermissions says two manifests of a module give its user on a node
// the same broker permissions. A version the store no longer knows is
// never the same.
func samePermissions(a, b inventory.Manifest, node string) bool {
	if a.Module == "" || b.Module == "" {
		return false
	}
	pa, pb := modulePermissions(a, node), modulePermissions(b, node)
	return slices.Equal(pa.Publish, pb.Publish) && slices.Equal(pa.Subscribe, pb.Subscribe) && pa.MaxPayload == pb.MaxPayload && pa.MaxSubs == pb.MaxSubs
}
