package protocol

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// The controller's signing key changes by rotation (identity rotate): each
// rotation is a link of a chain, an announcement {sequence, old key, new
// key, when, overlap until} signed by the old key (so a host that trusts
// the old one may trust the new) and by the new one (so the new key's
// holder is known to hold it). A host that heard the announcement accepts
// both keys until the overlap ends, the new one alone after it; a host
// that missed it asks for the chain from the key it knows
// (mesh.node.N.keys) and follows it link by link.

// KeyAnnouncementType is an announcement's type: a declaration has none and
// an alert its own, so none of the three is ever taken for another.
const KeyAnnouncementType = "key-announcement"

// KeyAnnouncement is one rotation of the controller's signing key.
type KeyAnnouncement struct {
	At           time.Time `json:"at"`
	NewKey       string    `json:"new_key"` // ed25519 public key, base64
	OldKey       string    `json:"old_key"`
	OverlapUntil time.Time `json:"overlap_until"`
	Sequence     int64     `json:"sequence"`
	Type         string    `json:"type"`
}

// KeyLink is an announcement as it travels and is kept: its canonical
// bytes (what both keys signed) and the two signatures.
type KeyLink struct {
	Announcement string `json:"announcement"`
	OldSignature string `json:"old_signature"`
	NewSignature string `json:"new_signature"`
}

// Subjects of a rotation.
const (
	// KeyInbox is the last tokens of where the controller announces a
	// rotation to node N (mesh.node.N.inbox.key): a KeyNotice.
	KeyInbox = "inbox.key"
	// KeyChainAsk is a host's request for the chain from the key it knows
	// (mesh.node.N.keys): a KeyChainAskBody, answered with a KeyChain.
	KeyChainAsk = "keys"
	// KeyRefusedReport is a host saying it refused a chain or an
	// announcement (mesh.node.N.key-refused): a KeyRefusal.
	KeyRefusedReport = "key-refused"
)

// KeyNotice is what the controller sends a host on its key inbox: links of
// the chain, oldest first (usually the latest alone).
type KeyNotice struct {
	Links []KeyLink `json:"links"`
}

// KeyChainAskBody asks for the chain from the key From (a KeyID) on.
type KeyChainAskBody struct {
	From string `json:"from"`
}

// KeyChain answers a KeyChainAskBody: the links from the one whose old key
// is From to the latest, oldest first, or why there are none.
type KeyChain struct {
	Links []KeyLink `json:"links"`
	Error string    `json:"error,omitempty"`
}

// KeyRefusal is a host saying it refused what claimed to be the
// controller's chain: Key is the key it goes on verifying with (a KeyID).
type KeyRefusal struct {
	Key     string `json:"key"`
	Refused string `json:"refused"`
}

// MaxKeyLinks bounds a chain a host takes in one answer.
const MaxKeyLinks = 1024

// KeyID is the id of a controller key as envelopes name it: the first 8
// bytes of its SHA-256 in four groups (identity's Fingerprint).
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	h := hex.EncodeToString(sum[:8])
	return h[0:4] + "-" + h[4:8] + "-" + h[8:12] + "-" + h[12:16]
}

// NewKeyLink signs an announcement with the old key and the new one.
func NewKeyLink(a KeyAnnouncement, signOld, signNew func([]byte) []byte) (KeyLink, error) {
	a.Type = KeyAnnouncementType
	canon, err := Canonical(a)
	if err != nil {
		return KeyLink{}, err
	}
	return KeyLink{Announcement: string(canon), OldSignature: base64.StdEncoding.EncodeToString(signOld(canon)),
		NewSignature: base64.StdEncoding.EncodeToString(signNew(canon))}, nil
}

// ErrBadChain means a chain of key announcements does not lead from the
// key a host knows to the one it claims, each link signed by the key
// before it.
var ErrBadChain = errors.New("the chain of controller keys does not verify")

// ErrNotFromKey means the links given, good or not, do not lead on from
// the key a host knows: it asks for the chain from it (KeyChainAsk).
var ErrNotFromKey = errors.New("no link leads on from the key this host knows")

