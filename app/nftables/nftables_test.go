package nftables_test

import (
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"mesh-controller/app/nftables"
	"mesh-controller/app/protocol"
)

// required says the real tools must be there: under make test
// (MESH_TEST_TOOLS), which installs them, and under CI.
func required() bool { return os.Getenv("CI") != "" || os.Getenv("MESH_TEST_TOOLS") != "" }

// needNft returns the path of Debian's nft, run as root (it reads the
// kernel's netlink even to check a ruleset). Without either, the test is
// skipped saying why, except where the tools are required: then it fails.
func needNft(t *testing.T) string {
	t.Helper()
	nft, err := exec.LookPath("nft")
	if err != nil {
		for _, p := range []string{"/usr/sbin/nft", "/sbin/nft"} {
			if _, e := os.Stat(p); e == nil {
				nft, err = p, nil
			}
		}
	}
	why := ""
	switch {
	case err != nil:
		why = "nft is not installed (apt-get install --no-install-recommends nftables; make test installs it)"
	case os.Geteuid() != 0:
		why = "nft needs root to check a ruleset against the kernel (make test runs as root, like CI)"
	}
	if why != "" {
		if required() {
			t.Fatalf("%s: under make test or CI the filter is tested for real", why)
		}
		t.Skip(why)
	}
	return nft
}

var (
	overlay = []netip.Prefix{netip.MustParsePrefix("100.64.0.0/10"), netip.MustParsePrefix("fd00::/8")}
	web     = nftables.Port{Module: "site", Name: "https", Port: 443, Expose: nftables.Public}
	dns     = nftables.Port{Module: "resolver", Name: "dns", Port: 53, Protocol: "udp", Expose: nftables.Public}
	app     = nftables.Port{Module: "paperless", Name: "http", Port: 8000, Expose: nftables.Overlay}
	sync    = nftables.Port{Module: "paperless", Name: "sync", Port: 8002, Protocol: "udp", Expose: nftables.Overlay}
	admin   = nftables.Port{Module: "paperless", Name: "admin", Port: 8001, Expose: nftables.Local}
	bare    = nftables.Port{Module: "hello", Name: "http", Port: 18480}
)

