package host

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/ipc"
	"golang.zx2c4.com/wireguard/tun"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"mesh-controller/app/protocol"
)

// The overlay on this machine: the declaration's part of the mesh's
// private network (protocol.DeclaredOverlay) becomes a wg-quick
// configuration in the state dir, always, and, where the host may (root,
// a TUN device), a userspace WireGuard interface (wireguard-go) run inside
// the host's own process: it lives and dies with the host, needs no
// kernel module, and answers wg(8) on its UAPI socket like any other.
// What the host cannot do is said in its facts, never a failed apply: the
// rest of the declaration does not wait for a network it cannot make.

// overlayMTU is the interface's MTU: 1500 less WireGuard's overhead over
// IPv6 (80 bytes), as wg-quick chooses it.
const overlayMTU = 1420

// fileOverlayConf is the interface's configuration in wg-quick's format,
// in the state dir (0600: it holds the private key).
const fileOverlayConf = protocol.OverlayInterface + ".conf"

// resolveWithin bounds the resolution of a peer's endpoint given by name.
const resolveWithin = 2 * time.Second

// forwardingFiles are the sysctls a relay turns on, in its own network
// namespace: IPv4 and IPv6 forwarding.
var forwardingFiles = []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"}

// checkOverlay says why a declared overlay cannot be applied as it is, in
// one line, or nil: judged before any of its declaration is applied, by
// the rules the controller judges each overlay part by before declaring
// it (protocol.CheckOverlay), with this host's own public key.
func checkOverlay(o *protocol.DeclaredOverlay, own wgtypes.Key) error {
	ownPublic := ""
	if own != (wgtypes.Key{}) {
		ownPublic = own.PublicKey().String()
	}
	return protocol.CheckOverlay(o, ownPublic)
}

// listenPort is the port the interface listens on: the declared one, or
// protocol.OverlayPort when none is said.
func listenPort(o *protocol.DeclaredOverlay) int {
	if o.ListenPort == 0 {
		return protocol.OverlayPort
	}
	return o.ListenPort
}

// addresses are the interface's own addresses, as declared.
func addresses(o *protocol.DeclaredOverlay) []string {
	var as []string
	for _, a := range []string{o.Address4, o.Address6} {
		if a != "" {
			as = append(as, a)
		}
	}
	return as
}

// overlayConfig is the wg-quick configuration of a declared overlay (as
// checkOverlay passed it), with the host's private key.
func overlayConfig(o *protocol.DeclaredOverlay, key wgtypes.Key, serial int64) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "# The mesh's overlay (%s), as declaration %d declares it; written by mesh-host, which\n", protocol.OverlayInterface, serial)
	b.WriteString("# brings the interface up itself: this file is for wg-quick where mesh-host cannot.\n")
	b.WriteString("[Interface]\n")
	fmt.Fprintf(&b, "PrivateKey = %s\n", key)
	fmt.Fprintf(&b, "Address = %s\n", strings.Join(addresses(o), ", "))
	fmt.Fprintf(&b, "ListenPort = %d\n", listenPort(o))
	for _, p := range o.Peers {
		fmt.Fprintf(&b, "\n# %s\n[Peer]\n", p.Node)
		fmt.Fprintf(&b, "PublicKey = %s\n", p.PublicKey)
		if p.Endpoint != "" {
			fmt.Fprintf(&b, "Endpoint = %s\n", p.Endpoint)
		}
		fmt.Fprintf(&b, "AllowedIPs = %s\n", strings.Join(p.AllowedIPs, ", "))
		if p.Keepalive > 0 {
			fmt.Fprintf(&b, "PersistentKeepalive = %d\n", p.Keepalive)
		}
	}
	return []byte(b.String())
}

// relays says whether this node relays for any of its peers: it then
// forwards packets between them.
func relays(o *protocol.DeclaredOverlay) bool {
	if o == nil {
		return false
	}
	for _, p := range o.Peers {
		if p.Relays {
			return true
		}
	}
	return false
}

// overlayUsable says why this host cannot (or may not: configOnly) bring
// the interface up, or nil.
func overlayUsable(configOnly bool) error {
	if configOnly {
		return errors.New("mesh-host runs with --no-overlay-interface: it brings no interface up")
	}
	if os.Geteuid() != 0 {
		return errors.New("this host does not run as root: it cannot make the overlay's interface")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		return errors.New("no /dev/net/tun: this host cannot make the overlay's interface (modprobe tun)")
	}
	if _, err := ipBin(); err != nil {
		return err
	}
	return nil
}

