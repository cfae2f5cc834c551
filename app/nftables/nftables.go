// Package nftables renders the packet filter the mesh owns on a converged
// node as an nftables ruleset (the text 'nft -f' reads): a table of the
// mesh's own, inet mesh, which the ruleset replaces atomically and which
// never touches another table. It does no I/O: the same input renders the
// same bytes, so a preview's digest can cover it.
package nftables

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"mesh-controller/app/protocol"
)

// Table is the mesh's own table: the only one a rendered ruleset names.
const Table = "inet mesh"

// DefaultSSHPort is the port kept open for SSH when the node reports none.
const DefaultSSHPort = 22

// Exposures of a port, as its module's manifest says (manifest.md).
const (
	// Local: from the node itself only (loopback).
	Local = "local"
	// Overlay: from the mesh's private network only: its interface and
	// its addresses both.
	Overlay = "overlay"
	// Public: from anyone, on a node with a public domain.
	Public = "public"
)

// Input is what a node's filter is rendered from.
type Input struct {
	// Node names the node, in the ruleset's first comment.
	Node string
	// Ports are its modules' declared ports.
	Ports []Port
	// PublicDomain is the node's public domain; none closes its public ports.
	PublicDomain string
	// Networks are the networks it routes for what it hosts: forwarded.
	Networks []netip.Prefix
	// Overlay are the overlay's addresses its overlay ports accept from,
	// and only on the overlay's interface (protocol.OverlayInterface);
	// none (no overlay yet) closes them.
	Overlay []netip.Prefix
	// OverlayPort is the UDP port the node's WireGuard listens on, let in
	// from anywhere (its peers dial it); 0: the node has no overlay part.
	OverlayPort int
	// OverlayRelay says the node relays between overlay nodes behind NAT:
	// what comes in on the overlay's interface to another overlay address
	// is forwarded out of it again.
	OverlayRelay bool
	// SSHPort is the SSH port the node reports; 0 is DefaultSSHPort.
	SSHPort int
	// CloseSSH is a person's wish not to keep SSH open: never the default,
	// since a filter that locks its person out is the failure to prevent.
	CloseSSH bool
}

// Port is one declared port of one module.
type Port struct {
	Module string
	Name   string
	Port   int
	// Protocol is tcp or udp; "" is tcp.
	Protocol string
	// Expose is Local, Overlay or Public; "" is Local: a port is closed to
	// the network unless its manifest opens it.
	Expose string
}

// Replace is the nft script that applies a ruleset of the mesh's table:
// the table is made if missing (so that the delete cannot fail), deleted,
// and made again as the ruleset says, so that 'nft -f' replaces it whole
// in one transaction, whatever it held, and touches nothing else.
func Replace(ruleset string) string {
	return "table " + Table + "\ndelete table " + Table + "\n" + ruleset + "\n"
}

// icmpTypes are the ICMP messages a host needs answered or let in: being
// pinged, and the errors path MTU discovery and diagnosis depend on.
const icmpTypes = "echo-request, destination-unreachable, time-exceeded, parameter-problem"

// icmpv6Types are as icmpTypes for IPv6, with packet-too-big and neighbour
// discovery, without which IPv6 does not work at all on a link.
const icmpv6Types = "echo-request, destination-unreachable, packet-too-big, time-exceeded, parameter-problem, " +
	"nd-router-solicit, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert"

