package protocol

import "time"

// The overlay: the mesh's private network, WireGuard configured by the
// mesh (commands.md: overlay place, overlay show). Each node's host makes a
// WireGuard key pair (the private key never leaves it) and reports the
// public key as the fact FactWireGuardKey; the controller gives each node
// a stable address and its peers, carried in its declaration; the host
// brings the interface up and reports each peer's last handshake with its
// heartbeats.

// FactWireGuardKey is the fact a host reports its WireGuard public key in
// (base64, as wg(8) writes keys).
const FactWireGuardKey = "wireguard_key"

// OverlayInterface is the name of the overlay's interface on every host.
const OverlayInterface = "mesh0"

// OverlayPort is the UDP port a host listens on for the overlay unless its
// placement's endpoint says another.
const OverlayPort = 51820

// OverlayKeepalive is the persistent keepalive, in seconds, of a peer
// where NAT is in the way.
const OverlayKeepalive = 25

// OverlayPeerSilentAfter is how old a direct peer's last handshake may grow
// before node.overlay-peer-silent.
const OverlayPeerSilentAfter = 3 * time.Minute

// DeclaredOverlay is a node's part of the overlay, as its declaration
// carries it (Declaration.Overlay; none: the node has no overlay yet).
type DeclaredOverlay struct {
	// Interface is OverlayInterface.
	Interface string `json:"interface"`
	// Address4 and Address6 are the node's own overlay addresses, with
	// the overlay's prefix length (100.64.0.7/10, fdXX:…::7/48): routes to
	// the whole overlay go through the interface.
	Address4 string `json:"address4"`
	Address6 string `json:"address6"`
	// ListenPort is the UDP port its host listens on.
	ListenPort int            `json:"listen_port"`
	Peers      []DeclaredPeer `json:"peers"`
}

// DeclaredPeer is one WireGuard peer of a node.
type DeclaredPeer struct {
	Node string `json:"node"`
	// PublicKey is the peer's WireGuard public key (base64).
	PublicKey string `json:"public_key"`
	// Endpoint is host:port where the peer is dialled; "" when this node
	// does not dial it (it is behind NAT and dials this node).
	Endpoint string `json:"endpoint,omitempty"`
	// AllowedIPs are the peer's own addresses (/32 and /128) and, for a
	// relay, those of each node reached through it.
	AllowedIPs []string `json:"allowed_ips"`
	// Keepalive is the persistent keepalive in seconds (OverlayKeepalive
	// where NAT is in the way), 0 for none.
	Keepalive int `json:"keepalive,omitempty"`
	// Via are the nodes reached through this peer, a relay; none for a
	// peer reached for itself alone.
	Via []string `json:"via,omitempty"`
	// Relays says this node relays for the peer: its host forwards the
	// peer's packets to the nodes it reaches through this one.
	Relays bool `json:"relays,omitempty"`
}

// PeerHandshake is one overlay peer's last handshake as a host reports it
// with its heartbeat (HeartbeatBody.Peers).
type PeerHandshake struct {
	Node string `json:"node"`
	// At is the last handshake; nil if none yet.
	At *time.Time `json:"at,omitempty"`
}
