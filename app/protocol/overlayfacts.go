package protocol

// The facts a host reports about its part of the overlay, beside
// FactWireGuardKey: whether its interface is up, and whether it forwards
// for the nodes it relays for.

// FactOverlay is the fact a host reports its overlay interface's state in
// (OverlayUp, OverlayDown or OverlayUnavailable), its Why saying why; a
// host never declared an overlay reports none.
const FactOverlay = "overlay"

// States of FactOverlay.
const (
	// OverlayUp: the interface is up, configured as declared.
	OverlayUp = "up"
	// OverlayDown: the interface is not up, though this host could bring
	// it up: none is declared any more, or bringing it up failed.
	OverlayDown = "down"
	// OverlayUnavailable: this host cannot bring an interface up (not
	// root, no TUN device); its configuration is written all the same.
	OverlayUnavailable = "unavailable"
)

// FactOverlayForwarding is the fact a host that relays for others reports
// its IP forwarding in ("on", or "off" with why), so that a relay that
// does not forward shows.
const FactOverlayForwarding = "overlay_forwarding"
