package host

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"mesh-controller/app/protocol"
)

// The controller's keys a host accepts (protocol's keys.go): the key it
// was given at join, and each key a rotation handed over to since, the
// one before the newest accepted until its overlap ends. They are kept in
// the state dir (fileKeys, 0600, written whole); controller.pub holds the
// newest, as it held the only one before rotations.

// fileKeys holds the controller keys the host accepts.
const fileKeys = "controller-keys.json"

// maxRetired bounds the ids of retired keys a host remembers, to say that
// a declaration signed by one is signed by a retired key.
const maxRetired = 8

// heldKey is one controller key a host holds.
type heldKey struct {
	Key ed25519.PublicKey `json:"key"`
	// Sequence is the rotation that made it current (0: the key of the join).
	Sequence int64 `json:"sequence,omitempty"`
	// Until, once a newer key replaced it, is when it stops being accepted.
	Until time.Time `json:"until,omitzero"`
}

// keyring is the controller keys a host accepts, oldest first: the last is
// the newest.
type keyring struct {
	Keys []heldKey `json:"keys"`
	// Retired are the ids of the keys retired last.
	Retired []string `json:"retired,omitempty"`
}

// ErrRetiredKey means an envelope names a controller key whose overlap
// ended: the controller signs with it no more.
var ErrRetiredKey = errors.New("signed by a retired controller key")

// UnknownKeyError is an envelope naming a controller key this host does not
// hold: the host asks for the chain that leads to it.
type UnknownKeyError struct{ ID string }

func (e *UnknownKeyError) Error() string {
	return "signed by controller key " + e.ID + ", which this host does not know"
}

// ring is the host's keyring as it stands (made from ControllerKey for a
// host that never heard a rotation); the caller holds s.mu.
func (s *State) ringLocked() keyring {
	if s.ring != nil {
		return *s.ring
	}
	return keyring{Keys: []heldKey{{Key: s.ControllerKey}}}
}

// KeyID is the newest controller key the host holds: what its beats say it
// verifies with.
func (s *State) KeyID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ks := s.ringLocked().Keys
	return protocol.KeyID(ks[len(ks)-1].Key)
}

// Verify checks a declaration's envelope against the controller key it
// names (the newest, if it names none: a controller from before
// rotations), and decodes it: a key the host does not hold is an
// *UnknownKeyError, a key retired ErrRetiredKey.
//
// The id is the controller's word for which key signed: an envelope whose
// id is not one the host holds, signed by a key it accepts all the same,
// verifies.
func (s *State) Verify(env protocol.Envelope) (protocol.Declaration, error) {
	now := time.Now()
	key, err := s.keyFor(env.Key, now)
	var unknown *UnknownKeyError
	if errors.As(err, &unknown) {
		for _, k := range s.accepted(now) {
			var mismatch *protocol.MismatchError
			if d, err := env.Verify(k); err == nil || errors.As(err, &mismatch) {
				return d, err
			}
		}
	}
	if err != nil {
		return protocol.Declaration{}, fmt.Errorf("declaration: %w", err)
	}
	return env.Verify(key)
}

// accepted are the keys the host accepts at now, newest first.
func (s *State) accepted(now time.Time) []ed25519.PublicKey {
	s.mu.Lock()
	defer s.mu.Unlock()
	ks := s.ringLocked().Keys
	var out []ed25519.PublicKey
	for i := len(ks) - 1; i >= 0; i-- {
		if ks[i].Until.IsZero() || now.Before(ks[i].Until) {
			out = append(out, ks[i].Key)
		}
	}
	return out
}

// keyFor is the accepted key of id at now.
func (s *State) keyFor(id string, now time.Time) (ed25519.PublicKey, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.ringLocked()
	if id == "" {
		return r.Keys[len(r.Keys)-1].Key, nil
	}
	for _, k := range r.Keys {
		if protocol.KeyID(k.Key) != id {
			continue
		}
		if !k.Until.IsZero() && !now.Before(k.Until) {
			return nil, fmt.Errorf("%w %s (its overlap ended %s)", ErrRetiredKey, id, k.Until.UTC().Format(time.RFC3339))
		}
		return k.Key, nil
	}
	if slices.Contains(r.Retired, id) {
		return nil, fmt.Errorf("%w %s", ErrRetiredKey, id)
	}
	return nil, &UnknownKeyError{ID: id}
}

// Adopt follows links from the newest key the host holds (protocol.Follow)
// and keeps what it leads to: the key before each new one accepted until
// that rotation's overlap ends, keys past theirs let go. The keys are
// saved whole in the state dir (a host simulated in memory keeps them in
// memory). It returns the links followed, none when the host holds the
// latest already; a chain that does not verify changes nothing.
func (s *State) Adopt(links []protocol.KeyLink, now time.Time) ([]protocol.Followed, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.ringLocked()
	followed, err := protocol.Follow(r.Keys[len(r.Keys)-1].Key, links)
	if err != nil || len(followed) == 0 {
		return nil, err
	}
	next := keyring{Keys: slices.Clone(r.Keys), Retired: slices.Clone(r.Retired)}
	for _, f := range followed {
		next.Keys[len(next.Keys)-1].Until = f.OverlapUntil
		next.Keys = append(next.Keys, heldKey{Key: f.Key, Sequence: f.Sequence})
	}
	kept := next.Keys[:0]
	for _, k := range next.Keys {
		if !k.Until.IsZero() && !now.Before(k.Until) {
			next.Retired = append(next.Retired, protocol.KeyID(k.Key))
			continue
		}
		kept = append(kept, k)
	}
	next.Keys = kept
	if n := len(next.Retired); n > maxRetired {
		next.Retired = next.Retired[n-maxRetired:]
	}
	if s.Dir != "" {
		if err := saveJSON(s.Dir, fileKeys, next); err != nil {
			return nil, err
		}
		newest := next.Keys[len(next.Keys)-1].Key
		if err := writeFile(filepath.Join(s.Dir, fileController), []byte(base64.StdEncoding.EncodeToString(newest)+"\n")); err != nil {
			return nil, err
		}
	}
	s.ring = &next
	s.ControllerKey = next.Keys[len(next.Keys)-1].Key
	return followed, nil
}

