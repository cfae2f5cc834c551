// Package overlay computes the mesh's private network: each node's overlay
// addresses and WireGuard peers (its declaration's overlay part), and the
// mesh's view of it (overlay show), from where each node is and how it is
// reached. It is a pure function of what the inventory keeps: no store, no
// network, the same input giving the same output.
package overlay

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	"mesh-controller/app/protocol"
	"mesh-controller/contexts/inventory"
)

// Prefix4 is the overlay's IPv4 prefix (RFC 6598 shared address space),
// the same in every mesh: a node's IPv4 address is it plus its index.
var Prefix4 = netip.MustParsePrefix("100.64.0.0/10")

// maxIndex is the highest index with an IPv4 address in Prefix4 (its last
// address, broadcast-like, is not given).
const maxIndex = 1<<22 - 2

// RelayWhy says why the relay was picked.
const RelayWhy = "the first public node by name"

// Ways a pair of nodes is joined.
const (
	Direct  = "direct"
	ByRelay = "relay"
	Missing = "missing"
)

// Node is one node in the mesh's view.
type Node struct {
	Node     string `json:"node"`
	Address4 string `json:"address4,omitempty"`
	Address6 string `json:"address6,omitempty"`
	Endpoint string `json:"endpoint,omitempty"`
	Site     string `json:"site,omitempty"`
	// Reach is public, behind-nat, or "" when not placed (treated as
	// behind NAT with no site).
	Reach string `json:"reach"`
	// Key says its host reported a WireGuard key that parses.
	Key bool `json:"key"`
	// Peers are its declared peers; none when it has no overlay part.
	Peers []protocol.DeclaredPeer `json:"peers"`
	// Missing says what keeps it, or some of its pairs, out of the overlay.
	Missing []string `json:"missing,omitempty"`
}

// Mesh is the overlay as computed.
type Mesh struct {
	Prefix4 string `json:"prefix4"`
	Prefix6 string `json:"prefix6"`
	// Relay is the node NAT'd nodes on different sites reach each other
	// through, "" for none; RelayWhy says why it was picked.
	Relay    string `json:"relay,omitempty"`
	RelayWhy string `json:"relay_why,omitempty"`
	Nodes    []Node `json:"nodes"`
	// Declared is each node's overlay part, by node; a node without a key
	// (or an address), or whose key another node holds, has none.
	Declared map[string]*protocol.DeclaredOverlay `json:"-"`
	// Conflicts are the nodes whose hosts reported a WireGuard key another
	// node holds: left out of the overlay, the holder keeping it.
	Conflicts []KeyConflict `json:"conflicts,omitempty"`
	// keys are the members' WireGuard keys, by node: what Accepted judges
	// each part with.
	keys map[string]string
}

// KeyConflict is a node whose host reported the WireGuard key another
// node, Holder, holds.
type KeyConflict struct {
	Node   string `json:"node"`
	Holder string `json:"holder"`
	Key    string `json:"key"`
}

// Refused is what of a node's overlay part its host would refuse, and
// why: a peer, or the part whole (Peer "").
type Refused struct {
	Node string `json:"node"`
	Peer string `json:"peer,omitempty"`
	Why  string `json:"why"`
}

// member is a node that takes part: it has a key and addresses.
type member struct {
	name, key string
	a4, a6    string // own addresses, /32 and /128
	// own is []string{a4, a6}, shared by every peer entry for the node:
	// full to its capacity, so a relay's entry appending to it copies.
	own            []string
	endpoint, site string
	public         bool
	at             int // index in Mesh.Nodes
}

