package app

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"mesh-controller/app/nftables"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/health"
	"mesh-controller/contexts/inventory"
)

// Why converge refuses.
var (
	// ErrConvergedAlready means converge would change nothing: the node is
	// converged already, with that filter (or none).
	ErrConvergedAlready = errors.New("is converged already")
	// ErrConvergeDigestUnknown means --yes named a digest that is not of a
	// preview of converging this node.
	ErrConvergeDigestUnknown = errors.New("is not the digest of a preview of converging this node")
	// ErrConvergeChanged means the node or its plan changed since the
	// preview a digest is of.
	ErrConvergeChanged = errors.New("what converging it would do changed since that preview")
	// ErrNoFacts means the node's host has not said what runs there yet.
	ErrNoFacts = errors.New("has not reported what runs there yet")
	// ErrCloseSSHWithoutFilter means --close-ssh was asked without a filter
	// to close it in.
	ErrCloseSSHWithoutFilter = errors.New("--close-ssh closes the SSH port in the mesh's packet filter: it needs --filter nftables")
)

// ConvergeRequest is a converge: a preview, or with Yes, the act it shows.
type ConvergeRequest struct {
	Node string
	// Filter is the packet filter the mesh is to own there ("" none, or
	// inventory.FilterNftables).
	Filter string
	// CloseSSH closes the SSH port the node reports in the filter too.
	CloseSSH bool
	// Yes is the digest of the preview the person approved; "" previews.
	Yes string
}

// Listener is a listener a host found, as a converge preview shows it.
type Listener struct {
	Name      string   `json:"name"`
	Addresses []string `json:"addresses"`
	Commands  []string `json:"commands"`
	Detail    string   `json:"detail"`
}

// ConvergePreview is what converge shows: what the node is and would be,
// what would stop being kept, the filter the mesh would own, the digest.
type ConvergePreview struct {
	Node string `json:"node"`
	// revision is the act revision the preview was judged on: converging
	// is refused, and judged again, if another act committed since.
	revision int64
	// Mode is the node's mode now; Filter and CloseSSH its filter now.
	Mode     string `json:"mode"`
	Filter   string `json:"filter"`
	CloseSSH bool   `json:"close_ssh"`
	// ToFilter and ToCloseSSH are what it would own.
	ToFilter   string `json:"to_filter"`
	ToCloseSSH bool   `json:"to_close_ssh"`
	// FactsAt is when its host last reported what runs there.
	FactsAt time.Time `json:"facts_at"`
	// Kept are its modules' ports, as declared: what stays.
	Kept []string `json:"kept"`
	// Unmanaged are the listeners no module there declares (reachable, not
	// the mesh's own, not the SSH port kept open); Loopback those that
	// listen on loopback only; Units the active services beside the mesh.
	Unmanaged []Listener `json:"unmanaged"`
	Loopback  []Listener `json:"loopback"`
	Units     []string   `json:"units"`
	// SSHPort is the SSH port the filter keeps open (0: closed, or no
	// filter); SSHReported says its host saw sshd listening on it, rather
	// than it being the default.
	SSHPort     int  `json:"ssh_port"`
	SSHReported bool `json:"ssh_reported"`
	// Ruleset is the packet filter rendered, when one is to be owned.
	Ruleset string `json:"ruleset,omitempty"`
	// Does is what converging will do, in words.
	Does   []string `json:"does"`
	Digest string   `json:"digest"`
}

// Converged is what converge --yes did.
type Converged struct {
	Preview ConvergePreview `json:"preview"`
	Pushed  Pushed          `json:"pushed"`
}

// Converge previews making a node converged (the mesh's whole, and with
// Filter its packet filter the mesh's, rendered as an nftables ruleset),
// from what its host last reported running there and the node's plan; or,
// with r.Yes, previews again, refuses if it is no longer the one approved
// (saying what changed), else records the node converged with that filter
// in one transaction and declares it: its host applies the filter and
// rolls it back by itself if it cannot hear the controller after. The mesh
// stops nothing that runs there: what no module declares is said, closed
// by the filter, and raised as node.unmanaged-listener until it goes.
func (c *Modules) Converge(ctx context.Context, r ConvergeRequest) (ConvergePreview, *Converged, error) {
	type converged struct {
		p   ConvergePreview
		out *Converged
	}
	got, err := retryAct(ctx, func() (converged, error) {
		p, out, err := c.converge(ctx, r)
		return converged{p, out}, err
	})
	return got.p, got.out, err
}