// Open decodes a link and checks both its signatures against the keys it
// names; whether its old key is one to trust is the caller's (Follow).
func (l KeyLink) Open() (a KeyAnnouncement, oldKey, newKey ed25519.PublicKey, err error) {
	if err := json.Unmarshal([]byte(l.Announcement), &a); err != nil {
		return a, nil, nil, fmt.Errorf("%w: an announcement is not JSON: %v", ErrBadChain, err)
	}
	if a.Type != KeyAnnouncementType {
		return a, nil, nil, fmt.Errorf("%w: not an announcement (type %q)", ErrBadChain, a.Type)
	}
	if oldKey, err = decodeKey(a.OldKey); err != nil {
		return a, nil, nil, fmt.Errorf("%w: link %d: old key: %v", ErrBadChain, a.Sequence, err)
	}
	if newKey, err = decodeKey(a.NewKey); err != nil {
		return a, nil, nil, fmt.Errorf("%w: link %d: new key: %v", ErrBadChain, a.Sequence, err)
	}
	if !verifies(oldKey, l.Announcement, l.OldSignature) {
		return a, nil, nil, fmt.Errorf("%w: link %d is not signed by its old key %s", ErrBadChain, a.Sequence, KeyID(oldKey))
	}
	if !verifies(newKey, l.Announcement, l.NewSignature) {
		return a, nil, nil, fmt.Errorf("%w: link %d is not signed by its new key %s", ErrBadChain, a.Sequence, KeyID(newKey))
	}
	return a, oldKey, newKey, nil
}

// Followed is one link of a chain a host followed: the announcement and
// the key it made current.
type Followed struct {
	KeyAnnouncement
	Key ed25519.PublicKey
}

// Follow follows links from the key a host knows: the links before the one
// whose old key is from are passed by (a chain given whole), and from it
// on each must be signed by the key before it and numbered one above it.
// It returns the links followed, none when the chain ends at from, and
// ErrBadChain when no link leads on from it, or one does not verify.
func Follow(from ed25519.PublicKey, links []KeyLink) ([]Followed, error) {
	if len(links) > MaxKeyLinks {
		return nil, fmt.Errorf("%w: %d links, over %d", ErrBadChain, len(links), MaxKeyLinks)
	}
	out := []Followed{}
	cur, seq, started := from, int64(0), false
	for _, l := range links {
		a, oldKey, newKey, err := l.Open()
		if err != nil {
			return nil, err
		}
		if !started {
			switch {
			case oldKey.Equal(cur):
				started = true
			case newKey.Equal(cur):
				// The link that made from current: what follows leads on.
				started, seq = true, a.Sequence
				continue
			default:
				continue
			}
		}
		if seq != 0 && a.Sequence != seq+1 {
			return nil, fmt.Errorf("%w: link %d follows link %d (a link is missing)", ErrBadChain, a.Sequence, seq)
		}
		if !oldKey.Equal(cur) {
			return nil, fmt.Errorf("%w: link %d hands over from %s, not from %s (the key before it)", ErrBadChain, a.Sequence, KeyID(oldKey), KeyID(cur))
		}
		out = append(out, Followed{KeyAnnouncement: a, Key: newKey})
		cur, seq = newKey, a.Sequence
	}
	if !started && len(links) > 0 {
		return nil, fmt.Errorf("%w: %w (%s)", ErrBadChain, ErrNotFromKey, KeyID(from))
	}
	return out, nil
}

// verifies says whether sig (base64) is key's signature of msg.
func verifies(key ed25519.PublicKey, msg, sig string) bool {
	b, err := base64.StdEncoding.DecodeString(sig)
	return err == nil && len(key) == ed25519.PublicKeySize && ed25519.Verify(key, []byte(msg), b)
}

// decodeKey is an ed25519 public key from base64.
func decodeKey(s string) (ed25519.PublicKey, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, errors.New("not an ed25519 public key in base64")
	}
	return b, nil
}

// Host credentials expire (serve --host-credentials-ttl); a host renews
// its broker user before then with a request signed by its host key, for a
// new nkey it made, so the credential it replaces is useless once expired.
const (
	// CredsRenew is a host's request for a new broker user
	// (mesh.node.N.creds): a CredsRenewBody, answered with a CredsReply.
	CredsRenew = "creds"
)

// CredsRenewBody asks for a broker user for the nkey NKey (public).
type CredsRenewBody struct {
	NKey string `json:"nkey"`
}

// CredsReply is the answer to a renewal: the user JWT as the JWT half of a
// .creds document (the host adds its nkey's seed), or why not.
type CredsReply struct {
	OK    bool   `json:"ok"`
	Creds string `json:"creds,omitempty"`
	Error string `json:"error,omitempty"`
}

// RenewBody is a renewal asked through the join path, by a host whose
// credential expired (it can no longer connect as itself): signed by its
// host key (Sign), carried in JoinRequest.Renew, answered as a join grant
// sealed to the node's age recipient.
type RenewBody struct {
	Node string    `json:"node"`
	NKey string    `json:"nkey"`
	At   time.Time `json:"at"`
}

// RenewWithin is how old a renewal asked through the join path may be.
const RenewWithin = 10 * time.Minute