// Compute computes the overlay from what the inventory keeps. A node takes
// part once its host reported a key that parses and it has an address,
// and no node recorded before it holds the same key (the store refuses a
// key held already, so two holders are only ever found in records written
// behind it: the later node is left out, a Conflict).
// Pairs: both public, or on the same site: direct. A node behind NAT
// reaches the others through the relay, a public node the mesh picks: it
// peers with the relay directly, dialling it with a keepalive, and the
// relay forwards between it and every other node. (The relay is one for
// the whole mesh: every NAT'd node is reached the same way, and a public
// node reaches them through it.)
func Compute(o inventory.Overlay) Mesh {
	m := Mesh{Prefix4: Prefix4.String(), Prefix6: o.Prefix6, Declared: map[string]*protocol.DeclaredOverlay{}, Nodes: make([]Node, 0, len(o.Nodes)),
		keys: map[string]string{}}
	p6, err6 := netip.ParsePrefix(o.Prefix6)
	if err6 == nil {
		// A prefix made before it was written as netip writes it
		// ("fd34:0506:…") is compared as netip writes it.
		m.Prefix6 = p6.String()
	}
	nodes := append([]inventory.OverlayNode(nil), o.Nodes...)
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
	holders := keyHolders(nodes)
	var members []*member
	for _, n := range nodes {
		v := Node{Node: n.Name, Endpoint: n.Placement.Endpoint, Site: n.Placement.Site, Reach: string(n.Placement.Reach), Peers: []protocol.DeclaredPeer{}}
		if v.Reach == "" {
			v.Missing = append(v.Missing, "not placed: treated as behind NAT with no site (overlay place "+n.Name+")")
		}
		a4, a6, ok := addresses(p6, n.Index)
		switch {
		case err6 != nil:
			v.Missing = append(v.Missing, "the mesh has no overlay prefix yet (run migrate)")
		case !ok:
			v.Missing = append(v.Missing, fmt.Sprintf("no address: index %d is past the overlay's %d", n.Index, maxIndex))
		default:
			v.Address4, v.Address6 = a4.String()+"/10", a6.String()+"/48"
		}
		switch {
		case n.Key == "":
			v.Missing = append(v.Missing, "no WireGuard key: its host has not reported one")
		case !protocol.ValidWireGuardKey(n.Key):
			v.Missing = append(v.Missing, "its host's WireGuard key does not parse")
		case holders[n.Key] != n.Name:
			h := holders[n.Key]
			v.Missing = append(v.Missing, fmt.Sprintf("its host reported the WireGuard key %s holds: left out of the overlay, %s keeps it", h, h))
			m.Conflicts = append(m.Conflicts, KeyConflict{Node: n.Name, Holder: h, Key: n.Key})
		default:
			v.Key = true
		}
		m.Nodes = append(m.Nodes, v)
		if v.Key && v.Address4 != "" {
			mb := &member{name: n.Name, key: n.Key, a4: a4.String() + "/32", a6: a6.String() + "/128",
				endpoint: n.Placement.Endpoint, site: n.Placement.Site, public: n.Placement.Reach == inventory.Public, at: len(m.Nodes) - 1}
			mb.own = []string{mb.a4, mb.a6}
			members = append(members, mb)
			m.keys[n.Name] = n.Key
		}
	}
	var relay *member
	for _, mb := range members {
		if mb.public {
			relay = mb
			break
		}
	}
	if relay != nil {
		m.Relay, m.RelayWhy = relay.name, RelayWhy
	}
	for _, mb := range members {
		m.Declared[mb.name] = &protocol.DeclaredOverlay{Interface: protocol.OverlayInterface,
			Address4: m.Nodes[mb.at].Address4, Address6: m.Nodes[mb.at].Address6, ListenPort: listenPort(mb.endpoint),
			Peers: make([]protocol.DeclaredPeer, 0, len(members)-1)}
	}
	// relayed[a] are the nodes a reaches through the relay; unreachable[a]
	// those it cannot reach at all.
	relayed := map[string][]string{}
	unreachable := map[string][]string{}
	for i, a := range members {
		da := m.Declared[a.name]
		for j, b := range members {
			if i == j {
				continue
			}
			switch {
			case a.public && b.public, a.site != "" && a.site == b.site:
				if a.endpoint == "" && b.endpoint == "" {
					unreachable[a.name] = append(unreachable[a.name], b.name)
					continue
				}
				da.Peers = append(da.Peers, peer(b, b.endpoint, 0))
			case a == relay:
				// b is behind NAT: it dials the relay, which answers where
				// it heard b.
				da.Peers = append(da.Peers, peer(b, "", 0))
			case b == relay:
				da.Peers = append(da.Peers, peer(b, b.endpoint, protocol.OverlayKeepalive))
			case relay == nil:
				unreachable[a.name] = append(unreachable[a.name], b.name)
			default:
				relayed[a.name] = append(relayed[a.name], b.name)
			}
		}
	}
	byName := make(map[string]*member, len(members))
	for _, mb := range members {
		byName[mb.name] = mb
	}
	if relay != nil {
		dr := m.Declared[relay.name]
		for _, a := range members {
			via := relayed[a.name]
			if len(via) == 0 {
				continue
			}
			da := m.Declared[a.name]
			for k := range da.Peers {
				if da.Peers[k].Node != relay.name {
					continue
				}
				da.Peers[k].Via = via
				for _, v := range via {
					da.Peers[k].AllowedIPs = append(da.Peers[k].AllowedIPs, byName[v].a4, byName[v].a6)
				}
			}
			for k := range dr.Peers {
				if dr.Peers[k].Node == a.name {
					dr.Peers[k].Relays = true
				}
			}
		}
	}
	for _, mb := range members {
		v := &m.Nodes[mb.at]
		v.Peers = m.Declared[mb.name].Peers
		if u := unreachable[mb.name]; len(u) > 0 {
			v.Missing = append(v.Missing, unreachableWhy(mb, u, byName))
		}
	}
	return m
}

// keyHolders are the nodes holding each valid key: of the nodes that
// reported one key, the one recorded first (the lowest index; the first
// by name of equal ones).
func keyHolders(nodes []inventory.OverlayNode) map[string]string {
	out := make(map[string]string, len(nodes))
	index := make(map[string]int64, len(nodes))
	for _, n := range nodes {
		if n.Key == "" {
			continue
		}
		if i, ok := index[n.Key]; !ok || n.Index < i {
			out[n.Key], index[n.Key] = n.Name, n.Index
		}
	}
	return out
}

