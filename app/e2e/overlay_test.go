package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"mesh-controller/app"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/inventory"
)

// wgKey is a stand-in WireGuard public key: 32 bytes, base64, one per name.
func wgKey(name string) string {
	sum := sha256.Sum256([]byte("wg " + name))
	return base64.StdEncoding.EncodeToString(sum[:])
}

// reportedKey waits for the WireGuard public key a host made and reported
// in its facts, and returns it.
func reportedKey(t *testing.T, m *testMesh, h *testHost) string {
	t.Helper()
	ctx := context.Background()
	st, err := m.c.Stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var key string
	checkFor(t, settle, func() error {
		facts, _, err := st.Inventory.Facts(ctx, h.name)
		for _, f := range facts {
			if err == nil && f.Name == protocol.FactWireGuardKey {
				key = f.Value
			}
		}
		if err == nil && key == "" {
			err = fmt.Errorf("%s has not reported its WireGuard key in its %d facts", h.name, len(facts))
		}
		return err
	})
	return key
}

// declaredOverlay is the overlay part of a node's latest declaration, once
// its host has applied it; nil until then.
func declaredOverlay(t *testing.T, m *testMesh, node string) (*protocol.DeclaredOverlay, bool) {
	t.Helper()
	st, err := m.c.Stores(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	d, err := st.Inventory.LatestDeclaration(context.Background(), node)
	if err != nil || d == nil {
		return nil, false
	}
	var body protocol.Declaration
	if err := json.Unmarshal([]byte(d.Body), &body); err != nil {
		t.Fatal(err)
	}
	return body.Overlay, m.node(node).SerialApplied >= d.Serial
}

// Three real hosts, two public and one behind NAT, and a fourth node
// behind NAT on another site: each host applies a declaration whose
// overlay part is as computed, and the configurations agree pair by pair.
// Then the NAT'd node's heartbeats report a silent peer, and a handshake.
func TestOverlay_ThreeHosts(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	ctx := context.Background()
	hosts := map[string]*testHost{}
	for _, n := range []string{"pub1", "pub2", "nat1"} {
		hosts[n] = m.join(n)
	}
	// nat2's host is elsewhere: its key is recorded as its facts report
	// would record it.
	st, err := m.c.Stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.c.NodeAdd(ctx, "nat2", false); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Inventory.RecordFacts(ctx, "nat2", []inventory.Fact{{Name: protocol.FactWireGuardKey, Value: wgKey("nat2"), Why: "wg pubkey"}}, nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct {
		node string
		p    app.Placement
	}{
		{"pub1", app.Placement{Endpoint: "127.0.0.1:51821", Public: true}},
		{"pub2", app.Placement{Endpoint: "pub2.example.org:51822", Public: true}},
		{"nat1", app.Placement{Site: "home"}},
		{"nat2", app.Placement{Site: "office"}},
	} {
		if _, err := m.c.OverlayPlace(ctx, p.node, p.p); err != nil {
			t.Fatal(err)
		}
	}
	keys := map[string]string{"nat2": wgKey("nat2")}
	for n, h := range hosts {
		keys[n] = reportedKey(t, m, h)
	}
	mesh, err := m.c.OverlayShow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	checkFor(t, settle, func() error {
		if mesh, err = m.c.OverlayShow(ctx); err != nil {
			t.Fatal(err)
		}
		if len(mesh.Declared) != 4 {
			return fmt.Errorf("the mesh computed %d nodes' overlay parts, not 4: %s", len(mesh.Declared), sortedKeys(mesh.Declared))
		}
		return nil
	})
	got := map[string]*protocol.DeclaredOverlay{}
	checkFor(t, settle, func() error {
		for n := range hosts {
			d, applied := declaredOverlay(t, m, n)
			want, _ := json.Marshal(mesh.Declared[n])
			have, _ := json.Marshal(d)
			if !applied {
				return fmt.Errorf("%s has not applied its latest declaration", n)
			}
			if string(want) != string(have) {
				return fmt.Errorf("%s's overlay part is not as computed:\n%s\nwant\n%s", n, have, want)
			}
			got[n] = d
		}
		return nil
	})
	peer := func(of, name string) protocol.DeclaredPeer {
		t.Helper()
		i := slices.IndexFunc(got[of].Peers, func(p protocol.DeclaredPeer) bool { return p.Node == name })
		if i < 0 {
			t.Fatalf("%s has no peer %s: %+v", of, name, got[of].Peers)
		}
		return got[of].Peers[i]
	}
	// pub1 is the relay (the first public node by name): pub2 and nat1
	// peer with it alone, and reach each other (and nat2) through it.
	for a, want := range map[string]int{"pub1": 3, "pub2": 1, "nat1": 1} {
		if len(got[a].Peers) != want {
			t.Errorf("%s has %d peers, want %d", a, len(got[a].Peers), want)
		}
	}
	for _, pair := range [][2]string{{"pub1", "pub2"}, {"pub1", "nat1"}} {
		a, b := pair[0], pair[1]
		ab, ba := peer(a, b), peer(b, a)
		if ab.PublicKey != keys[b] || ba.PublicKey != keys[a] {
			t.Errorf("%s-%s: keys %s, %s", a, b, ab.PublicKey, ba.PublicKey)
		}
		if own := strings.Replace(got[a].Address4, "/10", "/32", 1); ba.AllowedIPs[0] != own {
			t.Errorf("%s allows %v for %s, whose address is %s", b, ba.AllowedIPs, a, got[a].Address4)
		}
		if own := strings.Replace(got[b].Address4, "/10", "/32", 1); ab.AllowedIPs[0] != own {
			t.Errorf("%s allows %v for %s, whose address is %s", a, ab.AllowedIPs, b, got[b].Address4)
		}
		if ab.Endpoint == "" && ba.Endpoint == "" {
			t.Errorf("%s and %s: neither dials the other", a, b)
		}
	}
	if p := peer("nat1", "pub1"); p.Keepalive != protocol.OverlayKeepalive || !slices.Equal(p.Via, []string{"nat2", "pub2"}) || len(p.AllowedIPs) != 6 {
		t.Errorf("nat1's relay pub1: %+v", p)
	}
	if p := peer("pub2", "pub1"); !slices.Equal(p.Via, []string{"nat1", "nat2"}) || p.Keepalive != 0 {
		t.Errorf("pub2's relay pub1: %+v", p)
	}
	if !peer("pub1", "nat1").Relays || !peer("pub1", "pub2").Relays || peer("pub1", "nat1").Endpoint != "" {
		t.Errorf("pub1 relays for nat1 and pub2: %+v, %+v", peer("pub1", "nat1"), peer("pub1", "pub2"))
	}
	if got["pub1"].ListenPort != 51821 || got["nat1"].ListenPort != protocol.OverlayPort {
		t.Errorf("listen ports %d, %d", got["pub1"].ListenPort, got["nat1"].ListenPort)
	}
	in, _, err := m.c.FilterFor(ctx, "pub1", false)
	if err != nil {
		t.Fatal(err)
	}
	if in.OverlayPort != 51821 || !in.OverlayRelay || len(in.Overlay) != 2 || in.Overlay[1].String() != mesh.Prefix6 {
		t.Errorf("pub1's filter input: %+v", in)
	}

	t.Run("handshakes", func(t *testing.T) {
		// nat1's host is stopped: its heartbeats are published here, with
		// the peers a host with an overlay reports.
		nat1 := hosts["nat1"]
		nat1.stop()
		nc := connectAs(t, m.url, nat1.state)
		beat := func(pub1 *time.Time) {
			t.Helper()
			old := time.Now().Add(-time.Hour)
			b, err := protocol.Sign(nat1.state.HostKey, protocol.HeartbeatBody{At: time.Now(), IntervalS: 1,
				Peers: []protocol.PeerHandshake{{Node: "pub1", At: pub1}, {Node: "pub2", At: ptr(time.Now())}, {Node: "pub3", At: &old}}})
			if err != nil {
				t.Fatal(err)
			}
			if err := nc.Publish(protocol.NodeSubject("nat1", protocol.Heartbeat), b); err != nil {
				t.Fatal(err)
			}
			nc.Flush()
		}
		silent := func() []string {
			peers, err := st.Inventory.SilentPeers(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, p := range peers {
				out = append(out, p.Node+"/"+p.Peer)
			}
			return out
		}
		long := time.Now().Add(-protocol.OverlayPeerSilentAfter - time.Minute)
		// A host beats no faster than its budget allows: each poll beats
		// again, as a host keeps beating.
		silentAre := func(want ...string) func() error {
			return func() error {
				if got := silent(); !slices.Equal(got, want) {
					return fmt.Errorf("the silent peers are %q, not %q", got, want)
				}
				return nil
			}
		}
		checkFor(t, settle, func() error {
			beat(&long)
			return silentAre("nat1/pub1", "nat1/pub3")()
		})
		if !m.openAfterCheck(t, "node.overlay-peer-silent/nat1/pub1") {
			t.Fatal("no node.overlay-peer-silent/nat1/pub1")
		}
		if m.open(t, "node.overlay-peer-silent/nat1/pub2") {
			t.Fatal("raised for a peer heard just now")
		}
		checkFor(t, settle, func() error {
			beat(ptr(time.Now()))
			return silentAre("nat1/pub3")()
		})
		if m.openAfterCheck(t, "node.overlay-peer-silent/nat1/pub1") {
			t.Fatal("node.overlay-peer-silent/nat1/pub1 still open after a handshake")
		}
	})
}

// Issue 28, item 3: a host that reports another node's WireGuard key. c1's
// host is stopped and a facts report carrying a1's key is published signed
// with c1's host key, as a hostile host would: the key is refused
// (overlay.key-conflict names c1 and a1), a1 keeps its key, and modules
// assigned to a1 and b1 after are applied by both: neither host is
// declared a peer it refuses (a1's own key on c1, or one key twice).
func TestOverlay_KeyOfAnotherRefused(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	ctx := context.Background()
	hosts := map[string]*testHost{}
	for i, n := range []string{"a1", "b1", "c1"} {
		hosts[n] = m.join(n)
		if _, err := m.c.OverlayPlace(ctx, n, app.Placement{Endpoint: fmt.Sprintf("127.0.0.1:%d", 51831+i), Public: true}); err != nil {
			t.Fatal(err)
		}
	}
	keys := map[string]string{}
	for n, h := range hosts {
		keys[n] = reportedKey(t, m, h)
	}
	checkFor(t, settle, func() error {
		for n := range hosts {
			if d, applied := declaredOverlay(t, m, n); !applied || d == nil || len(d.Peers) != 2 {
				return fmt.Errorf("%s has not applied a declaration peering with the two others: applied %v, %s", n, applied, jsonText(d))
			}
		}
		return nil
	})

	c1 := hosts["c1"]
	c1.stop()
	nc := connectAs(t, m.url, c1.state)
	b, err := protocol.Sign(c1.state.HostKey, protocol.FactsBody{Facts: []protocol.Fact{
		{Name: protocol.FactWireGuardKey, Value: keys["a1"], Why: "not mine"}, {Name: "arch", Value: "amd64", Why: "uname -m"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish(protocol.NodeSubject("c1", protocol.FactsReport), b); err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	st, err := m.c.Stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	checkFor(t, settle, func() error {
		rs, err := st.Inventory.KeyRefusals(ctx)
		if err == nil && (len(rs) != 1 || rs[0].Node != "c1" || rs[0].Holder != "a1") {
			err = fmt.Errorf("the key refusals are %+v, not c1's of a1's key", rs)
		}
		return err
	})
	o, err := st.Inventory.ReadOverlay(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range o.Nodes {
		if want := map[string]string{"a1": keys["a1"], "b1": keys["b1"]}[n.Name]; n.Key != want {
			t.Errorf("%s's recorded key %q, want %q", n.Name, n.Key, want)
		}
	}
	// The serving controller's own self-check may run beside this one on
	// what it read before the refusal was kept (facts are kept by a writer
	// of their own): the condition is waited for, not taken from one check.
	checkFor(t, settle, func() error {
		if !m.openAfterCheck(t, "overlay.key-conflict/c1") {
			return errors.New("no overlay.key-conflict/c1")
		}
		return nil
	})
	cs, err := m.c.Conditions(ctx, app.ConditionFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		if c.Key == "overlay.key-conflict/c1" && (c.Evidence["holder"] != "a1" || !strings.Contains(c.Summary, "c1's host reported the WireGuard key a1 holds")) {
			t.Errorf("%+v", c)
		}
		if strings.HasPrefix(c.Key, "node.apply-failed/") || strings.HasPrefix(c.Key, "overlay.peer-refused/") {
			t.Errorf("open: %s: %s", c.Key, c.Summary)
		}
	}

	// Unrelated assigns still apply on a1 and b1, each peering with the
	// other alone, by its own key.
	m.addModule(writeManifest(t, `{"module": "teller", "version": "1.0.0"}`))
	for _, n := range []string{"a1", "b1"} {
		if _, err := m.c.Assign(ctx, n, []string{"teller"}); err != nil {
			t.Fatal(err)
		}
	}
	for _, pair := range [][2]string{{"a1", "b1"}, {"b1", "a1"}} {
		n, other := pair[0], pair[1]
		checkFor(t, settle, func() error {
			v := m.node(n)
			d, err := st.Inventory.LatestDeclaration(ctx, n)
			if err != nil || d == nil || !strings.Contains(d.Body, `"teller"`) || v.SerialApplied < d.Serial {
				if o := v.LastApply; o != nil && !o.OK {
					t.Fatalf("%s refused declaration %d: %s", n, o.Serial, o.Error)
				}
				if err == nil {
					err = fmt.Errorf("%s has not applied a declaration with teller: applied %d, declared %d", n, v.SerialApplied, v.SerialDeclared)
				}
				return err
			}
			return nil
		})
		d, _ := declaredOverlay(t, m, n)
		if len(d.Peers) != 1 || d.Peers[0].Node != other || d.Peers[0].PublicKey != keys[other] {
			t.Errorf("%s's peers: %+v", n, d.Peers)
		}
	}
}