func (c uses) converge(ctx context.Context, r ConvergeRequest) (ConvergePreview, *Converged, error) {
	if err := CheckName(r.Node); err != nil {
		return ConvergePreview{}, nil, err
	}
	if r.CloseSSH && r.Filter == "" {
		return ConvergePreview{}, nil, ErrCloseSSHWithoutFilter
	}
	if r.Filter != "" && r.Filter != inventory.FilterNftables {
		return ConvergePreview{}, nil, fmt.Errorf("filter %q: only %s is known", r.Filter, inventory.FilterNftables)
	}
	p, err := c.convergePreview(ctx, r)
	if err != nil {
		return ConvergePreview{}, nil, err
	}
	st, err := c.stores(ctx)
	if err != nil {
		return p, nil, err
	}
	// Remembered beside take's previews, with no module.
	other, old, err := previewShown(ctx, st.Inventory, inventory.TakePreview{Digest: p.Digest, Node: r.Node, ShownAt: c.Now()}, p, r.Yes)
	if err != nil {
		return p, nil, err
	}
	if r.Yes == "" {
		return p, nil, nil
	}
	if other {
		if old == nil {
			return p, nil, fmt.Errorf("nothing done: %s %w (%s); its preview's digest is %s", r.Yes, ErrConvergeDigestUnknown, convergeSaid(r.Node, r.Filter, r.CloseSSH), p.Digest)
		}
		if was, is := convergeSaid(old.Node, old.ToFilter, old.ToCloseSSH), convergeSaid(r.Node, r.Filter, r.CloseSSH); was != is {
			return p, nil, fmt.Errorf("nothing done: %s %w (%s): it is of %s; its preview's digest is %s", r.Yes, ErrConvergeDigestUnknown, is, was, p.Digest)
		}
		return p, nil, fmt.Errorf("nothing done: %w: %s; its digest is now %s", ErrConvergeChanged, strings.Join(convergeChanges(*old, p), "; "), p.Digest)
	}
	// Said before the write and until declared, so that a serving
	// controller's catch-up leaves the node to this act.
	under, err := st.Inventory.BeginAct(ctx, "converge", c.Now().Add(actUnderWayFor))
	if err != nil {
		return p, nil, err
	}
	defer st.Inventory.EndAct(context.WithoutCancel(ctx), under, c.Now())
	var f *inventory.Filter
	if r.Filter != "" {
		f = &inventory.Filter{Kind: r.Filter, CloseSSH: r.CloseSSH, Since: c.Now()}
	}
	if err := st.Inventory.Converge(ctx, r.Node, f, p.revision); err != nil {
		return p, nil, err
	}
	pushed, err := c.sendPlans(ctx, st, []string{r.Node})
	if err != nil {
		return p, nil, err
	}
	out := &Converged{Preview: p, Pushed: pushed[0]}
	_, err = st.Health.RecordHandAct(ctx, health.HandAct{At: c.Now(), What: "converge " + r.Node, Cause: "converge", Who: who(),
		Why: fmt.Sprintf("as previewed (%s): %s", p.Digest, strings.Join(p.Does, "; "))})
	return p, out, err
}

// convergeSaid is a converge as a person types it.
func convergeSaid(node, filter string, closeSSH bool) string {
	s := "converge " + node
	if filter != "" {
		s += " --filter " + filter
	}
	if closeSSH {
		s += " --close-ssh"
	}
	return s
}

