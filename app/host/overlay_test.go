package host

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"filippo.io/age"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"mesh-controller/app/protocol"
)

// savedState is a joined host's state dir as join leaves it, without the
// broker: keys made here, the controller's key given.
func savedState(t *testing.T) *State {
	t.Helper()
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	wg, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	st := &State{Dir: filepath.Join(t.TempDir(), "state"), Node: "web1", HostKey: priv, Age: id, Creds: "creds",
		ControllerKey: pub, BrokerURLs: []string{"nats://127.0.0.1:4222"}, WireGuard: wg}
	if err := st.save(); err != nil {
		t.Fatal(err)
	}
	return st
}

func TestState_WireGuardKey(t *testing.T) {
	st := savedState(t)
	file := filepath.Join(st.Dir, fileWireGuard)
	fi, err := os.Stat(file)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the key file: %v %v", fi, err)
	}
	back, err := Load(st.Dir)
	if err != nil || back.WireGuard != st.WireGuard {
		t.Fatalf("loaded back: %v", err)
	}

	t.Run("joined before the overlay", func(t *testing.T) {
		if err := os.Remove(file); err != nil {
			t.Fatal(err)
		}
		old, err := Load(st.Dir)
		if err != nil || old.WireGuard != (wgtypes.Key{}) {
			t.Fatalf("a state dir without a key loads with none: %v", err)
		}
		if err := old.EnsureWireGuardKey(); err != nil {
			t.Fatal(err)
		}
		made := old.WireGuard
		if made == (wgtypes.Key{}) {
			t.Fatal("no key made")
		}
		if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("the key made: %v %v", fi, err)
		}
		if err := old.EnsureWireGuardKey(); err != nil || old.WireGuard != made {
			t.Fatalf("a second run changed the key: %v", err)
		}
		again, err := Load(st.Dir)
		if err != nil || again.WireGuard != made {
			t.Fatalf("the key made is not the one kept: %v", err)
		}
	})

	t.Run("damaged", func(t *testing.T) {
		if err := os.WriteFile(file, []byte("not a key\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(st.Dir); err == nil || !strings.Contains(err.Error(), "wireguard.key is damaged") || strings.Contains(err.Error(), "not a key") {
			t.Fatalf("a damaged key: %v", err)
		}
	})
}

// testOverlay is a node's part with two peers, one dialled and relayed
// for, one behind NAT.
func testOverlay(t *testing.T) *protocol.DeclaredOverlay {
	t.Helper()
	k1, _ := wgtypes.GeneratePrivateKey()
	k2, _ := wgtypes.GeneratePrivateKey()
	return &protocol.DeclaredOverlay{Interface: protocol.OverlayInterface, Address4: "100.64.0.1/10", Address6: "fd6d:6573:6800::1/48",
		ListenPort: 51820, Peers: []protocol.DeclaredPeer{
			{Node: "b", PublicKey: k1.PublicKey().String(), Endpoint: "192.0.2.2:51820", AllowedIPs: []string{"100.64.0.2/32", "fd6d:6573:6800::2/128"}, Relays: true},
			{Node: "c", PublicKey: k2.PublicKey().String(), AllowedIPs: []string{"100.64.0.3/32", "fd6d:6573:6800::3/128"}, Keepalive: protocol.OverlayKeepalive, Via: []string{"d"}},
		}}
}

// The host judges an overlay by protocol.CheckOverlay (its cases are
// tested there) with its own public key: a peer declared with it is
// refused; a host without a key yet refuses none for it.
func TestCheckOverlay(t *testing.T) {
	own, _ := wgtypes.GeneratePrivateKey()
	if err := checkOverlay(testOverlay(t), own); err != nil {
		t.Fatalf("a good overlay: %v", err)
	}
	o := testOverlay(t)
	o.Peers[1].PublicKey = own.PublicKey().String()
	if err := checkOverlay(o, own); err == nil || err.Error() != "peer c: the public key is this host's own" {
		t.Fatalf("its own key: %v", err)
	}
	if err := checkOverlay(o, wgtypes.Key{}); err != nil {
		t.Fatalf("no key yet: %v", err)
	}
}

