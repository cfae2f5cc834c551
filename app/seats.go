package app

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"mesh-controller/contexts/health"
	"mesh-controller/contexts/inventory"
	"mesh-controller/contexts/secrets"
)

// Why seat, pin and retire commands refuse. Each reads as a sentence
// between a subject and a name: "web1/paperless does not provide postgres".
var (
	ErrNotReplicated  = errors.New("is not replicated: it has one holder; hand it over with --to")
	ErrCannotHold     = errors.New("cannot hold seat")
	ErrEmptyReplace   = errors.New("the replacement starts empty")
	ErrNotAProvider   = errors.New("does not provide")
	ErrNothingWaiting = errors.New("has no consumer waiting for retirement")
	ErrNotRetired     = errors.New("is not retired: only retired data is deleted by cleanup")
	ErrNoPin          = errors.New("has no pin for")
)

// Seats lists every seat any registered manifest defines.
func (c *Seats) Seats(ctx context.Context) ([]inventory.SeatView, error) {
	_, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return nil, err
	}
	return snap.SeatViews(), nil
}

func findSeat(snap *inventory.Snapshot, name string) (inventory.SeatView, error) {
	name = snap.Seats.SeatName(name)
	for _, v := range snap.SeatViews() {
		if v.Seat == name {
			return v, nil
		}
	}
	return inventory.SeatView{}, fmt.Errorf("seat %s: %w", name, inventory.ErrSeatNotFound)
}

// SeatRename renames a seat; the former name still resolves.
func (c *Seats) SeatRename(ctx context.Context, from, to string) error {
	if err := CheckNames(from, to); err != nil {
		return err
	}
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return err
	}
	seat, err := findSeat(snap, from)
	if err != nil {
		return err
	}
	// The holders' plans name the seat: they move with the rename.
	return st.Inventory.RenameSeat(ctx, seat.Seat, to, snap.HolderNodes(seat.Seat))
}

// Handover is what a seat handover or addition did, or would do.
type Handover struct {
	Seat    string   `json:"seat"`
	To      string   `json:"to"`
	From    []string `json:"from"`
	Changed bool     `json:"changed"`
	// Empty says what the replacement starts without: data sets and sizes that stay where they are.
	Empty string `json:"empty,omitempty"`
	// Recorded says the choice to start empty (--yes) is in the hand-act log.
	Recorded bool     `json:"recorded"`
	Pushed   []Pushed `json:"pushed"`
}

// errYesNeedsWhy refuses --yes without --why: --yes is a choice the
// hand-act log records, with why it was made.
var errYesNeedsWhy = fmt.Errorf("--yes is recorded in the hand-act log: %w", health.ErrNoWhy)

// stays is the verb for n things that stay where they are.
func stays(n int) string {
	if n == 1 {
		return "stays"
	}
	return "stay"
}

// HandoverRequest is what seat --to and seat --add are asked.
type HandoverRequest struct {
	Seat string
	// To is the new holder, node/module.
	To string
	// Add adds To beside the holders (a replicated seat) instead of handing
	// the seat over.
	Add bool
	// Yes hands the seat over even though the new holder starts without
	// the data the old one kept: a choice recorded as a hand act, with Why.
	Yes bool
	Why string
}

// SeatHandover hands a seat to an assignment in one act, or adds a holder
// to a replicated seat. A new holder that would start without precious data
// the old holder kept is said first, and needs Yes; that choice is recorded
// in the hand-act log with its Why.
func (c *Seats) SeatHandover(ctx context.Context, r HandoverRequest) (Handover, error) {
	recorded := false // the hand act, once whatever the tries
	return retryAct(ctx, func() (Handover, error) { return c.seatHandover(ctx, r, &recorded) })
}