// convergePreview works out what converging a node would do.
func (c uses) convergePreview(ctx context.Context, r ConvergeRequest) (ConvergePreview, error) {
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return ConvergePreview{}, err
	}
	n, ok := snap.Nodes[r.Node]
	if !ok {
		return ConvergePreview{}, fmt.Errorf("node %s %w", r.Node, inventory.ErrNodeNotFound)
	}
	p := ConvergePreview{Node: r.Node, Mode: string(n.Mode), ToFilter: r.Filter, ToCloseSSH: r.CloseSSH,
		Kept: []string{}, Unmanaged: []Listener{}, Loopback: []Listener{}, Units: []string{}, Does: []string{}, revision: snap.Revision}
	if f, ok := snap.Filters[r.Node]; ok {
		p.Filter, p.CloseSSH = f.Kind, f.CloseSSH
	}
	if n.Mode == inventory.Converged && p.Filter == p.ToFilter && p.CloseSSH == p.ToCloseSSH {
		with := "with no packet filter of the mesh's"
		if p.Filter != "" {
			with = "with the mesh's " + p.Filter + " filter"
		}
		return ConvergePreview{}, fmt.Errorf("node %s %w, %s", r.Node, ErrConvergedAlready, with)
	}
	node, err := st.Inventory.Node(ctx, r.Node)
	if err != nil {
		return ConvergePreview{}, err
	}
	factsAt, err := st.Inventory.FactsAt(ctx, r.Node)
	if err != nil {
		return ConvergePreview{}, err
	}
	if factsAt == nil {
		return ConvergePreview{}, fmt.Errorf("node %s %w (%s)", r.Node, ErrNoFacts, silentSince(node))
	}
	p.FactsAt = factsAt.UTC()
	_, found, err := st.Inventory.Facts(ctx, r.Node)
	if err != nil {
		return ConvergePreview{}, err
	}
	ssh, err := sshPorts(ctx, st.Inventory)
	if err != nil {
		return ConvergePreview{}, err
	}
	// What the node would be: its listeners judged as the condition will
	// judge them once it is converged with this filter.
	would := *snap
	would.Filters = map[string]inventory.Filter{}
	if r.Filter != "" {
		would.Filters[r.Node] = inventory.Filter{Kind: r.Filter, CloseSSH: r.CloseSSH}
	}
	in := &checkInputs{snap: &would, sshPorts: ssh, listeners: map[string][]inventory.Found{}}
	for _, f := range found {
		switch f.Kind {
		case "port":
			in.listeners[r.Node] = append(in.listeners[r.Node], f)
		case "service":
			if !slices.Contains(meshUnits, f.Name) {
				p.Units = append(p.Units, f.Name)
			}
		}
	}
	asConverged := node
	asConverged.Mode = inventory.Converged
	for _, l := range unmanagedListeners(in, asConverged) {
		p.Unmanaged = append(p.Unmanaged, listenerOf(l))
	}
	for _, l := range in.listeners[r.Node] {
		if loopbackOnly(l.Addresses) {
			p.Loopback = append(p.Loopback, listenerOf(l))
		}
	}
	for _, a := range snap.Assignments {
		if a.Node != r.Node {
			continue
		}
		for _, port := range snap.Manifests[a.Module][a.Version].Ports {
			p.Kept = append(p.Kept, fmt.Sprintf("%s %s %d (%s)", a.Module, port.Name, port.Port, exposeOr(port.Expose)))
		}
	}
	sort.Strings(p.Kept)
	if r.Filter != "" {
		// The snapshot and SSH ports read above: the filter previewed is
		// of the same mesh as the rest of the preview.
		fin, rs, err := filterFor(snap, ssh, r.Node, r.CloseSSH)
		if err != nil {
			return ConvergePreview{}, err
		}
		p.Ruleset = rs
		if !r.CloseSSH {
			p.SSHPort = fin.SSHPort
			_, p.SSHReported = ssh[r.Node]
			if p.SSHPort == 0 {
				p.SSHPort = nftables.DefaultSSHPort
			}
		}
	}
	p.Does = convergeDoes(p)
	p.Digest = convergeDigest(p)
	return p, nil
}

// meshUnits are the mesh's own services: not something beside it.
var meshUnits = []string{"mesh-host.service", "mesh-controller.service"}

// exposeOr is a port's exposure, local when the manifest says none.
func exposeOr(e string) string {
	if e == "" {
		return "local"
	}
	return e
}

func listenerOf(f inventory.Found) Listener {
	l := Listener{Name: f.Name, Addresses: f.Addresses, Commands: f.Commands, Detail: f.Detail}
	if l.Addresses == nil {
		l.Addresses = []string{}
	}
	if l.Commands == nil {
		l.Commands = []string{}
	}
	return l
}

