package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"filippo.io/age"
	"filippo.io/age/armor"
)

// Secret is a secret value in memory. Every way of printing it prints
// [REDACTED], so a value cannot reach a log or an output by accident; only
// Reveal gives its bytes, to the code that seals it or writes it where it
// belongs.
type Secret struct{ b []byte }

// NewSecret wraps a value.
func NewSecret(b []byte) Secret { return Secret{b: append([]byte(nil), b...)} }

// Reveal returns the value's bytes.
func (s Secret) Reveal() []byte { return s.b }

// Len is the value's length.
func (s Secret) Len() int { return len(s.b) }

// String prints [REDACTED].
func (s Secret) String() string { return "[REDACTED]" }

// GoString prints [REDACTED].
func (s Secret) GoString() string { return "[REDACTED]" }

// Format prints [REDACTED] for every verb.
func (s Secret) Format(f fmt.State, _ rune) { io.WriteString(f, "[REDACTED]") }

// MarshalJSON writes "[REDACTED]".
func (s Secret) MarshalJSON() ([]byte, error) { return []byte(`"[REDACTED]"`), nil }

// Label binds a sealed value to what it is: age does not bind a ciphertext
// to a name, so the payload carries it and the opener checks it (a copy
// moved to another name is refused).
type Label struct {
	Node    string `json:"node"`
	Module  string `json:"module"`
	Name    string `json:"name"`
	Version int64  `json:"version"`
}

func (l Label) String() string { return fmt.Sprintf("%s/%s/%s (version %d)", l.Node, l.Module, l.Name, l.Version) }

type sealedPayload struct {
	Label
	Value []byte `json:"value"`
}

// ErrWrongLabel means a sealed copy opened, but is not the secret asked for.
var ErrWrongLabel = errors.New("the sealed copy is of another secret")

// SealSecret seals a value with its label to every recipient (one age file, so
// each opens the same value), as ASCII armor.
func SealSecret(v Secret, l Label, recipients ...age.Recipient) (string, error) {
	payload, err := json.Marshal(sealedPayload{Label: l, Value: v.b})
	if err != nil {
		return "", err
	}
	defer clear(payload)
	var out bytes.Buffer
	aw := armor.NewWriter(&out)
	w, err := age.Encrypt(aw, recipients...)
	if err != nil {
		return "", err
	}
	if _, err := w.Write(payload); err != nil {
		return "", err
	}
	if err := w.Close(); err != nil {
		return "", err
	}
	if err := aw.Close(); err != nil {
		return "", err
	}
	return out.String(), nil
}

// OpenSealed opens an armored copy with an identity and checks it is the
// secret want names (want.Version 0 accepts any version).
func OpenSealed(sealed string, want Label, identities ...age.Identity) (Secret, Label, error) {
	r, err := age.Decrypt(armor.NewReader(strings.NewReader(sealed)), identities...)
	if err != nil {
		return Secret{}, Label{}, fmt.Errorf("open the sealed copy: %w", err)
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return Secret{}, Label{}, fmt.Errorf("open the sealed copy: %w", err)
	}
	defer clear(b)
	var p sealedPayload
	if err := json.Unmarshal(b, &p); err != nil {
		return Secret{}, Label{}, fmt.Errorf("open the sealed copy: not a mesh secret: %w", err)
	}
	if p.Node != want.Node || p.Module != want.Module || p.Name != want.Name || (want.Version != 0 && p.Version != want.Version) {
		return Secret{}, p.Label, fmt.Errorf("%w: it is %s, not %s", ErrWrongLabel, p.Label, want)
	}
	return Secret{b: p.Value}, p.Label, nil
}
