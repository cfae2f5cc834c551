package e2e

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"mesh-controller/app"
	"mesh-controller/app/daemon"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/inventory"
)

// The overlay, for real: three hosts, each a real mesh-host process in a
// network namespace of its own (joined to the test's by a veth pair, for
// the broker), their namespaces on one LAN (a bridge in a fourth), bring
// up WireGuard interfaces (userspace, wireguard-go, inside the host) from
// the overlay parts their declarations carry; TCP connections over the
// overlay prove them, wg(8) reads them back, and the hosts' heartbeats
// carry their peers' handshakes.

// needOverlay skips where the overlay cannot be made (as needNetns, and
// no TUN device or no wg) and fails where it must be (make test, CI).
func needOverlay(t *testing.T) {
	t.Helper()
	needFor(t, "the overlay test needs network namespaces and TUN devices", []string{"/dev/net/tun"}, "ip", "nft", "wg", "nsenter")
}

// newLAN puts the namespaces on one Ethernet segment, a bridge in a
// namespace of its own, and returns each one's address on it (10.232/16,
// a /24 for this run); removed when the test ends.
func newLAN(t *testing.T, ns ...netns) []string {
	t.Helper()
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	id := hex.EncodeToString(b[:])
	lan := "meshl-" + id
	addNetns(t, lan)
	run(t, "ip", "-n", lan, "link", "add", "br0", "type", "bridge")
	run(t, "ip", "-n", lan, "link", "set", "br0", "up")
	var addrs []string
	for i, n := range ns {
		in, out := fmt.Sprintf("ml%s%dn", id, i), fmt.Sprintf("ml%s%df", id, i)
		addr := fmt.Sprintf("10.232.%d.%d", b[0], i+1)
		run(t, "ip", "-n", lan, "link", "add", in, "type", "veth", "peer", "name", out, "netns", n.name)
		run(t, "ip", "-n", lan, "link", "set", in, "master", "br0", "up")
		run(t, "ip", "-n", n.name, "addr", "add", addr+"/24", "dev", out)
		run(t, "ip", "-n", n.name, "link", "set", out, "up")
		addrs = append(addrs, addr)
	}
	return addrs
}

// reaches says why a TCP connection from namespace n to addr is not
// answered "hello" by its server, or nil.
func (n netns) reaches(addr string, within time.Duration) error {
	return n.do(func() error {
		c, err := net.DialTimeout("tcp", addr, within)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(within))
		b := make([]byte, 6)
		if _, err := c.Read(b); err != nil || string(b) != "hello\n" {
			return fmt.Errorf("%s connected but did not answer: %q %v", addr, b, err)
		}
		return nil
	})
}

