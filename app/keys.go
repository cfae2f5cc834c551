package app

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"mesh-controller/app/daemon"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/health"
	"mesh-controller/contexts/identity"
)

// DefaultKeyOverlap is how long hosts accept the signing key a rotation
// replaced, beside the new one: a host offline for less than a week comes
// back to declarations it can verify at once, and any host catches up
// through the chain after.
const DefaultKeyOverlap = 7 * 24 * time.Hour

// ErrBadOverlap means a rotation's overlap is negative.
var ErrBadOverlap = errors.New("an overlap is a duration of zero or more (7d by default)")

// RotateRequest asks for a rotation of the controller's signing key.
type RotateRequest struct {
	Why string
	// Overlap is how long hosts accept the old key beside the new one; 0
	// retires it at once (a key thought stolen).
	Overlap time.Duration
	// LeaveBehind rotates even when joined hosts cannot follow a rotation
	// (ErrHostsCannotFollow): they then refuse every declaration until
	// they are upgraded and join again.
	LeaveBehind bool
}

// ErrHostsCannotFollow means joined hosts speak a protocol from before key
// rotations (1.0): they would refuse every declaration signed by the new key.
var ErrHostsCannotFollow = errors.New("hosts that cannot follow a key rotation would be left behind")

// KeyShown is a signing key as commands show it: its public half only.
type KeyShown struct {
	PublicKey   string `json:"public_key"`
	Fingerprint string `json:"fingerprint"`
}

func keyShown(pub []byte) KeyShown {
	return KeyShown{PublicKey: base64.StdEncoding.EncodeToString(pub), Fingerprint: protocol.KeyID(pub)}
}

// KeyRotated is what a rotation did.
type KeyRotated struct {
	Sequence     int64     `json:"sequence"`
	Old          KeyShown  `json:"old"`
	New          KeyShown  `json:"new"`
	At           time.Time `json:"at"`
	OverlapUntil time.Time `json:"overlap_until"`
	// SignedAgain counts the nodes' latest declarations signed again with
	// the new key (the one a host asks for when it comes back).
	SignedAgain int `json:"declarations_signed_again"`
	// Announced says the serving controller was told: it announces the
	// new key to every host now. Otherwise serve announces it to each
	// host that beats with the old one.
	Announced bool `json:"announced"`
}

// IdentityRotate makes a new signing key, announced by a link of the chain
// signed by the old key and the new one, and recorded as a hand act; the
// nodes' latest declarations are signed again with it, and the serving
// controller, if one serves, announces it to every host. Refused while the
// previous rotation's overlap runs (identity.ErrOverlapRunning).
func (c *Nodes) IdentityRotate(ctx context.Context, r RotateRequest) (KeyRotated, error) {
	if strings.TrimSpace(r.Why) == "" {
		return KeyRotated{}, health.ErrNoWhy
	}
	if r.Overlap < 0 {
		return KeyRotated{}, fmt.Errorf("--overlap %s: %w", r.Overlap, ErrBadOverlap)
	}
	st, err := c.stores(ctx)
	if err != nil {
		return KeyRotated{}, err
	}
	if !r.LeaveBehind {
		hv, err := st.Identity.HostVersions(ctx)
		if err != nil {
			return KeyRotated{}, err
		}
		var old []string
		for _, h := range hv {
			if h.Protocol == protocol.Unversioned {
				old = append(old, h.Node)
			}
		}
		if len(old) > 0 {
			return KeyRotated{}, fmt.Errorf("%w: %s (%s) speak protocol %s, which predates rotations, and would refuse every declaration the new key signs",
				ErrHostsCannotFollow, strings.Join(capProblems(old), ", "), Plural(len(old), "host"), protocol.Unversioned)
		}
	}
	now := c.Now()
	link, err := st.Identity.Rotate(ctx, r.Overlap, r.Why, announceKey, now)
	if err != nil {
		return KeyRotated{}, err
	}
	v := KeyRotated{Sequence: link.Sequence, Old: keyShown(link.OldKey), New: keyShown(link.NewKey), At: link.MadeAt, OverlapUntil: link.OverlapUntil}
	if err := c.recordHand(ctx, fmt.Sprintf("rotate the signing key from %s to %s (hosts accept both until %s)",
		v.Old.Fingerprint, v.New.Fingerprint, v.OverlapUntil.UTC().Format(time.RFC3339)), r.Why, "identity", ""); err != nil {
		return v, err
	}
	if v.SignedAgain, err = signAgain(ctx, st); err != nil {
		return v, err
	}
	if nc, err := c.dialBroker(ctx, st.Identity); err == nil {
		defer nc.Close()
		v.Announced = nc.Publish(daemon.RotatedSubject, nil) == nil && nc.FlushTimeout(protocol.AnswerTimeout) == nil
	}
	return v, nil
}

