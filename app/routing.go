package app

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"

	"mesh-controller/app/nftables"
	"mesh-controller/app/overlay"
	"mesh-controller/app/plan"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/inventory"
)

// RoutingView is what a node routes, as node public-domain and node
// networks show it.
type RoutingView struct {
	Node string `json:"node"`
	// PublicDomain is "" when it has none: its public ports are closed.
	PublicDomain string `json:"public_domain"`
	// Networks are the networks it routes for what it hosts, in order.
	Networks []string `json:"networks"`
	// Changed says the act changed it (and so moved the node's plan).
	Changed bool `json:"changed"`
	// Pushed is the declaration the change made.
	Pushed []Pushed `json:"pushed,omitempty"`
}

// NodeRouting shows what a node routes.
func (c *Nodes) NodeRouting(ctx context.Context, node string) (RoutingView, error) {
	if err := CheckName(node); err != nil {
		return RoutingView{}, err
	}
	st, err := c.stores(ctx)
	if err != nil {
		return RoutingView{}, err
	}
	rt, err := st.Inventory.Routing(ctx, node)
	if err != nil {
		return RoutingView{}, err
	}
	return RoutingView{Node: node, PublicDomain: rt.PublicDomain, Networks: rt.Networks}, nil
}

// SetPublicDomain sets the domain a node's routed names are composed under
// ("" clears it) after judging it (protocol.CheckDomain). A change moves
// the node's plan in the same transaction, then declares it.
func (c *Nodes) SetPublicDomain(ctx context.Context, node, domain string) (RoutingView, error) {
	if err := CheckName(node); err != nil {
		return RoutingView{}, err
	}
	if domain != "" {
		if err := protocol.CheckDomain(domain); err != nil {
			return RoutingView{}, err
		}
	}
	return c.changeRouting(ctx, node, func(st *Stores) (bool, error) { return st.Inventory.SetPublicDomain(ctx, node, domain) })
}

// SetNetworks sets the networks a node routes (none clears them) after
// judging them together (protocol.CheckNetworks); they are kept and
// declared in the mesh's order. A change moves the node's plan and
// declares it, as SetPublicDomain does.
func (c *Nodes) SetNetworks(ctx context.Context, node string, networks []string) (RoutingView, error) {
	if err := CheckName(node); err != nil {
		return RoutingView{}, err
	}
	if err := c.outsideMeshOverlay(ctx, networks); err != nil {
		return RoutingView{}, err
	}
	prefixes, err := protocol.CheckNetworks(networks)
	if err != nil {
		return RoutingView{}, err
	}
	kept := make([]string, len(prefixes))
	for i, p := range prefixes {
		kept[i] = p.String()
	}
	return c.changeRouting(ctx, node, func(st *Stores) (bool, error) { return st.Inventory.SetNetworks(ctx, node, kept) })
}

// outsideMeshOverlay refuses a network that overlaps the mesh's own ULA
// prefix, naming it (protocol.CheckNetworks refuses all of fd00::/8, but
// the mesh's /48 is what a person can look up in overlay show).
func (c uses) outsideMeshOverlay(ctx context.Context, networks []string) error {
	st, err := c.stores(ctx)
	if err != nil {
		return err
	}
	prefix, err := st.Inventory.OverlayPrefix(ctx)
	if err != nil {
		return err
	}
	mesh, err := netip.ParsePrefix(prefix)
	if err != nil {
		return nil // no prefix made yet: nothing of the mesh's to clash with
	}
	for _, n := range networks {
		if p, err := protocol.ParseNetwork(n); err == nil && p.Overlaps(mesh) {
			return fmt.Errorf("%s %w (the mesh's own %s): the mesh's private network gives its nodes addresses there", p, protocol.ErrOverlapsOverlay, mesh)
		}
	}
	return nil
}

// changeRouting makes one routing change and, if it changed anything,
// declares the node's plan.
func (c uses) changeRouting(ctx context.Context, node string, set func(*Stores) (bool, error)) (RoutingView, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return RoutingView{}, err
	}
	changed, err := set(st)
	if err != nil {
		return RoutingView{}, err
	}
	rt, err := st.Inventory.Routing(ctx, node)
	if err != nil {
		return RoutingView{}, err
	}
	v := RoutingView{Node: node, PublicDomain: rt.PublicDomain, Networks: rt.Networks, Changed: changed}
	if changed {
		v.Pushed, err = c.sendPlans(ctx, st, []string{node})
	}
	return v, err
}