// wgDump is wg show mesh0 dump inside a host's namespaces (its network
// one, and the mount one where its UAPI socket is): the interface's line
// (whose private key is dropped here, never printed) and its peers', by
// public key.
func wgDump(p *hostProc) (iface []string, peers map[string][]string, err error) {
	out, err := runErr("nsenter", "-t", fmt.Sprint(p.pid), "-n", "-m", "wg", "show", protocol.OverlayInterface, "dump")
	if err != nil {
		return nil, nil, err
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	iface = strings.Split(lines[0], "\t")
	if len(iface) != 4 {
		return nil, nil, fmt.Errorf("wg show dump's first line has %d fields", len(iface))
	}
	iface = iface[1:]
	peers = map[string][]string{}
	for _, l := range lines[1:] {
		f := strings.Split(l, "\t")
		if len(f) != 8 {
			return nil, nil, fmt.Errorf("wg show dump: %q", l)
		}
		peers[f[0]] = f
	}
	return iface, peers, nil
}

// overlayFact is a node's fact named name as the controller has it.
func (m *testMesh) overlayFact(node, name string) protocol.Fact {
	for _, f := range m.node(node).Facts {
		if f.Name == name {
			return protocol.Fact{Name: f.Name, Value: f.Value, Why: f.Why}
		}
	}
	return protocol.Fact{}
}

// heard is what hosts published, every message, as the broker carried
// it: their heartbeats decoded, and all of it for a secret to be looked
// for in.
type heard struct {
	mu    sync.Mutex
	beats map[string]protocol.HeartbeatBody
	all   [][]byte
}

func (h *heard) beat(node string) protocol.HeartbeatBody {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.beats[node]
}

func listenToHosts(t *testing.T, nc *nats.Conn) *heard {
	t.Helper()
	h := &heard{beats: map[string]protocol.HeartbeatBody{}}
	if _, err := nc.Subscribe("mesh.node.>", func(msg *nats.Msg) {
		h.mu.Lock()
		defer h.mu.Unlock()
		if len(h.all) < 100000 {
			h.all = append(h.all, msg.Data)
		}
		if !strings.HasSuffix(msg.Subject, "."+protocol.Heartbeat) {
			return
		}
		var s protocol.Signed
		var b protocol.HeartbeatBody
		if json.Unmarshal(msg.Data, &s) == nil && json.Unmarshal(s.Body, &b) == nil {
			h.beats[protocol.NodeOfSubject(msg.Subject)] = b
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return h
}

func overlayBody(t *testing.T, o protocol.DeclaredOverlay) string {
	t.Helper()
	b, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	return `{"modules": [], "overlay": ` + string(b) + `}`
}

// declareUnjudged signs and sends a node an overlay part as a controller
// that did not judge it would (declare refuses one its host would
// refuse): the host's own refusal is what is tested.
func (m *testMesh) declareUnjudged(t *testing.T, node string, o protocol.DeclaredOverlay) inventory.Declaration {
	t.Helper()
	ctx := context.Background()
	st, err := m.c.Stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	key, err := st.Identity.SigningKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	decl, err := st.Inventory.SaveDeclaration(ctx, node, inventory.CurrentPlan,
		app.DeclarationSigner(key, protocol.Declaration{Node: node, Mode: "converged", Modules: []protocol.DeclaredModule{}, Overlay: &o}), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	nc, err := m.c.DialBroker(ctx, st.Identity)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := daemon.PublishDeclaration(nc, decl); err != nil {
		t.Fatal(err)
	}
	if err := nc.FlushTimeout(protocol.AnswerTimeout); err != nil {
		t.Fatal(err)
	}
	return decl
}

// tookRE finds what a host says it took to bring the overlay up, or to
// change it.
var tookRE = regexp.MustCompile(`(brought the overlay up|changed the overlay) in ([0-9.]+[µmn]?s)`)

func TestOverlay_Namespaces(t *testing.T) {
	t.Parallel()
	needOverlay(t)
	na, nb, nc := newNetns(t), newNetns(t), newNetns(t)
	lan := newLAN(t, na, nb, nc)
	// The broker listens on the test's end of a's pair; b and c reach it
	// through their own pairs (an address of this namespace, delivered
	// here from any of its links).
	for _, n := range []netns{nb, nc} {
		run(t, "ip", "-n", n.name, "route", "add", na.near+"/32", "via", n.near)
	}
	forwardWas, err := runErr("ip", "netns", "exec", na.name, "cat", "/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		t.Fatal(err)
	}
	m := newTestMeshOn(t, nil, na.near+":0")
	ctl := m.controllerConn(t)
	sent := listenToHosts(t, ctl)
	a := m.runIn(t, na, "a", true)
	b := m.runIn(t, nb, "b", true)
	c := m.runIn(t, nc, "c", true)
	hosts := []*hostProc{a, b, c}

	// Each host reports its public key; its private key stays in its
	// state dir, 0600.
	pub := map[string]string{}
	for _, h := range hosts {
		checkFor(t, settle, func() error {
			if m.overlayFact(h.node, protocol.FactWireGuardKey).Value == "" {
				return fmt.Errorf("%s has not reported its WireGuard key", h.node)
			}
			return nil
		})
		pub[h.node] = m.overlayFact(h.node, protocol.FactWireGuardKey).Value
		fi, err := os.Stat(filepath.Join(h.state, "wireguard.key"))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s's key file: %v %v", h.node, fi, err)
		}
	}

	// a and b are public (dialled at their LAN addresses); c is behind
	// NAT. The controller computes the rest: a, the first public node by
	// name, relays; c dials it, and reaches b through it.
	port := fmt.Sprint(protocol.OverlayPort)
	ctx := context.Background()
	declared := time.Now()
	for _, pl := range []struct {
		node string
		p    app.Placement
	}{
		{"a", app.Placement{Endpoint: net.JoinHostPort(lan[0], port), Public: true}},
		{"b", app.Placement{Endpoint: net.JoinHostPort(lan[1], port), Public: true}},
		{"c", app.Placement{Site: "home"}},
	} {
		if _, err := m.c.OverlayPlace(ctx, pl.node, pl.p); err != nil {
			t.Fatal(err)
		}
	}
	parts := map[string]protocol.DeclaredOverlay{}
	// Each host applied the declaration of the last placement: what its
	// interface is read against below.
	checkFor(t, settle, func() error {
		for _, h := range hosts {
			d, applied := declaredOverlay(t, m, h.node)
			if d == nil || len(d.Peers) == 0 {
				return fmt.Errorf("%s's overlay part is not declared with peers: %s", h.node, jsonText(d))
			}
			if !applied {
				return fmt.Errorf("%s has not applied its latest declaration: %s", h.node, jsonText(d))
			}
			parts[h.node] = *d
		}
		return nil
	})
	peerIn := func(of, name string) protocol.DeclaredPeer {
		for _, p := range parts[of].Peers {
			if p.Node == name {
				return p
			}
		}
		t.Fatalf("%s has no peer %s: %+v", of, name, parts[of].Peers)
		return protocol.DeclaredPeer{}
	}
	if len(parts["c"].Peers) != 1 || !slices.Equal(peerIn("c", "a").Via, []string{"b"}) || peerIn("c", "a").Keepalive != protocol.OverlayKeepalive ||
		len(parts["b"].Peers) != 1 || !slices.Equal(peerIn("b", "a").Via, []string{"c"}) || !peerIn("a", "b").Relays || !peerIn("a", "c").Relays {
		t.Fatalf("the overlay as computed: %+v", parts)
	}
	a4, b4, b6 := parts["a"].Address4, parts["b"].Address4, parts["b"].Address6
	for _, h := range hosts {
		checkFor(t, 15*time.Second, func() error {
			if f := m.overlayFact(h.node, protocol.FactOverlay); f.Value != protocol.OverlayUp {
				return fmt.Errorf("%s's overlay: %+v", h.node, f)
			}
			return nil
		})
	}
	t.Logf("three hosts' overlays up, as the controller hears it, %s after declaring them", time.Since(declared).Round(time.Millisecond))
	for _, h := range hosts {
		if got := tookRE.FindStringSubmatch(h.logs.String()); got != nil {
			t.Logf("%s: %s in %s", h.node, got[1], got[2])
		} else {
			t.Fatalf("%s does not say it brought the overlay up:\n%s", h.node, h.logs.String())
		}
	}

	// wg(8) reads each interface back, through the UAPI socket the host
	// made: its own key, its port, its peers as declared.
	for _, h := range hosts {
		iface, peers, err := wgDump(h)
		if err != nil {
			t.Fatalf("%s: %v", h.node, err)
		}
		if iface[0] != pub[h.node] || iface[1] != port {
			t.Fatalf("%s's interface: public key %s, port %s", h.node, iface[0], iface[1])
		}
		if len(peers) != len(parts[h.node].Peers) {
			t.Fatalf("%s has %d peers, declared %d", h.node, len(peers), len(parts[h.node].Peers))
		}
		for _, p := range parts[h.node].Peers {
			f, ok := peers[p.PublicKey]
			if !ok {
				t.Fatalf("%s's interface has no peer %s", h.node, p.Node)
			}
			allowed := strings.Split(f[3], ",")
			if !slices.Equal(sorted(allowed), sorted(p.AllowedIPs)) {
				t.Fatalf("%s's peer %s: allowed IPs %v, declared %v", h.node, p.Node, allowed, p.AllowedIPs)
			}
			if p.Endpoint != "" && f[2] != p.Endpoint {
				t.Fatalf("%s's peer %s: endpoint %s, declared %s", h.node, p.Node, f[2], p.Endpoint)
			}
			if want := map[bool]string{true: fmt.Sprint(p.Keepalive), false: "off"}[p.Keepalive > 0]; f[7] != want {
				t.Fatalf("%s's peer %s: keepalive %s, declared %d", h.node, p.Node, f[7], p.Keepalive)
			}
		}
	}
	if f := m.overlayFact("a", protocol.FactOverlayForwarding); f.Value != "on" {
		t.Fatalf("a relays, but says of forwarding: %+v", f)
	}
	if out, err := runErr("ip", "netns", "exec", na.name, "cat", "/proc/sys/net/ipv4/ip_forward"); err != nil || strings.TrimSpace(out) != "1" {
		t.Fatalf("a's forwarding: %q %v", out, err)
	}
	if f := m.overlayFact("b", protocol.FactOverlayForwarding); f.Name != "" {
		t.Fatalf("b relays for no one, but says %+v", f)
	}

	// Real packets: a and b reach each other, over IPv4 and IPv6; c
	// reaches b through a (c has no peer b: nothing else could carry it).
	serveA, serveB := na.listenOn(t, ""), nb.listenOn(t, "")
	over := func(addr string, port int) string {
		return net.JoinHostPort(strings.Split(addr, "/")[0], fmt.Sprint(port))
	}
	for _, path := range []struct {
		from netns
		name string
		to   string
	}{
		{na, "a to b", over(b4, serveB)},
		{na, "a to b (IPv6)", over(b6, serveB)},
		{nb, "b to a", over(a4, serveA)},
		{nc, "c to b through a", over(b4, serveB)},
		{nc, "c to b through a (IPv6)", over(b6, serveB)},
		{nc, "c to a", over(a4, serveA)},
	} {
		start := time.Now()
		checkFor(t, 15*time.Second, func() error {
			if err := path.from.reaches(path.to, 2*time.Second); err != nil {
				return fmt.Errorf("%s (%s): %v", path.name, path.to, err)
			}
			return nil
		})
		t.Logf("%s over the overlay: connected within %s", path.name, time.Since(start).Round(time.Millisecond))
	}

	// Each host's heartbeats carry its peers' last handshakes.
	for _, h := range hosts {
		checkFor(t, 15*time.Second, func() error {
			beat := sent.beat(h.node)
			if len(beat.Peers) != len(parts[h.node].Peers) {
				return fmt.Errorf("%s's heartbeat has peers %+v", h.node, beat.Peers)
			}
			for i, p := range beat.Peers {
				if p.Node != parts[h.node].Peers[i].Node || p.At == nil || time.Since(*p.At) > time.Minute {
					return fmt.Errorf("%s's heartbeat: peer %+v", h.node, p)
				}
			}
			return nil
		})
	}
	_, peers, err := wgDump(b)
	if err != nil || peers[pub["a"]][4] == "0" {
		t.Fatalf("wg says b never shook hands with a: %v %v", peers, err)
	}

	// An overlay part that does not parse refuses its declaration whole,
	// in one line; b's interface stays as it was.
	bad := parts["b"]
	bad.Peers = []protocol.DeclaredPeer{bad.Peers[0], bad.Peers[0]}
	refused := m.declareUnjudged(t, "b", bad)
	checkFor(t, settle, m.answered("b", refused.Serial))
	if ap := m.node("b").LastApply; ap.OK || ap.Error != "refused: the overlay: peer a: repeated (its node a is a's too)" {
		t.Fatalf("a repeated peer: %+v", ap)
	}
	if _, peers, err := wgDump(b); err != nil || len(peers) != 1 || peers[pub["a"]] == nil {
		t.Fatalf("b's peers after a refusal: %v %v", peers, err)
	}

	// A change of peers: a no longer has b. What a sent to b's address
	// goes nowhere; c is still a's peer, with its session.
	changed := parts["a"]
	changed.Peers = changed.Peers[1:]
	m.declare("a", overlayBody(t, changed))
	checkFor(t, 15*time.Second, func() error {
		if _, peers, err := wgDump(a); err != nil || len(peers) != 1 || peers[pub["c"]] == nil {
			return fmt.Errorf("a's peers after the change: %v %v", peers, err)
		}
		if got := tookRE.FindAllStringSubmatch(a.logs.String(), -1); len(got) < 2 || got[len(got)-1][1] != "changed the overlay" {
			return errors.New("a does not say it changed the overlay")
		}
		return nil
	})
	got := tookRE.FindAllStringSubmatch(a.logs.String(), -1)
	t.Logf("a: changed the overlay's peers in %s", got[len(got)-1][2])
	if err := na.reaches(over(b4, serveB), time.Second); err == nil {
		t.Fatal("a reaches b with no peer b")
	}
	if err := nc.reaches(over(a4, serveA), 2*time.Second); err != nil {
		t.Fatalf("c no longer reaches a after a's change: %v", err)
	}

	// a killed (SIGKILL: none of its own stopping runs) loses its
	// interface with it (the kernel removes a TUN device with its last
	// descriptor) and leaves forwarding on; started again, it brings the
	// overlay last applied back by itself, with the same key, and c
	// reaches it again. Forwarding is checked below, when it stops.
	a.kill()
	checkFor(t, 15*time.Second, func() error {
		if out, err := runErr("ip", "-n", na.name, "link", "show", protocol.OverlayInterface); err == nil {
			return fmt.Errorf("a killed, its interface is still there:\n%s", out)
		}
		return nil
	})
	a.start()
	checkFor(t, 15*time.Second, func() error {
		iface, peers, err := wgDump(a)
		if err != nil || iface[0] != pub["a"] || len(peers) != 1 || peers[pub["c"]] == nil {
			return fmt.Errorf("a started again: %v %v %v", iface, peers, err)
		}
		return nil
	})
	// c, behind NAT, is the one to shake hands again: it does once what
	// it sent found no answer for 15 s (WireGuard's keepalive and rekey
	// timeouts); a, restarted, has no endpoint to dial c at.
	again := time.Now()
	checkFor(t, 30*time.Second, func() error { return nc.reaches(over(a4, serveA), 2*time.Second) })
	t.Logf("c reaches a started again within %s", time.Since(again).Round(time.Millisecond))

	// A declaration without an overlay takes c's interface down and its
	// configuration away.
	m.declare("c", `{"modules": []}`)
	checkFor(t, 15*time.Second, func() error {
		if f := m.overlayFact("c", protocol.FactOverlay); f.Value != protocol.OverlayDown {
			return fmt.Errorf("c's overlay: %+v", f)
		}
		return nil
	})
	if out, err := runErr("ip", "-n", nc.name, "link", "show", protocol.OverlayInterface); err == nil {
		t.Fatalf("c's interface is still there:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(c.state, "mesh0.conf")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("c's configuration is still there: %v", err)
	}

	// Stopping a host takes its interface away and puts forwarding back
	// as it was before the host relayed, not as the killed one left it.
	a.stop()
	if out, err := runErr("ip", "-n", na.name, "link", "show", protocol.OverlayInterface); err == nil {
		t.Fatalf("a stopped, its interface is still there:\n%s", out)
	}
	if out, err := runErr("ip", "netns", "exec", na.name, "cat", "/proc/sys/net/ipv4/ip_forward"); err != nil || out != forwardWas {
		t.Fatalf("a stopped, forwarding is %q, was %q: %v", out, forwardWas, err)
	}

	// No private key anywhere but in its file: not in a log, not in
	// anything a host sent, not in the controller's facts.
	b.stop()
	c.stop()
	sent.mu.Lock()
	all := sent.all
	sent.mu.Unlock()
	if len(all) == 0 || sent.beat("a").At.IsZero() {
		t.Fatal("nothing heard from the hosts: the search below would prove nothing")
	}
	for _, h := range hosts {
		raw, err := os.ReadFile(filepath.Join(h.state, "wireguard.key"))
		if err != nil {
			t.Fatal(err)
		}
		key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(raw)))
		if err != nil || len(key) != 32 {
			t.Fatalf("%s's key file: %v", h.node, err)
		}
		forms := []string{base64.StdEncoding.EncodeToString(key), hex.EncodeToString(key)}
		for _, form := range forms {
			for _, other := range hosts {
				if strings.Contains(other.logs.String(), form) {
					t.Fatalf("%s's private key is in %s's log", h.node, other.node)
				}
			}
			for _, msg := range all {
				if strings.Contains(string(msg), form) {
					t.Fatalf("%s's private key went over the broker", h.node)
				}
			}
			for _, f := range m.node(h.node).Facts {
				if strings.Contains(f.Value+f.Why, form) {
					t.Fatalf("%s's private key is in its fact %s", h.node, f.Name)
				}
			}
		}
		if conf, err := os.Stat(filepath.Join(h.state, "mesh0.conf")); err == nil && conf.Mode().Perm() != 0o600 {
			t.Fatalf("%s's configuration is %v", h.node, conf.Mode())
		}
	}
	t.Logf("%d messages from the hosts searched for their private keys", len(all))
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