// The cases every rendering is checked with nft -c: what the rules say is
// asserted on the text; that nft reads them is asserted by nft.
var cases = []struct {
	name string
	in   nftables.Input
	// want are lines the ruleset has; unwanted, text it must not have.
	want, unwanted []string
}{
	{
		name: "nothing declared",
		in:   nftables.Input{Node: "web1"},
		want: []string{
			"table inet mesh {",
			"type filter hook input priority filter; policy drop;",
			"ct state established,related accept",
			"ct state invalid drop",
			`iifname "lo" accept comment "loopback, and with it every local port"`,
			"meta l4proto icmp icmp type { echo-request, destination-unreachable, time-exceeded, parameter-problem } accept",
			"nd-neighbor-solicit, nd-neighbor-advert } accept",
			`tcp dport 22 accept comment "ssh, kept open"`,
			"type filter hook forward priority filter; policy drop;",
			"# the node routes no networks: nothing is forwarded",
		},
		unwanted: []string{"daddr", "saddr"},
	},
	{
		name:     "public without a domain is closed",
		in:       nftables.Input{Node: "web1", Ports: []nftables.Port{web}},
		want:     []string{"# site/https (tcp 443): public, closed: the node has no public domain"},
		unwanted: []string{"dport 443"},
	},
	{
		name: "public with a domain is open to anyone, tcp and udp",
		in:   nftables.Input{Node: "web1", Ports: []nftables.Port{web, dns}, PublicDomain: "example.org"},
		want: []string{`udp dport 53 accept comment "resolver/dns"`, `tcp dport 443 accept comment "site/https"`},
	},
	{
		name:     "overlay without an overlay is closed",
		in:       nftables.Input{Node: "web1", Ports: []nftables.Port{app}},
		want:     []string{"# paperless/http (tcp 8000): overlay, closed: the node has no overlay yet"},
		unwanted: []string{"dport 8000"},
	},
	{
		name: "overlay only from the overlay's interface and addresses, tcp and udp",
		in:   nftables.Input{Node: "web1", Ports: []nftables.Port{app, sync}, Overlay: overlay},
		want: []string{
			`iifname "mesh0" ip saddr { 100.64.0.0/10 } tcp dport 8000 accept comment "paperless/http"`,
			`iifname "mesh0" ip6 saddr { fd00::/8 } tcp dport 8000 accept comment "paperless/http"`,
			`iifname "mesh0" ip saddr { 100.64.0.0/10 } udp dport 8002 accept comment "paperless/sync"`,
			`iifname "mesh0" ip6 saddr { fd00::/8 } udp dport 8002 accept comment "paperless/sync"`,
		},
	},
	{
		name:     "an overlay of IPv4 alone opens its ports to IPv4 alone",
		in:       nftables.Input{Node: "web1", Ports: []nftables.Port{app}, Overlay: overlay[:1]},
		want:     []string{`iifname "mesh0" ip saddr { 100.64.0.0/10 } tcp dport 8000 accept comment "paperless/http"`},
		unwanted: []string{"ip6 saddr"},
	},
	{
		name: "the overlay's own port is open, and a relay forwards between overlay nodes",
		in: nftables.Input{Node: "relay1", Overlay: []netip.Prefix{netip.MustParsePrefix("100.64.0.0/10"), netip.MustParsePrefix("fd12:3456:789a::/48")},
			OverlayPort: 51820, OverlayRelay: true},
		want: []string{
			`udp dport 51820 accept comment "the overlay (WireGuard)"`,
			`iifname "mesh0" oifname "mesh0" ip saddr { 100.64.0.0/10 } ip daddr { 100.64.0.0/10 } accept comment "the overlay: relayed between its nodes"`,
			`iifname "mesh0" oifname "mesh0" ip6 saddr { fd12:3456:789a::/48 } ip6 daddr { fd12:3456:789a::/48 } accept comment "the overlay: relayed between its nodes"`,
		},
		unwanted: []string{"nothing is forwarded"},
	},
	{
		name:     "a node of the overlay that relays nothing forwards nothing",
		in:       nftables.Input{Node: "web1", Overlay: overlay, OverlayPort: 51900},
		want:     []string{`udp dport 51900 accept comment "the overlay (WireGuard)"`, "# the node routes no networks: nothing is forwarded"},
		unwanted: []string{"oifname"},
	},
	{
		name:     "local and unexposed ports only from loopback",
		in:       nftables.Input{Node: "web1", Ports: []nftables.Port{admin, bare}, PublicDomain: "example.org", Overlay: overlay},
		want:     []string{"# paperless/admin (tcp 8001): local, from loopback only", "# hello/http (tcp 18480): local, from loopback only"},
		unwanted: []string{"dport 8001", "dport 18480"},
	},
	{
		name: "the reported ssh port is kept open",
		in:   nftables.Input{Node: "web1", SSHPort: 2222},
		want: []string{`tcp dport 2222 accept comment "ssh, kept open"`}, unwanted: []string{"dport 22 "},
	},
	{
		name: "ssh closed only when asked",
		in:   nftables.Input{Node: "web1", CloseSSH: true},
		want: []string{"# ssh (tcp 22): closed, as a person asked (--close-ssh)"}, unwanted: []string{"dport 22"},
	},
	{
		name: "the node's networks are forwarded both ways",
		in: nftables.Input{Node: "gw1", Networks: []netip.Prefix{netip.MustParsePrefix("192.168.10.0/24"),
			netip.MustParsePrefix("2001:db8::/48"), netip.MustParsePrefix("10.20.0.0/16")}},
		want: []string{
			`ip daddr { 10.20.0.0/16, 192.168.10.0/24 } accept comment "the node's networks"`,
			`ip saddr { 10.20.0.0/16, 192.168.10.0/24 } accept comment "the node's networks"`,
			`ip6 daddr { 2001:db8::/48 } accept comment "the node's networks"`,
			`ip6 saddr { 2001:db8::/48 } accept comment "the node's networks"`,
		},
		unwanted: []string{"nothing is forwarded"},
	},
	{
		name:     "a port that is not tcp or udp is closed",
		in:       nftables.Input{Node: "web1", Ports: []nftables.Port{{Module: "odd", Name: "x", Port: 9, Protocol: "sctp", Expose: nftables.Public}}, PublicDomain: "example.org"},
		want:     []string{"# odd/x: closed: not a tcp or udp port from 1 to 65535"},
		unwanted: []string{"dport 9 "},
	},
}

func TestRender(t *testing.T) {
	nft := needNft(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out := nftables.Render(c.in)
			lines := map[string]bool{}
			for _, l := range strings.Split(out, "\n") {
				lines[strings.TrimSpace(l)] = true
			}
			for _, w := range c.want {
				if !lines[w] && !strings.Contains(out, w) {
					t.Errorf("no line %q in\n%s", w, out)
				}
			}
			for _, u := range c.unwanted {
				if strings.Contains(out, u) {
					t.Errorf("%q in\n%s", u, out)
				}
			}
			// Every rule that admits by the overlay's addresses admits only
			// what came in on its interface: an address in the prefix on
			// the LAN is no peer of the overlay.
			for _, l := range strings.Split(out, "\n") {
				for _, p := range c.in.Overlay {
					if strings.Contains(l, "saddr { "+p.Masked().String()) && !strings.Contains(l, `iifname "mesh0" `) {
						t.Errorf("a rule admits the overlay's addresses from any interface: %q", strings.TrimSpace(l))
					}
				}
			}
			file := filepath.Join(t.TempDir(), "mesh.nft")
			if err := os.WriteFile(file, []byte(nftables.Replace(out)), 0o600); err != nil {
				t.Fatal(err)
			}
			if b, err := exec.Command(nft, "-c", "-f", file).CombinedOutput(); err != nil {
				t.Fatalf("nft -c -f refuses the ruleset: %v\n%s\n%s", err, b, out)
			}
		})
	}
}