func (c uses) seatHandover(ctx context.Context, r HandoverRequest, recorded *bool) (Handover, error) {
	name, to, add, yes := r.Seat, r.To, r.Add, r.Yes
	node, module, err := parseHolder(to)
	if err != nil {
		return Handover{}, err
	}
	if err := CheckName(name); err != nil {
		return Handover{}, err
	}
	if yes && r.Why == "" {
		return Handover{}, errYesNeedsWhy
	}
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return Handover{}, err
	}
	inv := st.Inventory
	seat, err := findSeat(snap, name)
	if err != nil {
		return Handover{}, err
	}
	target := inventory.Holder{Node: node, Module: module}
	if _, ok := snap.Nodes[node]; !ok {
		return Handover{}, fmt.Errorf("node %s %w", node, inventory.ErrNodeNotFound)
	}
	version := snap.VersionOn(node, module)
	if version == "" {
		return Handover{}, fmt.Errorf("module %s %w %s", module, ErrNotOnNode, node)
	}
	if !snap.CanHold(snap.Manifests[module][version], seat.Seat) {
		return Handover{}, fmt.Errorf("%s %w %s: its manifest does not define it", target, ErrCannotHold, seat.Seat)
	}
	h := Handover{Seat: seat.Seat, To: target.String(), From: seat.Holders, Pushed: []Pushed{}}
	holders := snap.Seats.Holders[seat.Seat]
	for _, cur := range holders {
		if cur == target {
			return h, nil // handing a seat to its holder changes nothing
		}
	}
	if add && !seat.Replicated {
		return h, fmt.Errorf("seat %s %w", seat.Seat, ErrNotReplicated)
	}
	change := inventory.SeatChange{Seat: seat.Seat, Add: []inventory.Holder{target}}
	bumps := []string{node}
	var replacement *inventory.Replacement
	if !add {
		data, err := inv.AllDataSets(ctx)
		if err != nil {
			return h, err
		}
		var lost []string
		for _, old := range holders {
			change.Remove = append(change.Remove, old)
			bumps = append(bumps, old.Node)
			lost = append(lost, startsEmpty(snap, data, old, target)...)
		}
		if len(lost) > 0 {
			h.Empty = fmt.Sprintf("%s %s on %s", strings.Join(lost, ", "), stays(len(lost)), strings.Join(seat.Holders, ", "))
			if !yes {
				return h, fmt.Errorf("%w: %s", ErrEmptyReplace, h.Empty)
			}
			replacement = &inventory.Replacement{What: "seat " + seat.Seat, NewHolder: target.String(), OldHolder: strings.Join(seat.Holders, ", "), Data: strings.Join(lost, ", ")}
			// --yes was what let it start empty: the log says who chose
			// that, and why; written first, as a person's word of what
			// they asked.
			if !*recorded {
				if err := c.recordHand(ctx, fmt.Sprintf("seat %s handed to %s, which starts empty: %s", seat.Seat, h.To, h.Empty), r.Why, "seat", ""); err != nil {
					return h, err
				}
				*recorded = true
			}
			h.Recorded = true
		}
	}
	// One transaction: the new holder is added and the old removed together.
	if err := inv.Apply(ctx, inventory.Change{Seats: []inventory.SeatChange{change}, Replacement: replacement, Bump: bumps, Based: snap.Revision}, c.Now()); err != nil {
		return h, err
	}
	fault("seat:after-inventory")
	h.Changed = true
	// The new holder's declaration is published first, so no sent
	// declaration ever leaves the seat empty.
	h.Pushed, err = c.sendPlans(ctx, st, append([]string{node}, withoutNode(bumps, node)...))
	return h, err
}

// ErrHolderForm means a holder was not written node/module.
var ErrHolderForm = errors.New("is not node/module")

