package protocol

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
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

// Label binds a sealed value to what it is. age does not bind a ciphertext
// to a name, so the label travels in the age header as a stanza of its own:
// the header MAC, which age checks with the file key, covers it, so a copy
// moved to another name is refused by the opener. The plaintext stays the
// exact value, so the plain age command opens a copy to the value itself.
type Label struct {
	Node    string `json:"node"`
	Module  string `json:"module"`
	Name    string `json:"name"`
	Version int64  `json:"version"`
}

func (l Label) String() string {
	return fmt.Sprintf("%s/%s/%s (version %d)", l.Node, l.Module, l.Name, l.Version)
}

// labelStanza is the stanza type that carries a label; identities that do
// not know it (the age command's among them) pass it by.
const labelStanza = "mesh-controller.dev/label"

// labelRecipient adds the label stanza to the header; it wraps no key.
type labelRecipient struct{ l Label }

func (r labelRecipient) Wrap([]byte) ([]*age.Stanza, error) {
	return []*age.Stanza{{Type: labelStanza, Args: []string{r.l.Node, r.l.Module, r.l.Name, strconv.FormatInt(r.l.Version, 10)}}}, nil
}

// labelReader is an identity that reads the label stanza as age passes the
// header's stanzas, then unwraps with the real identity.
type labelReader struct {
	age.Identity
	label *Label
	found *bool
}

func (r labelReader) Unwrap(stanzas []*age.Stanza) ([]byte, error) {
	for _, s := range stanzas {
		if s.Type == labelStanza && len(s.Args) == 4 {
			v, err := strconv.ParseInt(s.Args[3], 10, 64)
			if err == nil {
				*r.label, *r.found = Label{Node: s.Args[0], Module: s.Args[1], Name: s.Args[2], Version: v}, true
			}
		}
	}
	return r.Identity.Unwrap(stanzas)
}

// ErrWrongLabel means a sealed copy opened, but is not the secret asked for.
var ErrWrongLabel = errors.New("the sealed copy is of another secret")

// SealSecret seals a value with its label to every recipient (one age file,
// so each opens the same value), as ASCII armor.
func SealSecret(v Secret, l Label, recipients ...age.Recipient) (string, error) {
	return sealArmored(v.b, append(recipients, labelRecipient{l})...)
}

// sealArmored encrypts b to every recipient as one ASCII-armored age file.
func sealArmored(b []byte, recipients ...age.Recipient) (string, error) {
	var out bytes.Buffer
	aw := armor.NewWriter(&out)
	w, err := age.Encrypt(aw, recipients...)
	if err != nil {
		return "", err
	}
	if _, err := w.Write(b); err != nil {
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

// openArmored decrypts an ASCII-armored age file with the identities and
// reads at most limit bytes of it; limit 0 reads it all.
func openArmored(s string, limit int64, identities ...age.Identity) ([]byte, error) {
	r, err := age.Decrypt(armor.NewReader(strings.NewReader(s)), identities...)
	if err != nil {
		return nil, err
	}
	if limit > 0 {
		r = io.LimitReader(r, limit)
	}
	return io.ReadAll(r)
}

// OpenSealed opens an armored copy with an identity and checks it is the
// secret want names (want.Version 0 accepts any version).
func OpenSealed(sealed string, want Label, identities ...age.Identity) (Secret, Label, error) {
	var got Label
	var found bool
	wrapped := make([]age.Identity, len(identities))
	for i, id := range identities {
		wrapped[i] = labelReader{Identity: id, label: &got, found: &found}
	}
	b, err := openArmored(sealed, 0, wrapped...)
	if err != nil {
		return Secret{}, Label{}, fmt.Errorf("open the sealed copy: %w", err)
	}
	// The label was read from a header whose MAC age has checked by now.
	if !found || got.Node != want.Node || got.Module != want.Module || got.Name != want.Name || (want.Version != 0 && got.Version != want.Version) {
		clear(b)
		if !found {
			return Secret{}, Label{}, fmt.Errorf("%w: it carries no label, not %s", ErrWrongLabel, want)
		}
		return Secret{}, got, fmt.Errorf("%w: it is %s, not %s", ErrWrongLabel, got, want)
	}
	return Secret{b: b}, got, nil
}