// ipBin finds the ip tool (iproute2) as nftBin finds nft.
func ipBin() (string, error) {
	return toolBin("ip", []string{"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"},
		"ip is not installed: this host cannot address the overlay's interface (apt-get install iproute2)")
}

// ip runs the ip tool; its error is one line with ip's own message.
func ip(args ...string) error {
	bin, err := ipBin()
	if err != nil {
		return err
	}
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		msg := strings.Join(strings.Fields(string(out)), " ")
		if msg == "" {
			msg = err.Error()
		}
		return fmt.Errorf("ip %s: %s", strings.Join(args, " "), msg)
	}
	return nil
}

// overlayLink is the overlay's interface, up in this process.
type overlayLink struct {
	dev  *device.Device
	uapi net.Listener
	// addrs are the addresses assigned to it; peers the public keys (hex)
	// of the peers configured, to remove those no longer declared.
	addrs []string
	peers map[string]bool
}

// openOverlay makes the interface: a TUN device, a WireGuard device on
// it, and the UAPI socket wg(8) talks to. Nothing is left behind on error.
func openOverlay(logf func(string, ...any)) (*overlayLink, error) {
	td, err := tun.CreateTUN(protocol.OverlayInterface, overlayMTU)
	if err != nil {
		return nil, fmt.Errorf("make the TUN device %s: %w", protocol.OverlayInterface, err)
	}
	// wireguard-go's errors are about peers (named by a shortened public
	// key) and packets: never a private key. A peer out of reach makes
	// the same one every few seconds: said once a minute.
	quiet := &quieter{seen: map[string]time.Time{}}
	dev := device.NewDevice(td, conn.NewDefaultBind(), &device.Logger{
		Verbosef: device.DiscardLogf,
		Errorf: func(format string, args ...any) {
			if line := fmt.Sprintf(format, args...); quiet.says(line, time.Now()) {
				logf("overlay: %s", line)
			}
		},
	})
	f, err := ipc.UAPIOpen(protocol.OverlayInterface)
	if err != nil {
		dev.Close()
		return nil, fmt.Errorf("open the UAPI socket of %s: %w", protocol.OverlayInterface, err)
	}
	l, err := ipc.UAPIListen(protocol.OverlayInterface, f)
	f.Close()
	if err != nil {
		dev.Close()
		return nil, fmt.Errorf("listen on the UAPI socket of %s: %w", protocol.OverlayInterface, err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return // closed
			}
			go dev.IpcHandle(c)
		}
	}()
	return &overlayLink{dev: dev, uapi: l, peers: map[string]bool{}}, nil
}

// quieter says a line once a minute at most; it remembers at most
// maxQuiet lines (forgetting them all when full: a line then said again
// early is harmless).
type quieter struct {
	mu   sync.Mutex
	seen map[string]time.Time
}

const maxQuiet = 256

func (q *quieter) says(line string, now time.Time) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if at, ok := q.seen[line]; ok && now.Sub(at) < time.Minute {
		return false
	}
	if len(q.seen) >= maxQuiet {
		clear(q.seen)
	}
	q.seen[line] = now
	return true
}

// close takes the interface down and away: the TUN device goes with the
// WireGuard device, and the socket with its file.
func (l *overlayLink) close() {
	l.uapi.Close()
	l.dev.Close()
	os.Remove(filepath.Join("/var/run/wireguard", protocol.OverlayInterface+".sock"))
}