func withoutNode(nodes []string, node string) []string {
	var out []string
	seen := map[string]bool{node: true}
	for _, n := range nodes {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out
}

// startsEmpty lists the precious data sets (with sizes) the old holder keeps
// that the new holder will not have: what stays behind.
func startsEmpty(snap *inventory.Snapshot, data map[string][]inventory.DataSet, old, target inventory.Holder) []string {
	if old.Node == target.Node && old.Module == target.Module {
		return nil
	}
	var out []string
	for _, d := range snap.ManifestOn(old).Data {
		if d.Precious == inventory.Rebuildable {
			continue
		}
		if old.Node == target.Node && reportedSet(data[target.Node], target.Module, d.Name) != nil {
			continue
		}
		size := "size not reported"
		if r := reportedSet(data[old.Node], old.Module, d.Name); r != nil {
			size = humanBytes(r.Bytes)
		}
		out = append(out, fmt.Sprintf("%s (%s, %s)", d.Name, d.Precious, size))
	}
	return out
}

func humanBytes(b int64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
	return Plural(b, "byte")
}

// Pinned is what pin or unpin did.
type Pinned struct {
	Node      string `json:"node"`
	Provision string `json:"provision"`
	Provider  string `json:"provider,omitempty"`
	Empty     string `json:"empty,omitempty"`
	Stays     string `json:"stays,omitempty"`
	// Recorded says the choice to start empty (--yes) is in the hand-act log.
	Recorded bool     `json:"recorded"`
	Pushed   []Pushed `json:"pushed"`
}

// PinRequest is what pin is asked: node's consumers of provision get it
// from module on from-node.
type PinRequest struct {
	Node, Provision, FromNode, Module string
	// Yes moves a binding even though its new provider starts without the
	// data the old one keeps: a choice recorded as a hand act, with Why.
	Yes bool
	Why string
}

// Pin chooses the provider a node's consumers get a provision from. Moving a
// binding whose provider keeps precious data for its consumer says the
// empty replacement first, and needs Yes; that choice is recorded in the
// hand-act log with its Why.
func (c *Seats) Pin(ctx context.Context, r PinRequest) (Pinned, error) {
	recorded := false // the hand act, once whatever the tries
	return retryAct(ctx, func() (Pinned, error) { return c.pin(ctx, r, &recorded) })
}

func (c uses) pin(ctx context.Context, r PinRequest, recorded *bool) (Pinned, error) {
	node, provision, fromNode, module, yes := r.Node, r.Provision, r.FromNode, r.Module, r.Yes
	if err := CheckNames(node, provision, fromNode, module); err != nil {
		return Pinned{}, err
	}
	if yes && r.Why == "" {
		return Pinned{}, errYesNeedsWhy
	}
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return Pinned{}, err
	}
	for _, n := range []string{node, fromNode} {
		if _, ok := snap.Nodes[n]; !ok {
			return Pinned{}, fmt.Errorf("node %s %w", n, inventory.ErrNodeNotFound)
		}
	}
	provider := inventory.Holder{Node: fromNode, Module: module}
	if v := snap.VersionOn(fromNode, module); v == "" || !inventory.Provides(snap.Manifests[module][v], provision) {
		return Pinned{}, fmt.Errorf("%s %w %s", provider, ErrNotAProvider, provision)
	}
	out := Pinned{Node: node, Provision: provision, Provider: provider.String()}
	var moving []inventory.Binding
	for _, b := range snap.Seats.Bindings {
		if b.Node == node && b.Provision == provision && b.Provider != provider {
			moving = append(moving, b)
		}
	}
	var replacement *inventory.Replacement
	var lost []string
	for _, b := range moving {
		if level, precious := snap.KeepsPrecious(b.Provider, provision); precious {
			lost = append(lost, fmt.Sprintf("%s's %s data (%s) stays on %s", b.Node+"/"+b.Module, provision, level, b.Provider))
		}
	}
	if len(lost) > 0 {
		out.Empty = strings.Join(lost, "; ")
		if !yes {
			return out, fmt.Errorf("%w: %s", ErrEmptyReplace, out.Empty)
		}
		replacement = &inventory.Replacement{What: "binding " + node + " " + provision, NewHolder: provider.String(), OldHolder: moving[0].Provider.String(), Data: out.Empty}
		// --yes was what let it start empty: the log says who chose that,
		// and why; written first, as a person's word of what they asked.
		if !*recorded {
			if err := c.recordHand(ctx, fmt.Sprintf("pin %s %s to %s, which starts empty: %s", node, provision, out.Provider, out.Empty), r.Why, "pin", ""); err != nil {
				return out, err
			}
			*recorded = true
		}
		out.Recorded = true
	}
	pin := inventory.Pin{Node: node, Provision: provision, Provider: provider}
	ch := inventory.Change{Pins: []inventory.Pin{pin}, Replacement: replacement}
	after := snap.Clone()
	after.Seats.Pins[node+"/"+provision] = pin
	out.Pushed, err = c.commitAct(ctx, st, after, withBindings(after, ch), "pin")
	return out, err
}

// withBindings completes a change that may move bindings: the bindings
// and consumer states the mesh as it will be (after) chooses, and in Bump
// the nodes given and those the bindings move, each once, sorted.
func withBindings(after *inventory.Snapshot, ch inventory.Change, bumps ...string) inventory.Change {
	var moved []string
	ch.Bindings, ch.Consumers, moved = after.BindingChanges()
	set := map[string]bool{}
	for _, n := range append(bumps, moved...) {
		set[n] = true
	}
	ch.Bump = slices.Sorted(maps.Keys(set))
	return ch
}