// loadKeys reads the keys a host accepts, if it heard a rotation.
func (s *State) loadKeys() error {
	b, err := os.ReadFile(filepath.Join(s.Dir, fileKeys))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var r keyring
	if err := json.Unmarshal(b, &r); err != nil || len(r.Keys) == 0 {
		return fmt.Errorf("%s: %s is damaged", s.Dir, fileKeys)
	}
	for _, k := range r.Keys {
		if len(k.Key) != ed25519.PublicKeySize {
			return fmt.Errorf("%s: %s is damaged", s.Dir, fileKeys)
		}
	}
	s.ring = &r
	s.ControllerKey = r.Keys[len(r.Keys)-1].Key
	return nil
}

// askChain asks the controller for the chain from the newest key this
// host holds and follows it (Adopt).
func askChain(ctx context.Context, nc *nats.Conn, st *State) ([]protocol.Followed, error) {
	req, err := protocol.Sign(st.HostKey, protocol.KeyChainAskBody{From: st.KeyID()})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, protocol.AnswerTimeout)
	defer cancel()
	m, err := nc.RequestWithContext(ctx, protocol.NodeSubject(st.Node, protocol.KeyChainAsk), req)
	if err != nil {
		return nil, fmt.Errorf("ask the controller for its chain of keys: %w", err)
	}
	var chain protocol.KeyChain
	if err := json.Unmarshal(m.Data, &chain); err != nil {
		return nil, fmt.Errorf("the controller's chain of keys is not JSON: %w", err)
	}
	if len(chain.Links) == 0 && chain.Error != "" {
		// The controller says the key this host holds is none of its own:
		// no chain can lead on from it.
		return nil, fmt.Errorf("%w: the controller has no chain from %s: %s", protocol.ErrBadChain, st.KeyID(), chain.Error)
	}
	return st.Adopt(chain.Links, time.Now())
}

// followKeys makes sure the host holds the key env names: if it does not,
// it asks for the chain and follows it. It returns why the declaration is
// refused when the chain does not verify (reported as refused) or does not
// lead to that key, "" otherwise; later, when the chain could not be asked
// for now (the controller away): the declaration is let go, and comes
// again when the host asks for its latest or the controller sends it.
func (r *Runner) followKeys(ctx context.Context, nc *nats.Conn, env protocol.Envelope) (why string, later bool) {
	var unknown *UnknownKeyError
	if _, err := r.State.Verify(env); !errors.As(err, &unknown) {
		return "", false
	}
	followed, err := askChain(ctx, nc, r.State)
	switch {
	case errors.Is(err, protocol.ErrBadChain):
		r.refuseChain(nc, err)
		return fmt.Sprintf("refused: %v, and the controller's chain of keys does not lead there: %v", unknown, err), false
	case err != nil:
		r.warnf("%v: %v; it is applied when it comes again", unknown, err)
		return "", true
	}
	r.followed(followed)
	if _, err := r.State.Verify(env); errors.As(err, &unknown) {
		return fmt.Sprintf("refused: %v, and its %v against the keys it accepts (the controller's chain of keys leads to %s)",
			unknown, protocol.ErrBadSignature, r.State.KeyID()), false
	}
	return "", false
}

// onKeyNotice follows a rotation the controller announced; links that do
// not lead on from the key the host holds (it missed a rotation) make it
// ask for the chain, and a chain that does not verify is refused and
// reported, never adopted.
func (r *Runner) onKeyNotice(ctx context.Context, nc *nats.Conn, m *nats.Msg) {
	var n protocol.KeyNotice
	if err := json.Unmarshal(m.Data, &n); err != nil {
		r.refuseChain(nc, fmt.Errorf("%w: the announcement is not JSON: %v", protocol.ErrBadChain, err))
		return
	}
	followed, err := r.State.Adopt(n.Links, time.Now())
	if errors.Is(err, protocol.ErrNotFromKey) {
		followed, err = askChain(ctx, nc, r.State)
	}
	if err != nil {
		if errors.Is(err, protocol.ErrBadChain) {
			r.refuseChain(nc, err)
			return
		}
		r.warnf("follow the controller's new key: %v", err)
		return
	}
	r.followed(followed)
}

// followed logs the keys a host took on, and beats soon: its beat says
// the key it verifies with now.
func (r *Runner) followed(fs []protocol.Followed) {
	for _, f := range fs {
		r.logf("controller key %s follows %s (rotation %d): both accepted until %s",
			protocol.KeyID(f.Key), f.OldKey, f.Sequence, f.OverlapUntil.UTC().Format(time.RFC3339))
	}
	if len(fs) > 0 && r.beatAgain != nil {
		r.beatAgain()
	}
}

// refuseChain logs a chain refused and tells the controller.
func (r *Runner) refuseChain(nc *nats.Conn, err error) {
	r.warnf("refused: %v; still verifying with %s", err, r.State.KeyID())
	r.publish(nc, protocol.KeyRefusedReport, protocol.KeyRefusal{Key: r.State.KeyID(), Refused: err.Error()})
}