// configure makes the interface what o declares: key, port and peers
// through the UAPI (peers no longer declared removed, the others updated
// in place, so their sessions survive), then its addresses, then up. It
// returns what it could not resolve, to say in the facts.
func (l *overlayLink) configure(o *protocol.DeclaredOverlay, key wgtypes.Key) (unresolved []string, err error) {
	var b strings.Builder
	fmt.Fprintf(&b, "private_key=%s\nlisten_port=%d\n", hex.EncodeToString(key[:]), listenPort(o))
	declared := map[string]bool{}
	for _, p := range o.Peers {
		k, _ := wgtypes.ParseKey(p.PublicKey) // judged by checkOverlay
		declared[hex.EncodeToString(k[:])] = true
	}
	for k := range l.peers {
		if !declared[k] {
			fmt.Fprintf(&b, "public_key=%s\nremove=true\n", k)
		}
	}
	for _, p := range o.Peers {
		k, _ := wgtypes.ParseKey(p.PublicKey)
		fmt.Fprintf(&b, "public_key=%s\nreplace_allowed_ips=true\n", hex.EncodeToString(k[:]))
		for _, a := range p.AllowedIPs {
			fmt.Fprintf(&b, "allowed_ip=%s\n", netip.MustParsePrefix(a).Masked())
		}
		if p.Endpoint != "" {
			ep, err := resolveEndpoint(p.Endpoint)
			if err != nil {
				unresolved = append(unresolved, fmt.Sprintf("%s's endpoint %s: %v", p.Node, p.Endpoint, err))
			} else {
				fmt.Fprintf(&b, "endpoint=%s\n", ep)
			}
		}
		fmt.Fprintf(&b, "persistent_keepalive_interval=%d\n", p.Keepalive)
	}
	if err := l.dev.IpcSet(b.String()); err != nil {
		return unresolved, fmt.Errorf("configure %s: %w", protocol.OverlayInterface, err)
	}
	l.peers = declared
	want := addresses(o)
	wanted := map[string]bool{}
	for _, a := range want {
		wanted[a] = true
	}
	for _, a := range l.addrs {
		if !wanted[a] {
			if err := ip("addr", "del", a, "dev", protocol.OverlayInterface); err != nil {
				return unresolved, err
			}
		}
	}
	l.addrs = nil
	for _, a := range want {
		if err := ip("addr", "replace", a, "dev", protocol.OverlayInterface); err != nil {
			return unresolved, err
		}
		l.addrs = append(l.addrs, a)
	}
	if err := ip("link", "set", protocol.OverlayInterface, "up"); err != nil {
		return unresolved, err
	}
	// The device follows the link up by itself, a moment later; up now,
	// so that the interface is up when this returns.
	if err := l.dev.Up(); err != nil {
		return unresolved, fmt.Errorf("bring %s up: %w", protocol.OverlayInterface, err)
	}
	return unresolved, nil
}

// resolveEndpoint is a peer's endpoint as the UAPI takes it: an address
// and a port, a name resolved.
func resolveEndpoint(ep string) (string, error) {
	host, port, _ := net.SplitHostPort(ep) // judged by checkOverlay
	if a, err := netip.ParseAddr(host); err == nil {
		return net.JoinHostPort(a.String(), port), nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), resolveWithin)
	defer cancel()
	as, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return "", errors.New(strings.TrimPrefix(err.Error(), "lookup "))
	}
	if len(as) == 0 {
		return "", errors.New("no address")
	}
	return net.JoinHostPort(as[0].Unmap().String(), port), nil
}

// handshakes are each peer's last handshake (zero: none), by public key
// in hex, as the device says.
func (l *overlayLink) handshakes() (map[string]time.Time, error) {
	s, err := l.dev.IpcGet()
	if err != nil {
		return nil, err
	}
	out := map[string]time.Time{}
	var key string
	var sec, nsec int64
	flush := func() {
		if key != "" && (sec != 0 || nsec != 0) {
			out[key] = time.Unix(sec, nsec).UTC()
		}
	}
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), "=")
		switch k {
		case "public_key":
			flush()
			key, sec, nsec = v, 0, 0
		case "last_handshake_time_sec":
			sec, _ = strconv.ParseInt(v, 10, 64)
		case "last_handshake_time_nsec":
			nsec, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	flush()
	return out, nil
}

// overlayState is the overlay as the host has it now: its interface, and
// what its facts say of it and of forwarding.
type overlayState struct {
	link *overlayLink
	// fact is FactOverlay; zero until an overlay is declared.
	fact protocol.Fact
	// forwarding is FactOverlayForwarding; zero on a host that never
	// relayed. forwardedWas holds each sysctl's value before this host
	// turned it on, to put back.
	forwarding   protocol.Fact
	forwardedWas map[string]string
}