// announceKey makes a rotation's link: the announcement, canonical,
// signed by the old key and by the new.
func announceKey(seq int64, old, next identity.SigningKey, at, until time.Time) (string, string, string, error) {
	l, err := protocol.NewKeyLink(protocol.KeyAnnouncement{Sequence: seq, OldKey: old.PublicBase64(), NewKey: next.PublicBase64(),
		At: at.UTC(), OverlapUntil: until.UTC()}, old.Sign, next.Sign)
	return l.Announcement, l.OldSignature, l.NewSignature, err
}

// signAgain signs every node's latest declaration that the current key
// did not sign again with it.
func signAgain(ctx context.Context, st *Stores) (int, error) {
	key, err := st.Identity.SigningKey(ctx)
	if err != nil {
		return 0, err
	}
	return st.Inventory.SignAgain(ctx, key.Fingerprint(), func(body string) string {
		return base64.StdEncoding.EncodeToString(key.Sign([]byte(body)))
	})
}

// retireKeys retires the keys whose overlap ended (the self-check does,
// on serve's timer), and signs again what one of them still signed;
// lines say what it did.
func retireKeys(ctx context.Context, st *Stores, now time.Time) ([]string, error) {
	retired, err := st.Identity.RetireKeys(ctx, now)
	if err != nil || len(retired) == 0 {
		return nil, err
	}
	var lines []string
	for _, l := range retired {
		lines = append(lines, fmt.Sprintf("signing key %s retired: its overlap ended at %s; only %s signs, and hosts that heard the rotation accept it alone",
			protocol.KeyID(l.OldKey), l.OverlapUntil.UTC().Format(time.RFC3339), protocol.KeyID(l.NewKey)))
	}
	if st.Inventory != nil {
		n, err := signAgain(ctx, st)
		if err != nil {
			return lines, err
		}
		if n > 0 {
			lines = append(lines, fmt.Sprintf("%s signed again with the current key", Plural(n, "latest declaration")))
		}
	}
	return lines, nil
}

// PreviousKey is the key a rotation replaced, while hosts still accept it.
type PreviousKey struct {
	KeyShown
	RotatedAt    time.Time `json:"rotated_at"`
	OverlapUntil time.Time `json:"overlap_until"`
	Why          string    `json:"why"`
}

// NodeKey is a node whose host has not said it verifies with the current
// key: the key it says it does ("" if it said none), and whether that key
// is retired.
type NodeKey struct {
	Node    string `json:"node"`
	Key     string `json:"key"`
	Retired bool   `json:"retired,omitempty"`
}

// keysStanding is where each joined host stands against the chain: those
// whose acknowledgement is not the current key, and how many are joined.
func keysStanding(ctx context.Context, ids *identity.Store, current string, chain []identity.KeyLink, now time.Time) (hosts int, behind []NodeKey, err error) {
	joined, err := ids.Hosts(ctx)
	if err != nil {
		return 0, nil, err
	}
	acks, err := ids.KeyAcks(ctx)
	if err != nil {
		return 0, nil, err
	}
	said := make(map[string]string, len(acks))
	for _, a := range acks {
		said[a.Node] = a.Key
	}
	retired := retiredKeys(chain, now)
	for _, h := range joined {
		if k := said[h.Node]; k != current {
			behind = append(behind, NodeKey{Node: h.Node, Key: k, Retired: retired[k]})
		}
	}
	return len(joined), behind, nil
}

// retiredKeys are the ids of the keys whose overlap ended by now.
func retiredKeys(chain []identity.KeyLink, now time.Time) map[string]bool {
	out := map[string]bool{}
	for _, l := range chain {
		if !l.OverlapUntil.After(now) {
			out[protocol.KeyID(l.OldKey)] = true
		}
	}
	return out
}