// FilterFor computes the packet filter the mesh would own on a node, from
// the node's plan as it stands (its modules' declared ports and their
// exposures, its public domain, its networks) and the SSH port its host
// reported (the fact protocol.FactSSHPort; nftables.DefaultSSHPort when it
// reported none), kept open unless closeSSH. Ports exposed to the overlay
// are open to it once the node has an overlay part. It returns the renderer's input and
// the ruleset rendered from it: what a declaration would carry.
func (c *Nodes) FilterFor(ctx context.Context, node string, closeSSH bool) (nftables.Input, string, error) {
	if err := CheckName(node); err != nil {
		return nftables.Input{}, "", err
	}
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return nftables.Input{}, "", err
	}
	ssh, err := sshPorts(ctx, st.Inventory)
	if err != nil {
		return nftables.Input{}, "", err
	}
	return filterFor(snap, ssh, node, closeSSH)
}

// filterFor is FilterFor on a snapshot and SSH ports already read.
func filterFor(snap *inventory.Snapshot, ssh map[string]int, node string, closeSSH bool) (nftables.Input, string, error) {
	// Secrets and broker users do not shape a filter: the plan is made
	// without their sealed copies, and without a filter of its own.
	p, err := plan.New(snap, nil).Plan(node)
	if err != nil {
		return nftables.Input{}, "", err
	}
	in := filterInput(p.Body, closeSSH, ssh)
	return in, nftables.Render(in), nil
}

// sshPorts are the SSH ports the hosts reported (protocol.FactSSHPort), by
// node; a node that reported none (or nonsense) is not in it.
func sshPorts(ctx context.Context, inv *inventory.Store) (map[string]int, error) {
	facts, err := inv.FactNamed(ctx, protocol.FactSSHPort)
	if err != nil {
		return nil, err
	}
	out := make(map[string]int, len(facts))
	for node, f := range facts {
		if port, err := strconv.Atoi(f.Value); err == nil && port > 0 && port < 65536 {
			out[node] = port
		}
	}
	return out, nil
}

// filterInput is FilterInput with the SSH port the node reported, if any.
func filterInput(d protocol.Declaration, closeSSH bool, ssh map[string]int) nftables.Input {
	in := FilterInput(d, closeSSH)
	if port, ok := ssh[d.Node]; ok {
		in.SSHPort = port
	}
	return in
}

// filterRender renders a node's packet filter from the rest of its plan
// and the SSH ports the hosts reported: what the planner declares.
func filterRender(ssh map[string]int) plan.FilterRender {
	return func(body protocol.Declaration, f inventory.Filter) (string, error) {
		if f.Kind != inventory.FilterNftables {
			return "", fmt.Errorf("no renderer for a %s filter", f.Kind)
		}
		return nftables.Render(filterInput(body, f.CloseSSH, ssh)), nil
	}
}

// FilterInput is the renderer's input for a declaration: its modules'
// ports, its public domain and networks, the SSH port left at its default
// (FilterFor fills in the one the host reported), and its overlay part:
// ports exposed to the overlay open to the overlay's prefixes, its
// WireGuard port, and on a relay forwarding between overlay nodes.
func FilterInput(d protocol.Declaration, closeSSH bool) nftables.Input {
	in := nftables.Input{Node: d.Node, PublicDomain: d.PublicDomain, CloseSSH: closeSSH,
		Overlay: overlay.Prefixes(d.Overlay), OverlayRelay: overlay.Relays(d.Overlay)}
	if d.Overlay != nil {
		in.OverlayPort = d.Overlay.ListenPort
	}
	for _, m := range d.Modules {
		for _, p := range m.Ports {
			in.Ports = append(in.Ports, nftables.Port{Module: m.Module, Name: p.Name, Port: p.Port, Expose: p.Expose})
		}
	}
	for _, n := range d.Networks {
		// Judged before they were kept; one that does not parse is not forwarded.
		if pfx, err := netip.ParsePrefix(n); err == nil {
			in.Networks = append(in.Networks, pfx)
		}
	}
	return in
}
