package protocol

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// OverlayRanges are the address ranges of the mesh's own private network:
// a node's routed networks never overlap them, so that an overlay address
// always means a node of the mesh.
var OverlayRanges = []netip.Prefix{netip.MustParsePrefix("100.64.0.0/10"), netip.MustParsePrefix("fd00::/8")}

// MaxNetworks bounds how many networks one node routes.
const MaxNetworks = 64

var (
	// ErrBadDomain means a public domain is not a DNS name as the mesh
	// writes one.
	ErrBadDomain = errors.New("is not a domain name")
	// ErrBadNetwork means a network is not a CIDR prefix written canonically.
	ErrBadNetwork = errors.New("is not a network")
	// ErrNetworksOverlap means two of a node's networks share addresses.
	ErrNetworksOverlap = errors.New("overlap")
	// ErrOverlapsOverlay means a network shares addresses with the overlay.
	ErrOverlapsOverlay = errors.New("overlaps the overlay")
	// ErrTooManyNetworks means more networks than MaxNetworks.
	ErrTooManyNetworks = fmt.Errorf("are more networks than one node routes (at most %d)", MaxNetworks)
)

// CheckDomain refuses a public domain that is not lower-case labels of 1 to
// 63 characters (a-z, 0-9, and '-' inside), at least two of them joined by
// dots, 253 characters at most, whose last label is not all digits; the
// error names the rule broken.
func CheckDomain(domain string) error {
	bad := func(why string, args ...any) error {
		return fmt.Errorf("%q %w: %s", domain, ErrBadDomain, fmt.Sprintf(why, args...))
	}
	switch {
	case domain == "":
		return bad("it is empty")
	case len(domain) > 253:
		return bad("it is %d characters long, more than 253", len(domain))
	case strings.HasSuffix(domain, "."):
		return bad("write it without the final dot")
	}
	labels := strings.Split(domain, ".")
	if len(labels) < 2 {
		return bad("it has one label; a domain has at least two, such as example.org")
	}
	for _, l := range labels {
		switch {
		case l == "":
			return bad("it has an empty label (two dots together, or a leading dot)")
		case len(l) > 63:
			return bad("label %q is %d characters long, more than 63", l, len(l))
		case l[0] == '-' || l[len(l)-1] == '-':
			return bad("label %q begins or ends with '-'", l)
		}
		for _, r := range l {
			if r >= 'A' && r <= 'Z' {
				return bad("label %q has upper-case letters; write it in lower case", l)
			}
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
				return bad("label %q has %q; labels hold only a-z, 0-9 and '-'", l, r)
			}
		}
	}
	if strings.Trim(labels[len(labels)-1], "0123456789") == "" {
		return bad("its last label is all digits, as an address's is")
	}
	return nil
}

// ParseNetwork reads one network: a CIDR prefix written canonically (its
// host bits zero), so that what is kept is what was written.
func ParseNetwork(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q %w: write it as an address, '/' and a prefix length, such as 10.20.0.0/16 or 2001:db8::/48", s, ErrBadNetwork)
	}
	if m := p.Masked(); m != p {
		return netip.Prefix{}, fmt.Errorf("%q %w: its host bits are set; the network is %s", s, ErrBadNetwork, m)
	}
	return p, nil
}

// CheckNetworks judges a node's networks together: each one is a network
// (ParseNetwork), shares no address with the overlay (OverlayRanges) or
// with another, and there are at most MaxNetworks. It returns them sorted,
// as they are kept and declared.
func CheckNetworks(networks []string) ([]netip.Prefix, error) {
	if len(networks) > MaxNetworks {
		return nil, fmt.Errorf("%d %w", len(networks), ErrTooManyNetworks)
	}
	out := make([]netip.Prefix, 0, len(networks))
	for _, s := range networks {
		p, err := ParseNetwork(s)
		if err != nil {
			return nil, err
		}
		for _, o := range OverlayRanges {
			if p.Overlaps(o) {
				return nil, fmt.Errorf("%s %w (%s): the mesh's private network uses %s and %s for its own nodes", p, ErrOverlapsOverlay, o, OverlayRanges[0], OverlayRanges[1])
			}
		}
		for _, q := range out {
			if p.Overlaps(q) {
				return nil, fmt.Errorf("%s and %s %w: a node routes each address once", q, p, ErrNetworksOverlap)
			}
		}
		out = append(out, p)
	}
	SortPrefixes(out)
	return out, nil
}

// SortPrefixes sorts prefixes IPv4 first, then by address, then by length:
// the one order the mesh writes them in.
func SortPrefixes(ps []netip.Prefix) {
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
}

// FactSSHPort is the fact a host reports the port its SSH server listens on
// under: the port a node's filter keeps open unless a person closes it.
const FactSSHPort = "ssh_port"