// maxShownBehind bounds the nodes identity show names as not acknowledging
// the current key; the count says how many in all.
const maxShownBehind = 20

// behindLine says which hosts have not acknowledged the current key.
func (v IdentityView) behindLine() string {
	acked := v.Hosts - len(v.NotAcknowledged)
	line := fmt.Sprintf("%d of %d verify with it", acked, v.Hosts)
	if len(v.NotAcknowledged) == 0 {
		return line
	}
	var names []string
	for _, n := range v.NotAcknowledged[:min(len(v.NotAcknowledged), maxShownBehind)] {
		switch {
		case n.Key == "":
			names = append(names, n.Node+" (has said none)")
		case n.Retired:
			names = append(names, n.Node+" (on "+n.Key+", retired)")
		default:
			names = append(names, n.Node+" (on "+n.Key+")")
		}
	}
	if more := len(v.NotAcknowledged) - len(names); more > 0 {
		names = append(names, fmt.Sprintf("and %d more", more))
	}
	return line + "; not yet: " + strings.Join(names, ", ")
}

// Lines are identity show's lines after the current key's: the previous
// key while it overlaps, the chain, and who has not acknowledged.
func (v IdentityView) Lines() []string {
	var out []string
	if p := v.Previous; p != nil {
		out = append(out, fmt.Sprintf("previous     %s, accepted by hosts until %s (rotated %s: %s)", p.Fingerprint,
			p.OverlapUntil.UTC().Format(time.RFC3339), p.RotatedAt.UTC().Format(time.RFC3339), p.Why))
	}
	out = append(out, fmt.Sprintf("chain        %s (%s)", Plural(v.Chain, "key"), Plural(v.Chain-1, "rotation")))
	if v.Hosts > 0 {
		out = append(out, "hosts        "+v.behindLine())
	}
	return out
}

// keyStatus is status's word on the rotation: the nodes whose host says it
// verifies with another key than the current one (read from the few
// behind, not every node), once the key was rotated.
func keyStatus(ctx context.Context, ids *identity.Store, now time.Time) ([]OutOfDate, error) {
	chain, err := ids.KeyChain(ctx)
	if err != nil || len(chain) == 0 {
		return nil, err
	}
	current := protocol.KeyID(chain[len(chain)-1].NewKey)
	behind, err := ids.KeyAcksOtherThan(ctx, current)
	if err != nil {
		return nil, err
	}
	retired := retiredKeys(chain, now)
	var out []OutOfDate
	for _, a := range behind {
		why := fmt.Sprintf("verifies with signing key %s, not the current %s", a.Key, current)
		if retired[a.Key] {
			why += " (retired: it catches up by the chain when it hears a declaration)"
		}
		out = append(out, OutOfDate{Kind: "node", Name: a.Node, Why: why})
	}
	return out, nil
}

// keyConditions are node.retired-key and node.key-refused, from the chain
// and what hosts said.
func keyConditions(in *checkInputs) []health.Condition {
	var out []health.Condition
	retired := retiredKeys(in.keyChain, in.now)
	current := ""
	if len(in.keyChain) > 0 {
		current = protocol.KeyID(in.keyChain[len(in.keyChain)-1].NewKey)
	}
	for _, a := range in.keyAcks {
		if retired[a.Key] {
			out = append(out, machineCondition("node.retired-key", a.Node, health.Urgent,
				fmt.Sprintf("the host of %s verifies with the retired signing key %s, not %s: it refuses what the controller signs until it follows the chain (it asks for it when it hears a declaration)", a.Node, a.Key, current),
				map[string]any{"key": a.Key, "current": current, "since": a.AckedAt.UTC().Format(time.RFC3339)}))
		}
		if a.RefusedAt != nil && in.now.Sub(*a.RefusedAt) <= in.bounds.Memory {
			out = append(out, machineCondition("node.key-refused", a.Node, health.Urgent,
				fmt.Sprintf("the host of %s refused what claimed to be the controller's chain of keys: %s; it goes on verifying with %s", a.Node, a.Refused, a.Key),
				map[string]any{"refused": a.Refused, "at": a.RefusedAt.UTC().Format(time.RFC3339), "key": a.Key}))
		}
	}
	slices.SortFunc(out, func(a, b health.Condition) int { return strings.Compare(a.Key, b.Key) })
	return out
}
