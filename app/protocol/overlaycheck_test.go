package protocol

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// testKey is a fresh WireGuard key, as wg(8) writes one.
func testKey() string {
	var b [32]byte
	rand.Read(b[:])
	return base64.StdEncoding.EncodeToString(b[:])
}

// testOverlay is a node's part with two peers, one dialled and relayed
// for, one behind NAT.
func testOverlay() *DeclaredOverlay {
	return &DeclaredOverlay{Interface: OverlayInterface, Address4: "100.64.0.1/10", Address6: "fd6d:6573:6800::1/48",
		ListenPort: 51820, Peers: []DeclaredPeer{
			{Node: "b", PublicKey: testKey(), Endpoint: "192.0.2.2:51820", AllowedIPs: []string{"100.64.0.2/32", "fd6d:6573:6800::2/128"}, Relays: true},
			{Node: "c", PublicKey: testKey(), AllowedIPs: []string{"100.64.0.3/32", "fd6d:6573:6800::3/128"}, Keepalive: OverlayKeepalive, Via: []string{"d"}},
		}}
}

func TestValidWireGuardKey(t *testing.T) {
	k := testKey()
	b, _ := base64.StdEncoding.DecodeString(k)
	// The same 32 bytes spelled with a stray bit in the last character:
	// lenient base64 reads it as the same key.
	last := strings.IndexByte(strictAlphabet, k[42])
	stray := k[:42] + string(strictAlphabet[last^1]) + "="
	if got, _ := base64.StdEncoding.DecodeString(stray); string(got) != string(b) {
		t.Fatalf("the stray spelling is not the same key")
	}
	for s, want := range map[string]bool{
		k:                          true,
		stray:                      false,
		k[:20] + "\n" + k[20:43]:   false,
		strings.TrimSuffix(k, "="): false,
		"AAAA":                     false,
		strings.Repeat("z", 44):    false,
		"":                         false,
	} {
		if ValidWireGuardKey(s) != want {
			t.Errorf("%q: want %v", s, want)
		}
	}
}

const strictAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

func TestCheckOverlay(t *testing.T) {
	own := testKey()
	if err := CheckOverlay(testOverlay(), own); err != nil {
		t.Fatalf("a good overlay: %v", err)
	}
	if err := CheckOverlay(nil, own); err != nil {
		t.Fatalf("none: %v", err)
	}
	cases := map[string]func(o *DeclaredOverlay){
		`interface "wg0" is not mesh0`:                                         func(o *DeclaredOverlay) { o.Interface = "wg0" },
		"no address":                                                           func(o *DeclaredOverlay) { o.Address4, o.Address6 = "", "" },
		`address "100.64.0.1" is not an IPv4 prefix`:                           func(o *DeclaredOverlay) { o.Address4 = "100.64.0.1" },
		`address "100.64.0.1/10" is not an IPv6 prefix`:                        func(o *DeclaredOverlay) { o.Address6 = "100.64.0.1/10" },
		"listen port 70000 is not a port":                                      func(o *DeclaredOverlay) { o.ListenPort = 70000 },
		`peer b: public key "AAAA" is not base64 of 32 bytes`:                  func(o *DeclaredOverlay) { o.Peers[0].PublicKey = "AAAA" },
		"peer b: public key \"" + strings.Repeat("z", 44) + "\" is not base64": func(o *DeclaredOverlay) { o.Peers[0].PublicKey = strings.Repeat("z", 44) },
		"peer b: the public key is this host's own":                            func(o *DeclaredOverlay) { o.Peers[0].PublicKey = own },
		`peer b: endpoint "192.0.2.2" is not host:port`:                        func(o *DeclaredOverlay) { o.Peers[0].Endpoint = "192.0.2.2" },
		`peer b: endpoint ":51820" is not host:port`:                           func(o *DeclaredOverlay) { o.Peers[0].Endpoint = ":51820" },
		`peer b: endpoint "h:0" is not host:port`:                              func(o *DeclaredOverlay) { o.Peers[0].Endpoint = "h:0" },
		`peer b: allowed IP "100.64.0.2" is not a prefix`:                      func(o *DeclaredOverlay) { o.Peers[0].AllowedIPs = []string{"100.64.0.2"} },
		"peer b: no allowed IPs":                                               func(o *DeclaredOverlay) { o.Peers[0].AllowedIPs = nil },
		"peer b: keepalive 70000 is not seconds":                               func(o *DeclaredOverlay) { o.Peers[0].Keepalive = 70000 },
		"peer b: repeated (its node b is b's too)":                             func(o *DeclaredOverlay) { o.Peers = append(o.Peers, o.Peers[0]) },
		"peer c: repeated (its key":                                            func(o *DeclaredOverlay) { o.Peers[1].PublicKey = o.Peers[0].PublicKey },
		": no node name":                                                       func(o *DeclaredOverlay) { o.Peers[0].Node = "" },
	}
	for want, change := range cases {
		o := testOverlay()
		change(o)
		err := CheckOverlay(o, own)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("want %q, got %v", want, err)
		}
	}
	// A host without a key yet has no key of its own to refuse.
	o := testOverlay()
	o.Peers[0].PublicKey = own
	if err := CheckOverlay(o, ""); err != nil {
		t.Errorf("no own key: %v", err)
	}
}