// Render writes the ruleset: the mesh's table alone, as a declaration
// carries it (a host refuses anything beside it); the host applies it
// with Replace.
func Render(in Input) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	node := in.Node
	if node == "" {
		node = "this node"
	}
	w("# The packet filter the mesh owns on %s: the table %s alone.", node, Table)
	w("# Made by mesh-controller; applied whole with 'nft -f', which replaces only this table.")
	w("table %s {", Table)
	w("\tchain input {")
	w("\t\ttype filter hook input priority filter; policy drop;")
	w("\t\tct state established,related accept")
	w("\t\tct state invalid drop")
	w("\t\tiifname \"lo\" accept comment \"loopback, and with it every local port\"")
	w("\t\tmeta l4proto icmp icmp type { %s } accept", icmpTypes)
	w("\t\tmeta l4proto ipv6-icmp icmpv6 type { %s } accept", icmpv6Types)
	ssh := in.SSHPort
	if ssh == 0 {
		ssh = DefaultSSHPort
	}
	if in.CloseSSH {
		w("\t\t# ssh (tcp %d): closed, as a person asked (--close-ssh)", ssh)
	} else {
		w("\t\ttcp dport %d accept comment \"ssh, kept open\"", ssh)
	}
	if in.OverlayPort > 0 && in.OverlayPort < 65536 {
		w("\t\tudp dport %d accept comment \"the overlay (WireGuard)\"", in.OverlayPort)
	}
	overlay := families(in.Overlay)
	for _, p := range sortedPorts(in.Ports) {
		proto := p.Protocol
		if proto == "" {
			proto = "tcp"
		}
		what := fmt.Sprintf("%s/%s (%s %d)", p.Module, p.Name, proto, p.Port)
		if proto != "tcp" && proto != "udp" || p.Port < 1 || p.Port > 65535 {
			w("\t\t# %s/%s: closed: not a tcp or udp port from 1 to 65535", p.Module, p.Name)
			continue
		}
		comment := fmt.Sprintf("comment %q", p.Module+"/"+p.Name)
		switch p.Expose {
		case Public:
			if in.PublicDomain == "" {
				w("\t\t# %s: public, closed: the node has no public domain", what)
				continue
			}
			w("\t\t%s dport %d accept %s", proto, p.Port, comment)
		case Overlay:
			if len(in.Overlay) == 0 {
				w("\t\t# %s: overlay, closed: the node has no overlay yet", what)
				continue
			}
			// The interface as well as the prefix: an overlay address is
			// no proof of the overlay, since a machine on the LAN can hold
			// one; only what WireGuard let in arrives on its interface.
			for _, fam := range overlay {
				w("\t\tiifname %q %s saddr %s %s dport %d accept %s", protocol.OverlayInterface, fam.ip, fam.set, proto, p.Port, comment)
			}
		default:
			w("\t\t# %s: local, from loopback only", what)
		}
	}
	w("\t}")
	w("")
	w("\tchain forward {")
	w("\t\ttype filter hook forward priority filter; policy drop;")
	w("\t\tct state established,related accept")
	w("\t\tct state invalid drop")
	if in.OverlayRelay && len(in.Overlay) > 0 {
		for _, fam := range overlay {
			w("\t\tiifname %q oifname %q %s saddr %s %s daddr %s accept comment \"the overlay: relayed between its nodes\"",
				protocol.OverlayInterface, protocol.OverlayInterface, fam.ip, fam.set, fam.ip, fam.set)
		}
	}
	nets := families(in.Networks)
	if len(nets) == 0 && !in.OverlayRelay {
		w("\t\t# the node routes no networks: nothing is forwarded")
	}
	for _, fam := range nets {
		w("\t\t%s daddr %s accept comment \"the node's networks\"", fam.ip, fam.set)
		w("\t\t%s saddr %s accept comment \"the node's networks\"", fam.ip, fam.set)
	}
	w("\t}")
	w("}")
	return b.String()
}

// sortedPorts orders ports by number, protocol, module and name, and
// drops exact repeats: the ruleset does not depend on the input's order.
func sortedPorts(ports []Port) []Port {
	out := slices.Clone(ports)
	key := func(p Port) string {
		return fmt.Sprintf("%05d %s %s %s %s", p.Port, p.Protocol, p.Module, p.Name, p.Expose)
	}
	slices.SortFunc(out, func(a, b Port) int { return strings.Compare(key(a), key(b)) })
	return slices.Compact(out)
}

// family is the prefixes of one address family, as a rule matches them.
type family struct {
	// ip is the family's word in a match: ip or ip6.
	ip string
	// set is its prefixes as an anonymous set.
	set string
}

// families are the prefixes' IPv4 and IPv6 families, those with any, in
// that order.
func families(ps []netip.Prefix) []family {
	v4, v6 := split(ps)
	var out []family
	for _, f := range []struct {
		ip   string
		nets []netip.Prefix
	}{{"ip", v4}, {"ip6", v6}} {
		if len(f.nets) > 0 {
			out = append(out, family{f.ip, set(f.nets)})
		}
	}
	return out
}

// split parts prefixes into IPv4 and IPv6, each masked, sorted and without
// repeats.
func split(ps []netip.Prefix) (v4, v6 []netip.Prefix) {
	for _, p := range ps {
		p = p.Masked()
		if p.Addr().Is4() {
			v4 = append(v4, p)
		} else {
			v6 = append(v6, p)
		}
	}
	for _, s := range []*[]netip.Prefix{&v4, &v6} {
		protocol.SortPrefixes(*s)
		*s = slices.Compact(*s)
	}
	return v4, v6
}

// set writes prefixes as an anonymous nftables set.
func set(ps []netip.Prefix) string {
	parts := make([]string, len(ps))
	for i, p := range ps {
		parts[i] = p.String()
	}
	return "{ " + strings.Join(parts, ", ") + " }"
}