// Every rendering is the mesh's table alone, as a host accepts a declared
// ruleset (protocol.OneMeshTable), and Replace names no other table.
func TestRender_OnlyItsTable(t *testing.T) {
	for _, c := range cases {
		out := nftables.Render(c.in)
		if err := protocol.OneMeshTable(out); err != nil {
			t.Errorf("%s: a host would refuse it: %v\n%s", c.name, err, out)
		}
		for _, l := range strings.Split(nftables.Replace(out), "\n") {
			if f := strings.Fields(l); len(f) > 0 && (f[0] == "table" || f[0] == "delete" || f[0] == "flush") {
				if !strings.HasPrefix(strings.TrimPrefix(strings.TrimPrefix(l, "delete "), "flush "), "table inet mesh") {
					t.Errorf("%s: a line names another table: %q", c.name, l)
				}
			}
		}
	}
}

// The same input in any order renders the same bytes: a preview's digest
// covers the ruleset.
func TestRender_Deterministic(t *testing.T) {
	a := nftables.Input{Node: "web1", Ports: []nftables.Port{web, app, dns, admin}, PublicDomain: "example.org", Overlay: overlay,
		Networks: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/48"), netip.MustParsePrefix("192.168.0.0/16")}}
	b := a
	b.Ports = []nftables.Port{admin, dns, app, web, web}
	b.Overlay = []netip.Prefix{overlay[1], overlay[0]}
	b.Networks = []netip.Prefix{a.Networks[2], a.Networks[1], a.Networks[0]}
	if ra, rb := nftables.Render(a), nftables.Render(b); ra != rb {
		t.Fatalf("the same input in another order renders differently:\n%s\n---\n%s", ra, rb)
	}
}

// In a network namespace of its own, the ruleset applies with nft -f,
// applies again over itself (it replaces its table whole), and leaves a
// table that is not the mesh's as it was.
func TestRender_AppliesInANamespace(t *testing.T) {
	nft := needNft(t)
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		if required() {
			t.Fatal("unshare (util-linux) is missing")
		}
		t.Skip("unshare (util-linux) is missing")
	}
	dir := t.TempDir()
	first := nftables.Render(nftables.Input{Node: "web1", Ports: []nftables.Port{web, app}, PublicDomain: "example.org", Overlay: overlay,
		Networks: []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16")}})
	second := nftables.Render(nftables.Input{Node: "web1", Ports: []nftables.Port{app}, SSHPort: 2222})
	other := "table inet other {\n\tchain c {\n\t\ttype filter hook input priority 10; policy accept;\n\t\ttcp dport 9999 accept\n\t}\n}\n"
	for name, body := range map[string]string{"first.nft": nftables.Replace(first), "second.nft": nftables.Replace(second), "other.nft": other} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	script := `set -e
nft -f "$1/other.nft"
nft -f "$1/first.nft"
echo "== first"
nft list table inet mesh
nft -f "$1/second.nft"
echo "== second"
nft list ruleset`
	out, err := exec.Command(unshare, "--net", "sh", "-c", script, "sh", dir).CombinedOutput()
	if err != nil {
		if required() {
			t.Fatalf("nft in a network namespace: %v\n%s", err, out)
		}
		t.Skipf("this kernel cannot run nftables in a network namespace: %v\n%s", err, out)
	}
	_ = nft
	firstOut, secondOut, _ := strings.Cut(string(out), "== second")
	for _, w := range []string{"tcp dport 443 accept", `iifname "mesh0" ip saddr 100.64.0.0/10 tcp dport 8000 accept`, "ip daddr 10.20.0.0/16 accept", "tcp dport 22 accept"} {
		if !strings.Contains(firstOut, w) {
			t.Errorf("the applied table lacks %q:\n%s", w, firstOut)
		}
	}
	for _, w := range []string{"tcp dport 2222 accept", "table inet other", "tcp dport 9999 accept"} {
		if !strings.Contains(secondOut, w) {
			t.Errorf("after applying again, the ruleset lacks %q:\n%s", w, secondOut)
		}
	}
	for _, u := range []string{"dport 443", "10.20.0.0/16", "dport 22 "} {
		if strings.Contains(secondOut, u) {
			t.Errorf("applying again left %q of the first ruleset:\n%s", u, secondOut)
		}
	}
}