// Unpin puts the choice back to the mesh; a binding whose provider keeps
// precious data for its consumer stays where it is (stickiness).
func (c *Seats) Unpin(ctx context.Context, node, provision string) (Pinned, error) {
	return retryAct(ctx, func() (Pinned, error) { return c.unpin(ctx, node, provision) })
}

func (c uses) unpin(ctx context.Context, node, provision string) (Pinned, error) {
	if err := CheckNames(node, provision); err != nil {
		return Pinned{}, err
	}
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return Pinned{}, err
	}
	if _, ok := snap.Seats.Pins[node+"/"+provision]; !ok {
		return Pinned{}, fmt.Errorf("node %s %w %s", node, ErrNoPin, provision)
	}
	out := Pinned{Node: node, Provision: provision}
	for _, b := range snap.Seats.Bindings {
		if b.Node == node && b.Provision == provision {
			if level, precious := snap.KeepsPrecious(b.Provider, provision); precious {
				out.Stays = fmt.Sprintf("%s stays bound to %s: it keeps %s data for it", b.Node+"/"+b.Module, b.Provider, level)
			}
		}
	}
	after := snap.Clone()
	delete(after.Seats.Pins, node+"/"+provision)
	ch := inventory.Change{Pins: []inventory.Pin{{Node: node, Provision: provision}}}
	out.Pushed, err = c.commitAct(ctx, st, after, withBindings(after, ch), "unpin")
	return out, err
}

// Rotated is what rotate did.
type Rotated struct {
	Credentials []string `json:"credentials"`
	Pushed      []Pushed `json:"pushed"`
}

// Rotate makes new per-consumer credentials for a provision (one consumer's,
// or one module's), and sends provider and consumers their declarations in
// one push, so both ends change together. The old values are not kept.
func (c *Seats) Rotate(ctx context.Context, provision, consumer, module string) (Rotated, error) {
	if err := CheckName(provision); err != nil {
		return Rotated{}, err
	}
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return Rotated{}, err
	}
	out := Rotated{Credentials: []string{}}
	recipients, err := hostRecipients(ctx, st.Identity)
	if err != nil {
		return out, err
	}
	nodes := map[string]bool{}
	var keeps []secrets.Keeping
	for _, key := range slices.Sorted(maps.Keys(snap.Seats.Bindings)) {
		b := snap.Seats.Bindings[key]
		if b.Provision != provision || !snap.GivesCredential(b.Provider, provision) ||
			(consumer != "" && b.Node != consumer) || (module != "" && b.Module != module && b.Provider.Module != module) {
			continue
		}
		k, err := credentialKeeping(b, "made", recipients)
		if err != nil {
			return out, err
		}
		keeps = append(keeps, k)
		out.Credentials = append(out.Credentials, fmt.Sprintf("%s/%s for %s/%s", b.Provider, provision, b.Node, b.Module))
		nodes[b.Node], nodes[b.Provider.Node] = true, true
	}
	if len(keeps) == 0 {
		return out, fmt.Errorf("%s: %w", provision, ErrNothingToRotate)
	}
	slices.Sort(out.Credentials)
	// The plans move first: a rotation stopped after its credentials are
	// kept still has both ends declared by the catch-up, together.
	bumped := slices.Sorted(maps.Keys(nodes))
	if err := st.Inventory.BumpPlans(ctx, bumped); err != nil {
		return out, err
	}
	fault("rotate:after-inventory")
	// The commit point: every new credential in one secrets transaction.
	if _, err := st.Secrets.KeepAll(ctx, keeps, c.Now()); err != nil {
		return out, err
	}
	fault("rotate:after-secrets")
	out.Pushed, err = c.sendPlans(ctx, st, bumped)
	return out, err
}

// ErrNothingToRotate means no binding of that provision carries a credential.
var ErrNothingToRotate = errors.New("no binding gives a per-consumer credential for it")

// recordHand records a hand act through the one path every command uses.
func (c uses) recordHand(ctx context.Context, what, why, cause, condition string) error {
	if why == "" {
		return health.ErrNoWhy
	}
	st, err := c.stores(ctx)
	if err != nil {
		return err
	}
	_, err = st.Health.RecordHandAct(ctx, health.HandAct{At: c.Now(), What: what, Why: why, Cause: cause, Who: who(), Condition: condition})
	return err
}
