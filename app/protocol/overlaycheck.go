package protocol

import (
	"encoding/base64"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// The rules a host judges a declared overlay by, here so that the
// controller judges each node's overlay part by the very same before it
// declares it: one node's bad facts (a key another node holds, say) then
// cost that node its place among the peers, never every other host its
// whole declaration.

// wireGuardKeyLen is the length of a WireGuard key in base64: 32 bytes,
// padded.
const wireGuardKeyLen = 44

// strictBase64 refuses a key whose last character carries stray bits: two
// spellings of one key would otherwise be two keys to a comparison.
var strictBase64 = base64.StdEncoding.Strict()

// ValidWireGuardKey says whether s is a WireGuard key as wg(8) writes one:
// base64 of 32 bytes in its one spelling (44 characters, padded, no stray
// bits, no line breaks), so that equal keys are equal strings.
func ValidWireGuardKey(s string) bool {
	if len(s) != wireGuardKeyLen {
		return false
	}
	var b [wireGuardKeyLen]byte
	n, err := strictBase64.Decode(b[:], []byte(s))
	return err == nil && n == 32
}

// OverlayRefusal is one thing a host refuses of a declared overlay.
type OverlayRefusal struct {
	// Peer is the index of the peer refused; -1: the overlay whole.
	Peer int
	// Node is the refused peer's node, "" for the whole.
	Node string
	// Why is one line, as CheckOverlay says it.
	Why string
}

// OverlayRefusals lists what a host whose WireGuard public key is
// ownPublic ("" for none yet) refuses of a declared overlay: the whole
// (one refusal, Peer -1) or each peer it refuses. A peer that repeats an
// earlier peer's node or key is the one refused, the earlier kept, and a
// peer refused for itself is not counted as seen: the overlay less every
// peer refused is one CheckOverlay passes.
func OverlayRefusals(o *DeclaredOverlay, ownPublic string) []OverlayRefusal {
	if o == nil {
		return nil
	}
	if why := overlayWhole(o); why != "" {
		return []OverlayRefusal{{Peer: -1, Why: why}}
	}
	var out []OverlayRefusal
	nodes := make(map[string]string, len(o.Peers))
	keys := make(map[string]string, len(o.Peers))
	for i, p := range o.Peers {
		why := peerProblem(p)
		switch {
		case why != "":
		case ownPublic != "" && p.PublicKey == ownPublic:
			why = "the public key is this host's own"
		case nodes[p.Node] != "":
			why = fmt.Sprintf("repeated (its node %s is %s's too)", p.Node, nodes[p.Node])
		case keys[p.PublicKey] != "":
			why = fmt.Sprintf("repeated (its key %s is %s's too)", p.PublicKey, keys[p.PublicKey])
		default:
			nodes[p.Node], keys[p.PublicKey] = p.Node, p.Node
			continue
		}
		name := p.Node
		if name == "" {
			name = p.PublicKey
		}
		out = append(out, OverlayRefusal{Peer: i, Node: p.Node, Why: "peer " + name + ": " + why})
	}
	return out
}

// CheckOverlay says why a host whose WireGuard public key is ownPublic
// ("" for none yet) refuses a declared overlay, in one line, or nil: the
// first of OverlayRefusals. A host refuses its whole declaration with it,
// before any of it is applied.
func CheckOverlay(o *DeclaredOverlay, ownPublic string) error {
	if rs := OverlayRefusals(o, ownPublic); len(rs) > 0 {
		return fmt.Errorf("%s", rs[0].Why)
	}
	return nil
}

// AcceptedOverlay is what of a declared overlay a host whose WireGuard
// public key is ownPublic accepts, and what it refuses: o itself when
// nothing is refused, a copy less the peers refused otherwise, nil when
// the whole is.
func AcceptedOverlay(o *DeclaredOverlay, ownPublic string) (*DeclaredOverlay, []OverlayRefusal) {
	rs := OverlayRefusals(o, ownPublic)
	switch {
	case len(rs) == 0:
		return o, nil
	case rs[0].Peer < 0:
		return nil, rs
	}
	kept := *o
	kept.Peers = make([]DeclaredPeer, 0, len(o.Peers)-len(rs))
	next := 0
	for i, p := range o.Peers {
		if next < len(rs) && rs[next].Peer == i {
			next++
			continue
		}
		kept.Peers = append(kept.Peers, p)
	}
	return &kept, rs
}

// overlayWhole says why an overlay is refused whole, "" if it is not.
func overlayWhole(o *DeclaredOverlay) string {
	if o.Interface != "" && o.Interface != OverlayInterface {
		return fmt.Sprintf("interface %q is not %s", o.Interface, OverlayInterface)
	}
	if o.Address4 == "" && o.Address6 == "" {
		return "no address"
	}
	for _, a := range []struct {
		s  string
		v4 bool
	}{{o.Address4, true}, {o.Address6, false}} {
		if a.s == "" {
			continue
		}
		if p, err := netip.ParsePrefix(a.s); err != nil || p.Addr().Is4() != a.v4 {
			v := "6"
			if a.v4 {
				v = "4"
			}
			return fmt.Sprintf("address %q is not an IPv%s prefix", a.s, v)
		}
	}
	if o.ListenPort < 0 || o.ListenPort > 65535 {
		return fmt.Sprintf("listen port %d is not a port", o.ListenPort)
	}
	return ""
}

// splitHostPort splits host:port or [host]:port as net.SplitHostPort
// does, without the net package: messages take no network (the layout
// test).
func splitHostPort(s string) (host, port string, ok bool) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return "", "", false
	}
	host, port = s[:i], s[i+1:]
	if strings.HasPrefix(host, "[") {
		if !strings.HasSuffix(host, "]") {
			return "", "", false
		}
		host = host[1 : len(host)-1]
	}
	if strings.ContainsAny(host, "[]") || (strings.Contains(host, ":") && !strings.HasPrefix(s, "[")) {
		return "", "", false
	}
	return host, port, true
}

// peerProblem says what is wrong with a peer by itself, "" if nothing.
func peerProblem(p DeclaredPeer) string {
	if !ValidWireGuardKey(p.PublicKey) {
		return fmt.Sprintf("public key %q is not base64 of 32 bytes, as wg(8) writes one", p.PublicKey)
	}
	if p.Node == "" {
		return "no node name"
	}
	if p.Endpoint != "" {
		host, port, ok := splitHostPort(p.Endpoint)
		if n, perr := strconv.Atoi(port); !ok || host == "" || perr != nil || n < 1 || n > 65535 {
			return fmt.Sprintf("endpoint %q is not host:port", p.Endpoint)
		}
	}
	if len(p.AllowedIPs) == 0 {
		return "no allowed IPs"
	}
	for _, a := range p.AllowedIPs {
		if _, err := netip.ParsePrefix(a); err != nil {
			return fmt.Sprintf("allowed IP %q is not a prefix", a)
		}
	}
	if p.Keepalive < 0 || p.Keepalive > 65535 {
		return fmt.Sprintf("keepalive %d is not seconds WireGuard takes", p.Keepalive)
	}
	return ""
}
