package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"mesh-controller/app/overlay"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/inventory"
)

// ErrBadEndpoint means an overlay endpoint is not host:port.
var ErrBadEndpoint = errors.New("is not an endpoint")

// ErrPublicNeedsEndpoint means a node was placed public without an endpoint
// to dial it at.
var ErrPublicNeedsEndpoint = errors.New("a public node needs an endpoint: its peers dial it there")

// CheckEndpoint judges an overlay endpoint: host:port, the port from 1 to
// 65535, the host an IP literal (IPv6 in brackets) or a DNS name judged
// as a public domain is (protocol.CheckDomain: at least two labels, lower
// case).
func CheckEndpoint(endpoint string) error {
	host, port, err := net.SplitHostPort(endpoint)
	if err != nil {
		return fmt.Errorf("%q %w: write it as host:port, such as 203.0.113.7:51820, [2001:db8::7]:51820 or gw.example.org:51820", endpoint, ErrBadEndpoint)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 || strconv.Itoa(p) != port {
		return fmt.Errorf("%q %w: its port must be a number from 1 to 65535", endpoint, ErrBadEndpoint)
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Zone() != "" {
			return fmt.Errorf("%q %w: an address with a zone is not reachable from elsewhere", endpoint, ErrBadEndpoint)
		}
		if a.Is6() && !strings.HasPrefix(endpoint, "[") {
			return fmt.Errorf("%q %w: write an IPv6 address in brackets", endpoint, ErrBadEndpoint)
		}
		return nil
	}
	// A name as a public domain is judged: peers on other machines resolve it.
	if err := protocol.CheckDomain(host); err != nil {
		_, why, _ := strings.Cut(err.Error(), protocol.ErrBadDomain.Error()+": ")
		return fmt.Errorf("%q %w: its host is neither an IP address nor a DNS name: %s", endpoint, ErrBadEndpoint, why)
	}
	return nil
}

// Placement is where overlay place puts a node.
type Placement struct {
	Endpoint string `json:"endpoint,omitempty"`
	Site     string `json:"site,omitempty"`
	// Public: dialled from anywhere at its endpoint; otherwise behind NAT.
	Public bool `json:"public"`
}

// Placed is what overlay place did.
type Placed struct {
	// Node is the node as the overlay now has it.
	Node overlay.Node `json:"node"`
	// Changed says the placement changed.
	Changed bool `json:"changed"`
	// Moved are the nodes whose overlay part changed (their plans moved);
	// none is omitted.
	Moved []string `json:"moved,omitempty"`
	// Relay is the mesh's relay after the act, and why.
	Relay    string   `json:"relay,omitempty"`
	RelayWhy string   `json:"relay_why,omitempty"`
	Pushed   []Pushed `json:"pushed,omitempty"`
}

// OverlayPlace records where a node is and how it is reached, replacing
// what was recorded, after judging it. In the same transaction it moves
// the plans of every node whose overlay part changes (a placement changes
// others' peers), then declares them.
func (c *Nodes) OverlayPlace(ctx context.Context, node string, p Placement) (Placed, error) {
	if err := CheckName(node); err != nil {
		return Placed{}, err
	}
	if p.Endpoint != "" {
		if err := CheckEndpoint(p.Endpoint); err != nil {
			return Placed{}, err
		}
	}
	if p.Site != "" {
		if err := CheckName(p.Site); err != nil {
			return Placed{}, fmt.Errorf("site %w", err)
		}
	}
	if p.Public && p.Endpoint == "" {
		return Placed{}, ErrPublicNeedsEndpoint
	}
	st, err := c.stores(ctx)
	if err != nil {
		return Placed{}, err
	}
	kept := inventory.Placement{Endpoint: p.Endpoint, Site: p.Site, Reach: inventory.BehindNAT}
	if p.Public {
		kept.Reach = inventory.Public
	}
	var moved []string
	changed, err := st.Inventory.SetPlacement(ctx, node, kept, func(before, after inventory.Overlay) []string {
		moved = overlay.Moved(overlay.Compute(before), overlay.Compute(after))
		return moved
	})
	if err != nil {
		return Placed{}, err
	}
	o, err := st.Inventory.ReadOverlay(ctx)
	if err != nil {
		return Placed{}, err
	}
	m := overlay.Compute(o)
	v := Placed{Changed: changed, Moved: moved, Relay: m.Relay, RelayWhy: m.RelayWhy}
	for _, n := range m.Nodes {
		if n.Node == node {
			v.Node = n
		}
	}
	if len(moved) > 0 {
		v.Pushed, err = c.sendPlans(ctx, st, moved)
	}
	return v, err
}

// OverlayShow computes the overlay as the mesh has it now.
func (c *Nodes) OverlayShow(ctx context.Context) (overlay.Mesh, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return overlay.Mesh{}, err
	}
	o, err := st.Inventory.ReadOverlay(ctx)
	if err != nil {
		return overlay.Mesh{}, err
	}
	return overlay.Compute(o), nil
}