// setOverlay makes the overlay what declaration serial declares, with
// r.mu held: its configuration written (removed when none is declared),
// and the interface brought up, changed or taken down where this host
// may. Only writing the configuration fails the apply; what becomes of
// the interface is said in the facts.
func (r *Runner) setOverlay(o *protocol.DeclaredOverlay, serial int64) error {
	conf := filepath.Join(r.State.Dir, fileOverlayConf)
	if o == nil {
		// A configuration left from an earlier life goes too. An overlay
		// down already (taken down, or never brought up: its configuration
		// is gone) is not taken down again by each later declaration.
		had := r.ov.link != nil || (r.ov.fact.Name != "" && r.ov.fact.Value != protocol.OverlayDown)
		r.stopOverlay()
		switch err := os.Remove(conf); {
		case err == nil:
			had = true
		case !errors.Is(err, os.ErrNotExist):
			return fmt.Errorf("remove the overlay's configuration: %w", err)
		}
		if !had {
			return nil
		}
		r.ov.fact = protocol.Fact{Name: protocol.FactOverlay, Value: protocol.OverlayDown,
			Why: fmt.Sprintf("declaration %d carries no overlay: %s taken down and its configuration removed", serial, protocol.OverlayInterface)}
		r.logf("took the overlay down: declaration %d carries none", serial)
		return nil
	}
	if err := writeFile(conf, overlayConfig(o, r.State.WireGuard, serial)); err != nil {
		return fmt.Errorf("write the overlay's configuration: %w", err)
	}
	if err := overlayUsable(r.NoOverlayInterface); err != nil {
		r.stopOverlay()
		r.ov.fact = protocol.Fact{Name: protocol.FactOverlay, Value: protocol.OverlayUnavailable,
			Why: fmt.Sprintf("%v; declaration %d's configuration is in %s (wg-quick up %s)", err, serial, conf, conf)}
		return nil
	}
	start := time.Now()
	fresh := r.ov.link == nil
	if fresh {
		l, err := openOverlay(r.logf)
		if err != nil {
			r.ov.fact = protocol.Fact{Name: protocol.FactOverlay, Value: protocol.OverlayDown, Why: err.Error()}
			r.warnf("overlay: %v", err)
			return nil
		}
		r.ov.link = l
	}
	unresolved, err := r.ov.link.configure(o, r.State.WireGuard)
	if err != nil {
		// Half configured is worse than down: what the host says is what is.
		r.stopOverlay()
		r.ov.fact = protocol.Fact{Name: protocol.FactOverlay, Value: protocol.OverlayDown, Why: err.Error()}
		r.warnf("overlay: %v", err)
		return nil
	}
	r.setForwarding(relays(o), serial)
	took := time.Since(start)
	why := fmt.Sprintf("declaration %d: %s up at %s with %d peers, listening on UDP %d", serial, protocol.OverlayInterface,
		strings.Join(addresses(o), ", "), len(o.Peers), listenPort(o))
	if len(unresolved) > 0 {
		why += "; not dialled: " + strings.Join(unresolved, "; ")
	}
	r.ov.fact = protocol.Fact{Name: protocol.FactOverlay, Value: protocol.OverlayUp, Why: why}
	if fresh {
		r.logf("brought the overlay up in %s: %s", took.Round(time.Microsecond), why)
	} else {
		r.logf("changed the overlay in %s: %s", took.Round(time.Microsecond), why)
	}
	return nil
}

// stopOverlay takes the interface down, if up, and puts forwarding back
// as it was, with r.mu held.
func (r *Runner) stopOverlay() {
	if r.ov.link != nil {
		r.ov.link.close()
		r.ov.link = nil
	}
	r.setForwarding(false, 0)
}

// fileForwardingWas keeps what the forwarding sysctls were before this
// host turned them on, in its state dir, until it puts them back: a host
// killed while relaying puts back, when it next stops, what was there
// before it, not its own "1".
const fileForwardingWas = "forwarding.was"