// convergeDoes says what converging will do, in order, in words.
func convergeDoes(p ConvergePreview) []string {
	var does []string
	if p.Mode != string(inventory.Converged) {
		does = append(does, fmt.Sprintf("make %s converged: the mesh's whole; what no module declares is no longer kept", p.Node))
	}
	switch {
	case p.ToFilter != "" && p.Filter == "":
		does = append(does, fmt.Sprintf("send its host the %s filter below, applied atomically in a table of the mesh's own (inet mesh; other tables untouched), the table before it kept; rolled back by the host itself if it cannot hear the controller within 60 s", p.ToFilter))
	case p.ToFilter != "":
		does = append(does, fmt.Sprintf("send its host the %s filter below in place of the mesh's one, rolled back by the host itself if it cannot hear the controller within 60 s", p.ToFilter))
	case p.Filter != "":
		does = append(does, fmt.Sprintf("remove the mesh's %s filter there (its table only)", p.Filter))
	}
	switch {
	case p.ToFilter != "" && p.ToCloseSSH:
		does = append(does, "close the SSH port too (--close-ssh): reach the node another way, or lose it")
	case p.ToFilter != "" && p.SSHReported:
		does = append(does, fmt.Sprintf("keep SSH open on tcp/%d, where its host saw sshd listening (--close-ssh closes it)", p.SSHPort))
	case p.ToFilter != "":
		does = append(does, fmt.Sprintf("keep SSH open on tcp/%d, the default: its host saw no sshd listening (--close-ssh closes it)", p.SSHPort))
	}
	for _, l := range p.Unmanaged {
		then := "raised as node.unmanaged-listener until it stops or a module declares it"
		if p.ToFilter != "" {
			then = "closed by the filter, and " + then
		}
		does = append(does, fmt.Sprintf("no longer keep %s at %s (%s): %s; the mesh does not stop it", l.Name, strings.Join(l.Addresses, " "), HeldBy(l.Commands), then))
	}
	if len(p.Units) > 0 {
		does = append(does, fmt.Sprintf("leave the %d active services no module declares running (%s): the mesh neither stops nor keeps them; take what matters as modules first", len(p.Units), strings.Join(p.Units, ", ")))
	}
	return does
}

// convergeState is what a converge preview says of the node, by what it is
// about: the digest is over it, and two previews' changes are told from it.
func convergeState(p ConvergePreview) map[string]string {
	s := map[string]string{
		"mode":   p.Mode,
		"filter": fmt.Sprintf("%q (close ssh %v)", p.Filter, p.CloseSSH),
		"to":     fmt.Sprintf("%q (close ssh %v)", p.ToFilter, p.ToCloseSSH),
		"ssh":    fmt.Sprintf("%d (seen %v)", p.SSHPort, p.SSHReported),
	}
	for _, k := range p.Kept {
		s["declared "+k] = "kept"
	}
	for _, l := range p.Unmanaged {
		s["listener "+l.Name] = fmt.Sprintf("at %s, %s", strings.Join(l.Addresses, " "), HeldBy(l.Commands))
	}
	for _, u := range p.Units {
		s["unit "+u] = "active"
	}
	if p.Ruleset != "" {
		sum := sha256.Sum256([]byte(p.Ruleset))
		s["ruleset"] = hex.EncodeToString(sum[:])[:takeDigestLen]
	}
	return s
}

// convergeDigest is the first takeDigestLen hex characters of the sha256
// of the preview's canonical JSON: node, state, what it does, the ruleset.
func convergeDigest(p ConvergePreview) string {
	b, err := protocol.Canonical(map[string]any{"node": p.Node, "state": convergeState(p), "does": p.Does, "ruleset": p.Ruleset})
	if err != nil {
		panic(err) // strings always marshal
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:takeDigestLen]
}

// convergeChanges says what differs between the preview approved and now.
func convergeChanges(old, now ConvergePreview) []string {
	out := stateChanges(convergeState(old), convergeState(now), func(string) string { return "not there" })
	if len(out) == 0 {
		out = append(out, "what it would do")
	}
	return out
}