// What a host accepts of an overlay: the peers it refuses gone, the first
// of two that repeat each other kept, and what is left passes the check
// whole, however the peers were spoilt.
func TestAcceptedOverlay(t *testing.T) {
	own := testKey()
	o := testOverlay()
	shared := testKey()
	o.Peers = append(o.Peers,
		DeclaredPeer{Node: "d", PublicKey: shared, AllowedIPs: []string{"100.64.0.4/32"}},
		DeclaredPeer{Node: "e", PublicKey: own, AllowedIPs: []string{"100.64.0.5/32"}},
		DeclaredPeer{Node: "f", PublicKey: shared, AllowedIPs: []string{"100.64.0.6/32"}},
		DeclaredPeer{Node: "g", PublicKey: testKey(), AllowedIPs: []string{"100.64.0.7/32"}})
	before, _ := json.Marshal(o)
	kept, refused := AcceptedOverlay(o, own)
	if after, _ := json.Marshal(o); string(after) != string(before) {
		t.Fatal("the overlay judged was changed")
	}
	var names []string
	for _, p := range kept.Peers {
		names = append(names, p.Node)
	}
	if strings.Join(names, " ") != "b c d g" || len(refused) != 2 || refused[0].Node != "e" || refused[1].Node != "f" ||
		refused[0].Why != "peer e: the public key is this host's own" || !strings.HasPrefix(refused[1].Why, "peer f: repeated (its key ") {
		t.Fatalf("kept %v, refused %+v", names, refused)
	}
	if same, none := AcceptedOverlay(testOverlay(), own); same == nil || none != nil {
		t.Fatalf("a good overlay: %v", none)
	}
	bad := testOverlay()
	bad.Address4, bad.Address6 = "", ""
	if gone, rs := AcceptedOverlay(bad, own); gone != nil || len(rs) != 1 || rs[0].Peer != -1 {
		t.Fatalf("refused whole: %+v", rs)
	}

	// Spoilt at random, many times: what is kept always passes.
	spoil := []func(p *DeclaredPeer, o *DeclaredOverlay){
		func(p *DeclaredPeer, o *DeclaredOverlay) { p.PublicKey = own },
		func(p *DeclaredPeer, o *DeclaredOverlay) { p.PublicKey = o.Peers[0].PublicKey },
		func(p *DeclaredPeer, o *DeclaredOverlay) { p.Node = o.Peers[0].Node },
		func(p *DeclaredPeer, o *DeclaredOverlay) { p.PublicKey = "AAAA" },
		func(p *DeclaredPeer, o *DeclaredOverlay) { p.Endpoint = "nowhere" },
		func(p *DeclaredPeer, o *DeclaredOverlay) { p.AllowedIPs = nil },
		func(p *DeclaredPeer, o *DeclaredOverlay) { p.Node = "" },
	}
	for round := 0; round < 200; round++ {
		o := testOverlay()
		for i := 0; i < 6; i++ {
			o.Peers = append(o.Peers, DeclaredPeer{Node: fmt.Sprintf("n%d", i), PublicKey: testKey(), AllowedIPs: []string{"100.64.1.1/32"}})
		}
		var r [16]byte
		rand.Read(r[:])
		for i := range o.Peers {
			if r[i]%3 == 0 {
				spoil[int(r[i+8])%len(spoil)](&o.Peers[i], o)
			}
		}
		kept, refused := AcceptedOverlay(o, own)
		if err := CheckOverlay(kept, own); err != nil {
			t.Fatalf("round %d: kept %d peers, refused %+v, and the rest is refused: %v", round, len(kept.Peers), refused, err)
		}
		if len(kept.Peers)+len(refused) != len(o.Peers) {
			t.Fatalf("round %d: %d kept and %d refused of %d", round, len(kept.Peers), len(refused), len(o.Peers))
		}
	}
}

// splitHostPort takes what net.SplitHostPort takes, and refuses what it
// refuses, for an endpoint's forms.
func TestSplitHostPort(t *testing.T) {
	for _, c := range []struct {
		in, host, port string
		ok             bool
	}{
		{"gw1.example.org:51820", "gw1.example.org", "51820", true},
		{"192.0.2.1:51820", "192.0.2.1", "51820", true},
		{"[fd00::1]:51820", "fd00::1", "51820", true},
		{"fd00::1:51820", "", "", false},
		{"gw1.example.org", "", "", false},
		{"[fd00::1:51820", "", "", false},
		{"a]b:1", "", "", false},
	} {
		host, port, ok := splitHostPort(c.in)
		if ok != c.ok || (ok && (host != c.host || port != c.port)) {
			t.Errorf("%q: %q %q %v, want %q %q %v", c.in, host, port, ok, c.host, c.port, c.ok)
		}
	}
}
