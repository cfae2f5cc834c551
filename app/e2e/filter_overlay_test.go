package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"mesh-controller/app/nftables"
	"mesh-controller/app/overlay"
	"mesh-controller/app/protocol"
)

// An overlay port is reached through the overlay only, for real: a node in
// a namespace of its own has two links to a peer's namespace, one named as
// the overlay's interface (mesh0, standing for WireGuard's) and one that is
// not (the LAN), and applies the ruleset the renderer writes for its
// overlay addresses. The peer holds overlay addresses, v4 and v6, on both
// links. Before the filter every path answers (the routes are right);
// after it, a TCP port and a UDP port exposed to the overlay answer what
// comes in on mesh0 from the overlay's prefixes, and refuse the same
// addresses arriving on the LAN (to the node's LAN address or to its
// overlay address routed there), and an address outside the prefixes
// arriving on mesh0. A public port still answers on the LAN: it is the
// overlay rules that refuse, not the LAN that is cut.
func TestFilter_OverlayOnlyThroughOverlay(t *testing.T) {
	t.Parallel()
	needNetns(t)
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	id := hex.EncodeToString(b[:])
	node, peer := netns{name: "mesho-" + id}, netns{name: "meshp-" + id}
	addNetns(t, node.name)
	addNetns(t, peer.name)
	// The overlay's prefixes as a declaration's overlay part names them.
	const ula = "fd6d:6573:6800"
	prefixes := overlay.Prefixes(&protocol.DeclaredOverlay{Address4: "100.100.2.2/10", Address6: ula + ":2::2/48"})
	if len(prefixes) != 2 || !prefixes[0].Contains(netip.MustParseAddr("100.100.1.1")) {
		t.Fatalf("the overlay's prefixes: %v", prefixes)
	}
	link := func(peerSide, nodeSide string, addrs ...[2]string) {
		t.Helper()
		run(t, "ip", "-n", peer.name, "link", "add", peerSide, "type", "veth", "peer", "name", nodeSide, "netns", node.name)
		for _, a := range addrs {
			run(t, "ip", "-n", peer.name, "addr", "add", a[0], "dev", peerSide, "nodad")
			run(t, "ip", "-n", node.name, "addr", "add", a[1], "dev", nodeSide, "nodad")
		}
		run(t, "ip", "-n", peer.name, "link", "set", peerSide, "up")
		run(t, "ip", "-n", node.name, "link", "set", nodeSide, "up")
	}
	// The LAN: overlay addresses on a link that is not the overlay's.
	link("lan0", "lan0", [2]string{"100.100.1.1/24", "100.100.1.2/24"}, [2]string{ula + ":1::1/64", ula + ":1::2/64"})
	// The overlay's interface, and on it addresses outside its prefixes too.
	link("peer0", protocol.OverlayInterface, [2]string{"100.100.2.1/24", "100.100.2.2/24"}, [2]string{ula + ":2::1/64", ula + ":2::2/64"},
		[2]string{"10.99.2.1/24", "10.99.2.2/24"}, [2]string{"2001:db8:2::1/64", "2001:db8:2::2/64"})
	// The node's own overlay addresses 3::2 and 100.100.3.2, on mesh0,
	// which the peer routes to over the LAN: a LAN machine aiming at the
	// node's overlay address.
	run(t, "ip", "-n", node.name, "addr", "add", "100.100.3.2/32", "dev", protocol.OverlayInterface)
	run(t, "ip", "-n", node.name, "addr", "add", ula+":3::2/128", "dev", protocol.OverlayInterface, "nodad")
	run(t, "ip", "-n", peer.name, "route", "add", "100.100.3.2/32", "via", "100.100.1.2", "dev", "lan0")
	run(t, "ip", "-n", peer.name, "route", "add", ula+":3::2/128", "via", ula+":1::2", "dev", "lan0")

	paths := []struct {
		name, to string
		overlay  bool // an overlay peer: in the prefixes, on mesh0
	}{
		{"v4 on mesh0 from the overlay's prefix", "100.100.2.2", true},
		{"v6 on mesh0 from the overlay's prefix", ula + ":2::2", true},
		{"v4 on the LAN from the overlay's prefix", "100.100.1.2", false},
		{"v6 on the LAN from the overlay's prefix", ula + ":1::2", false},
		{"v4 on the LAN from the overlay's prefix, to the node's overlay address", "100.100.3.2", false},
		{"v6 on the LAN from the overlay's prefix, to the node's overlay address", ula + ":3::2", false},
		{"v4 on mesh0 from outside the overlay's prefix", "10.99.2.2", false},
		{"v6 on mesh0 from outside the overlay's prefix", "2001:db8:2::2", false},
	}
	// The servers: a TCP one on every address of the node and a UDP one
	// on each (answering from the address asked) on the same overlay
	// port, and a public TCP one.
	port := node.listenOn(t, "")
	public := node.listenOn(t, "")
	for _, p := range paths {
		node.echoUDP(t, net.JoinHostPort(p.to, strconv.Itoa(port)))
	}
	probe := func(network, to string, port int) bool {
		t.Helper()
		ok, err := peer.answered(network, net.JoinHostPort(to, strconv.Itoa(port)))
		if err != nil {
			t.Fatalf("%s to %s port %d: %v", network, to, port, err)
		}
		return ok
	}
	// Without a filter every path answers, once the links are up (a
	// fresh link's neighbours take a moment).
	for _, p := range paths {
		for _, network := range []string{"tcp", "udp"} {
			checkFor(t, settle, func() error {
				if ok, err := peer.answered(network, net.JoinHostPort(p.to, strconv.Itoa(port))); !ok {
					return fmt.Errorf("%s %s not answered without a filter: %v", network, p.name, err)
				}
				return nil
			})
		}
	}

	ruleset := nftables.Render(nftables.Input{Node: "web1", PublicDomain: "example.org", Overlay: prefixes, Ports: []nftables.Port{
		{Module: "app", Name: "http", Port: port, Expose: nftables.Overlay},
		{Module: "app", Name: "sync", Port: port, Protocol: "udp", Expose: nftables.Overlay},
		{Module: "site", Name: "http", Port: public, Expose: nftables.Public},
	}})
	file := filepath.Join(t.TempDir(), "mesh.nft")
	if err := os.WriteFile(file, []byte(nftables.Replace(ruleset)), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := node.nft("-f", file); err != nil {
		t.Fatalf("apply the rendered ruleset: %v\n%s\n%s", err, out, ruleset)
	}
	// Every probe at once: each refused one waits out its timeout.
	said := make([]string, 2*len(paths))
	var wg sync.WaitGroup
	for i, p := range paths {
		for j, network := range []string{"tcp", "udp"} {
			wg.Go(func() {
				ok, err := peer.answered(network, net.JoinHostPort(p.to, strconv.Itoa(port)))
				switch {
				case err != nil:
					said[2*i+j] = fmt.Sprintf("%s %s: %v", network, p.name, err)
				case ok != p.overlay:
					said[2*i+j] = fmt.Sprintf("%s %s: answered %v, want %v", network, p.name, ok, p.overlay)
				}
			})
		}
	}
	wg.Wait()
	for _, s := range said {
		if s != "" {
			t.Error(s)
		}
	}
	if !probe("tcp", "100.100.1.2", public) {
		t.Errorf("the public port is not answered on the LAN")
	}
	if t.Failed() {
		t.Logf("the ruleset:\n%s", ruleset)
	}
}

// echoUDP answers each datagram to addr, in the namespace, with the
// datagram itself, from addr (a socket on every address would answer from
// whichever the route back prefers).
func (n netns) echoUDP(t *testing.T, addr string) {
	t.Helper()
	var pc net.PacketConn
	if err := n.do(func() (err error) {
		pc, err = net.ListenPacket("udp", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 64)
		for {
			k, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:k], from)
		}
	}()
}

// answered says whether a server in another namespace answers from this
// one at addr: a TCP connection's "hello", or a UDP datagram echoed. Each
// probe is a socket of its own, a flow the filter has not seen. Dropped,
// it times out: false; any other failure is an error.
func (n netns) answered(network, addr string) (bool, error) {
	const within = 700 * time.Millisecond
	var ok bool
	err := n.do(func() error {
		c, err := net.DialTimeout(network, addr, within)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(within))
		want := "hello\n"
		if network == "udp" {
			want = "ping " + addr
			if _, err := c.Write([]byte(want)); err != nil {
				return err
			}
		}
		got := make([]byte, len(want))
		if _, err := c.Read(got); err != nil {
			return err
		}
		if string(got) != want {
			return fmt.Errorf("answered %q, not %q", got, want)
		}
		ok = true
		return nil
	})
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false, nil
	}
	return ok, err
}