// setForwarding turns IP forwarding on in this host's network namespace
// for a relay, remembering what each sysctl was, and puts it back when
// the host relays no more (or stops), with r.mu held.
func (r *Runner) setForwarding(on bool, serial int64) {
	wasFile := filepath.Join(r.State.Dir, fileForwardingWas)
	if r.ov.forwardedWas == nil {
		if b, err := os.ReadFile(wasFile); err == nil {
			json.Unmarshal(b, &r.ov.forwardedWas) // a damaged file: what is there now is put back
		}
	}
	if !on {
		if r.ov.forwardedWas == nil {
			return
		}
		var failed []string
		for f, was := range r.ov.forwardedWas {
			if err := os.WriteFile(f, []byte(was+"\n"), 0o644); err != nil {
				failed = append(failed, err.Error())
			}
		}
		r.ov.forwardedWas = nil
		if err := os.Remove(wasFile); err != nil && !errors.Is(err, os.ErrNotExist) {
			failed = append(failed, err.Error())
		}
		r.ov.forwarding = protocol.Fact{Name: protocol.FactOverlayForwarding, Value: "off", Why: "this host relays for no peer: forwarding put back as it was"}
		if len(failed) > 0 {
			r.ov.forwarding.Why += "; putting it back failed: " + strings.Join(failed, "; ")
		}
		return
	}
	if r.ov.forwardedWas == nil || r.ov.forwarding.Value != "on" {
		was := map[string]string{}
		var failed []string
		for _, f := range forwardingFiles {
			b, err := os.ReadFile(f)
			if err != nil {
				failed = append(failed, err.Error())
				continue
			}
			was[f] = strings.TrimSpace(string(b))
		}
		// Kept from before a crash: what was there before this host.
		for f, v := range r.ov.forwardedWas {
			was[f] = v
		}
		if b, err := json.Marshal(was); err == nil && len(was) > 0 {
			if err := writeFile(wasFile, b); err != nil {
				failed = append(failed, err.Error())
			}
		}
		for f := range was {
			if err := os.WriteFile(f, []byte("1\n"), 0o644); err != nil {
				failed = append(failed, err.Error())
				delete(was, f)
			}
		}
		r.ov.forwardedWas = was
		if len(was) == 0 {
			r.ov.forwarding = protocol.Fact{Name: protocol.FactOverlayForwarding, Value: "off",
				Why: fmt.Sprintf("declaration %d makes this host a relay, but forwarding could not be turned on: %s", serial, strings.Join(failed, "; "))}
			return
		}
		why := fmt.Sprintf("declaration %d makes this host a relay: net.ipv4.ip_forward and net.ipv6.conf.all.forwarding on", serial)
		if len(failed) > 0 {
			why += "; not all: " + strings.Join(failed, "; ")
		}
		r.ov.forwarding = protocol.Fact{Name: protocol.FactOverlayForwarding, Value: "on", Why: why}
	}
}

// overlayFacts are the overlay's facts: the public key always, the
// interface's state and forwarding once said.
func (r *Runner) overlayFacts() []protocol.Fact {
	fs := []protocol.Fact{{Name: protocol.FactWireGuardKey, Value: r.State.WireGuard.PublicKey().String(),
		Why: "the public half of the WireGuard key in " + filepath.Join(r.State.Dir, fileWireGuard)}}
	if r.ov.fact.Name != "" {
		fs = append(fs, r.ov.fact)
	}
	if r.ov.forwarding.Name != "" {
		fs = append(fs, r.ov.forwarding)
	}
	return fs
}

// MaxHeartbeatPeers bounds the handshakes one heartbeat carries (about
// 60 bytes each): a node with more peers reports the first this many it
// was declared, every beat well below a host's 1 MiB message.
const MaxHeartbeatPeers = 1000

// peerHandshakes are the declared peers' last handshakes, with r.mu held;
// nil without an overlay. A peer the device has not shaken hands with (or
// no interface up) has none.
func (r *Runner) peerHandshakes() []protocol.PeerHandshake {
	o := r.last.Overlay
	if o == nil {
		return nil
	}
	peers := o.Peers[:min(len(o.Peers), MaxHeartbeatPeers)]
	var seen map[string]time.Time
	if r.ov.link != nil {
		var err error
		if seen, err = r.ov.link.handshakes(); err != nil {
			r.warnf("overlay: read the handshakes: %v", err)
		}
	}
	out := make([]protocol.PeerHandshake, 0, len(peers))
	for _, p := range peers {
		h := protocol.PeerHandshake{Node: p.Node}
		if seen != nil { // no interface up: no key to look for, each beat
			k, _ := wgtypes.ParseKey(p.PublicKey)
			if at, ok := seen[hex.EncodeToString(k[:])]; ok {
				h.At = &at
			}
		}
		out = append(out, h)
	}
	return out
}