// The refusal comes from apply, before any file: the declaration's
// modules are not written.
func TestApply_OverlayRefused(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	st := &State{Node: "web1", ControllerKey: pub}
	root := t.TempDir()
	o := testOverlay(t)
	o.Peers[0].AllowedIPs = []string{"not-a-prefix"}
	env := sealed(t, priv, map[string]any{"node": "web1", "serial": 1, "modules": []any{module("a", "/srv/a")}, "overlay": o})
	report, after := apply(st, root, applied{}, env, nil, nil)
	if report.OK || report.Error != `refused: the overlay: peer b: allowed IP "not-a-prefix" is not a prefix` || after.Serial != 0 {
		t.Fatalf("%+v", report)
	}
	if _, err := os.Stat(filepath.Join(root, "srv/a")); err == nil {
		t.Fatal("a refused overlay let the declaration's data be made")
	}
	o.Peers[0].AllowedIPs = []string{"100.64.0.2/32"}
	env = sealed(t, priv, map[string]any{"node": "web1", "serial": 1, "modules": []any{}, "overlay": o})
	report, after = apply(st, root, applied{}, env, nil, nil)
	if !report.OK || after.Overlay == nil || after.Overlay.Peers[0].Node != "b" {
		t.Fatalf("a good overlay is not remembered: %+v", report)
	}
}

// wgTool finds a tool of wireguard-tools, failing where make test
// installs it and skipping elsewhere.
func wgTool(t *testing.T, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if os.Getenv("MESH_TEST_TOOLS") != "" || os.Getenv("CI") != "" {
		t.Fatalf("%s is not installed (apt-get install wireguard-tools)", name)
	}
	t.Skipf("%s is not installed (apt-get install wireguard-tools)", name)
	return ""
}

// The configuration is wg-quick's: wg-quick itself parses it, and what it
// strips for wg is exactly the interface's and the peers' settings.
func TestOverlayConfig_WgQuick(t *testing.T) {
	wgQuick := wgTool(t, "wg-quick")
	key, _ := wgtypes.GeneratePrivateKey()
	o := testOverlay(t)
	file := filepath.Join(t.TempDir(), fileOverlayConf)
	if err := writeFile(file, overlayConfig(o, key, 7)); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the configuration's mode: %v %v", fi, err)
	}
	out, err := exec.Command(wgQuick, "strip", file).CombinedOutput()
	if err != nil {
		t.Fatalf("wg-quick strip: %v: %s", err, redact(string(out), key))
	}
	// wg-quick strip keeps comments: the settings are what is compared.
	var kept []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if !strings.HasPrefix(line, "#") {
			kept = append(kept, line)
		}
	}
	got := strings.Join(kept, "\n") + "\n"
	want := "[Interface]\nPrivateKey = " + key.String() + "\nListenPort = 51820\n\n" +
		"[Peer]\nPublicKey = " + o.Peers[0].PublicKey + "\nEndpoint = 192.0.2.2:51820\nAllowedIPs = 100.64.0.2/32, fd6d:6573:6800::2/128\n\n" +
		"[Peer]\nPublicKey = " + o.Peers[1].PublicKey + "\nAllowedIPs = 100.64.0.3/32, fd6d:6573:6800::3/128\nPersistentKeepalive = 25\n"
	if got != want {
		t.Fatalf("wg-quick strip says:\n%s\nwant:\n%s", redact(got, key), redact(want, key))
	}
	if b, _ := os.ReadFile(file); !strings.Contains(string(b), "Address = 100.64.0.1/10, fd6d:6573:6800::1/48\n") {
		t.Fatalf("no Address line:\n%s", redact(string(b), key))
	}
}

// redact hides a private key in what a test prints, in both its forms.
func redact(s string, key wgtypes.Key) string {
	s = strings.ReplaceAll(s, key.String(), "(private key)")
	return strings.ReplaceAll(s, hex.EncodeToString(key[:]), "(private key)")
}

// A heartbeat with 100 peers' handshakes stays small (a relay of a mesh
// of a hundred beats with it every interval), and one with the most it
// carries far below a host's 1 MiB message.
func TestHeartbeat_PeersSize(t *testing.T) {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	now := time.Now().UTC()
	for _, c := range []struct{ peers, most int }{{100, 16 << 10}, {MaxHeartbeatPeers, 128 << 10}} {
		body := protocol.HeartbeatBody{At: now, IntervalS: 10, SerialApplied: 1234, UptimeS: 86400}
		for i := range c.peers {
			at := now.Add(-time.Duration(i) * time.Second)
			body.Peers = append(body.Peers, protocol.PeerHandshake{Node: fmt.Sprintf("node-%03d", i), At: &at})
		}
		b, err := protocol.Sign(priv, body)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > c.most {
			t.Fatalf("a heartbeat with %d peers is %d bytes", c.peers, len(b))
		}
		t.Logf("a signed heartbeat with %d peers' handshakes: %d bytes", c.peers, len(b))
	}
}