// Accepted is a node's overlay part as its host accepts it, judged by the
// rules the host judges it by (protocol.AcceptedOverlay, with the node's
// own key), and what of it the host would refuse: a host refuses its
// declaration whole for one bad peer, so the planner declares only what
// is accepted, and one node's bad record costs that node its place among
// the peers, never another node its declaration. Nil: the node has no
// part, or none its host would accept. None is refused while the overlay
// is computed from sound records; judging every part costs as much again
// as computing them, and so is done only for the parts declared (and by
// the self-check).
func (m *Mesh) Accepted(node string) (*protocol.DeclaredOverlay, []Refused) {
	kept, rs := protocol.AcceptedOverlay(m.Declared[node], m.keys[node])
	var out []Refused
	for _, r := range rs {
		out = append(out, Refused{Node: node, Peer: r.Node, Why: r.Why})
	}
	return kept, out
}

// unreachableWhy says why a node cannot reach some others.
func unreachableWhy(a *member, others []string, byName map[string]*member) string {
	var sameSite, nat []string
	for _, b := range others {
		if a.site != "" && byName[b].site == a.site {
			sameSite = append(sameSite, b)
		} else {
			nat = append(nat, b)
		}
	}
	var out []string
	if len(nat) > 0 {
		out = append(out, fmt.Sprintf("cannot reach %s: both behind NAT, not on one site, and no public node to relay through", some(nat)))
	}
	if len(sameSite) > 0 {
		out = append(out, fmt.Sprintf("cannot reach %s: neither has an endpoint (overlay place --endpoint)", some(sameSite)))
	}
	return strings.Join(out, "; ")
}

// some names a few nodes, and how many more: a message stays short in a
// large mesh.
func some(names []string) string {
	if len(names) <= 5 {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:5], ", "), len(names)-5)
}

func peer(b *member, endpoint string, keepalive int) protocol.DeclaredPeer {
	return protocol.DeclaredPeer{Node: b.name, PublicKey: b.key, Endpoint: endpoint, AllowedIPs: b.own[:2:2], Keepalive: keepalive}
}

// listenPort is the port of a node's endpoint, or protocol.OverlayPort:
// the port it is dialled on is the one it listens on, whether its peers
// are anywhere (public) or on its own site.
func listenPort(endpoint string) int {
	if _, port, err := net.SplitHostPort(endpoint); err == nil {
		if p, err := strconv.Atoi(port); err == nil && p > 0 && p < 65536 {
			return p
		}
	}
	return protocol.OverlayPort
}

// addresses are a node's overlay addresses: the prefixes plus its index.
func addresses(p6 netip.Prefix, index int64) (a4, a6 netip.Addr, ok bool) {
	if index < 1 || index > maxIndex || !p6.IsValid() {
		return netip.Addr{}, netip.Addr{}, false
	}
	b4 := Prefix4.Addr().As4()
	v := uint32(b4[0])<<24 | uint32(b4[1])<<16 | uint32(b4[2])<<8 | uint32(b4[3])
	v += uint32(index)
	a4 = netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	b6 := p6.Masked().Addr().As16()
	for i := 15; i >= 12; i-- {
		b6[i] = byte(index >> (8 * (15 - i)))
	}
	return a4, netip.AddrFrom16(b6), true
}

// Prefixes are the overlay's two prefixes, as a declaration's overlay part
// names them (its addresses with the overlay's prefix lengths): what the
// packet filter opens overlay ports to. None for none.
func Prefixes(d *protocol.DeclaredOverlay) []netip.Prefix {
	if d == nil {
		return nil
	}
	var out []netip.Prefix
	for _, a := range []string{d.Address4, d.Address6} {
		if p, err := netip.ParsePrefix(a); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}

// Relays says the node relays for some of its peers.
func Relays(d *protocol.DeclaredOverlay) bool {
	if d == nil {
		return false
	}
	for _, p := range d.Peers {
		if p.Relays {
			return true
		}
	}
	return false
}

// Moved are the nodes whose overlay part differs between two computations
// of the overlay, by name: those whose plans an act moves.
func Moved(before, after Mesh) []string {
	var out []string
	for _, n := range after.Nodes {
		a, b := before.Declared[n.Node], after.Declared[n.Node]
		if (a == nil) != (b == nil) {
			out = append(out, n.Node)
			continue
		}
		if a == nil {
			continue
		}
		if !equal(a, b) {
			out = append(out, n.Node)
		}
	}
	return out
}

// equal says two overlay parts declare the same.
func equal(a, b *protocol.DeclaredOverlay) bool {
	return a.Interface == b.Interface && a.Address4 == b.Address4 && a.Address6 == b.Address6 && a.ListenPort == b.ListenPort &&
		slices.EqualFunc(a.Peers, b.Peers, func(p, q protocol.DeclaredPeer) bool {
			return p.Node == q.Node && p.PublicKey == q.PublicKey && p.Endpoint == q.Endpoint && p.Keepalive == q.Keepalive &&
				p.Relays == q.Relays && slices.Equal(p.AllowedIPs, q.AllowedIPs) && slices.Equal(p.Via, q.Via)
		})
}