// A host that brings no interface up (here --no-overlay-interface; not
// root or no TUN take the same way) writes the configuration all the same,
// says why in its facts, and never fails the apply for it; a declaration
// without the overlay takes the configuration away.
func TestRunner_OverlayConfigOnly(t *testing.T) {
	st := savedState(t)
	var log strings.Builder
	r := &Runner{State: st, Log: slog.New(slog.NewTextHandler(&log, nil)), NoOverlayInterface: true}
	o := testOverlay(t)
	r.last.Overlay = o
	if err := r.setOverlay(o, 3); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(st.Dir, fileOverlayConf)
	b, err := os.ReadFile(conf)
	if err != nil || !strings.Contains(string(b), "PrivateKey = "+st.WireGuard.String()) {
		t.Fatalf("the configuration: %v", err)
	}
	if fi, _ := os.Stat(conf); fi.Mode().Perm() != 0o600 {
		t.Fatalf("the configuration is %v", fi.Mode())
	}
	facts := map[string]protocol.Fact{}
	for _, f := range r.overlayFacts() {
		facts[f.Name] = f
	}
	if facts[protocol.FactWireGuardKey].Value != st.WireGuard.PublicKey().String() {
		t.Fatalf("the key fact: %+v", facts[protocol.FactWireGuardKey])
	}
	if f := facts[protocol.FactOverlay]; f.Value != protocol.OverlayUnavailable || !strings.Contains(f.Why, "--no-overlay-interface") || !strings.Contains(f.Why, conf) {
		t.Fatalf("the overlay fact: %+v", f)
	}
	if _, ok := facts[protocol.FactOverlayForwarding]; ok {
		t.Fatal("forwarding turned on with no interface")
	}
	// Its peers are reported, none with a handshake.
	hs := r.peerHandshakes()
	if len(hs) != 2 || hs[0].Node != "b" || hs[0].At != nil || hs[1].Node != "c" || hs[1].At != nil {
		t.Fatalf("handshakes: %+v", hs)
	}
	r.last.Overlay = nil
	if err := r.setOverlay(nil, 4); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(conf); !os.IsNotExist(err) {
		t.Fatalf("the configuration stays: %v", err)
	}
	if f := r.overlayFacts(); len(f) != 2 || f[1].Value != protocol.OverlayDown || !strings.Contains(f[1].Why, "declaration 4 carries no overlay") {
		t.Fatalf("after: %+v", f)
	}
	if r.peerHandshakes() != nil {
		t.Fatal("handshakes reported without an overlay")
	}
	// Down already: the next declaration without one takes nothing down.
	if err := r.setOverlay(nil, 5); err != nil {
		t.Fatal(err)
	}
	if f := r.overlayFacts(); len(f) != 2 || !strings.Contains(f[1].Why, "declaration 4 carries no overlay") {
		t.Fatalf("taken down again by declaration 5: %+v", f)
	}
	many := testOverlay(t)
	for len(many.Peers) <= MaxHeartbeatPeers {
		many.Peers = append(many.Peers, many.Peers[0])
	}
	r.last.Overlay = many
	if got := len(r.peerHandshakes()); got != MaxHeartbeatPeers {
		t.Fatalf("a heartbeat carries %d peers", got)
	}
	if s := redact(log.String(), st.WireGuard); s != log.String() {
		t.Fatalf("the private key is in the log:\n%s", s)
	}
}

func TestQuieter(t *testing.T) {
	q := &quieter{seen: map[string]time.Time{}}
	now := time.Now()
	if !q.says("a", now) || q.says("a", now.Add(59*time.Second)) || !q.says("b", now) || !q.says("a", now.Add(61*time.Second)) {
		t.Fatal("a line is said once a minute, each line for itself")
	}
	for i := range 2 * maxQuiet {
		q.says(fmt.Sprint(i), now)
	}
	if len(q.seen) > maxQuiet {
		t.Fatalf("remembers %d lines", len(q.seen))
	}
}
