package protocol

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Envelope is a signed declaration as sent to a host: the canonical bytes as
// a string (so the signature is over exactly what arrives), the controller's
// signature, and the id of its key.
type Envelope struct {
	Declaration string `json:"declaration"`
	Signature   string `json:"signature"`
	Key         string `json:"key"`
}

// None is the answer to a host asking for its latest declaration when there is none.
type None struct {
	None bool `json:"none"`
}

// Declaration is the part of a node's plan a host acts on. A host ignores
// fields it does not know.
type Declaration struct {
	Node     string           `json:"node"`
	Serial   int64            `json:"serial"`
	IssuedAt time.Time        `json:"issued_at"`
	Mode     string           `json:"mode"`
	Modules  []DeclaredModule `json:"modules"`
	// Delete is what a person asked this node to delete (cleanup delete):
	// the only way a host ever removes data.
	Delete []DeclaredDeletion `json:"delete,omitempty"`
}

// DeclaredDeletion is one cleanup a host carries out and reports done.
type DeclaredDeletion struct {
	Module string `json:"module"`
	Kind   string `json:"kind"` // data or consumer
	Target string `json:"target"`
	Path   string `json:"path,omitempty"`
}

// DeclaredModule is one module in a declaration.
type DeclaredModule struct {
	Module   string           `json:"module"`
	Version  string           `json:"version"`
	Settings json.RawMessage  `json:"settings,omitempty"`
	Data     []DeclaredData   `json:"data"`
	Secrets  []DeclaredSecret `json:"secrets,omitempty"`
	// Bindings are where it gets each provision from, with the credential
	// sealed to both ends.
	Bindings []DeclaredBinding `json:"bindings,omitempty"`
	// Consumers are a provider's consumers, their access and credentials.
	Consumers []DeclaredConsumer `json:"consumers,omitempty"`
	// WaitingFor names secrets the module waits for; it is not started without them.
	WaitingFor []string `json:"waiting_for,omitempty"`
}

// DeclaredBinding is one provision a module gets from a provider.
type DeclaredBinding struct {
	Provision         string `json:"provision"`
	From              string `json:"from"` // node/module
	CredentialName    string `json:"credential_name,omitempty"`
	CredentialVersion int64  `json:"credential_version,omitempty"`
	Credential        string `json:"credential,omitempty"`
}

// DeclaredConsumer is one consumer of a provider module.
type DeclaredConsumer struct {
	Consumer          string `json:"consumer"` // node/module
	Provision         string `json:"provision"`
	State             string `json:"state"`
	CredentialName    string `json:"credential_name,omitempty"`
	CredentialVersion int64  `json:"credential_version,omitempty"`
	Credential        string `json:"credential,omitempty"`
}

// DeclaredSecret is a secret sealed to the node (and the operator).
type DeclaredSecret struct {
	Name    string `json:"name"`
	Version int64  `json:"version"`
	Sealed  string `json:"sealed"`
}

// DeclaredData is one data set of a declared module.
type DeclaredData struct {
	Name     string `json:"name"`
	Path     string `json:"path"`
	Precious string `json:"precious"`
}

// Seal canonicalises body (any JSON object: a declaration, already holding
// node, serial and issued_at, or an alert) and signs it.
func Seal(body map[string]any, sign func([]byte) []byte, keyID string) (Envelope, []byte, error) {
	canon, err := Canonical(body)
	if err != nil {
		return Envelope{}, nil, err
	}
	return Envelope{Declaration: string(canon), Signature: base64.StdEncoding.EncodeToString(sign(canon)), Key: keyID}, canon, nil
}

// Verify checks an envelope against the controller key a host received at
// join and decodes the declaration.
func (e Envelope) Verify(key ed25519.PublicKey) (Declaration, error) {
	if !e.verifies(key) {
		return Declaration{}, fmt.Errorf("declaration: %w", ErrBadSignature)
	}
	var d Declaration
	if err := json.Unmarshal([]byte(e.Declaration), &d); err != nil {
		return Declaration{}, fmt.Errorf("declaration: %w", err)
	}
	return d, nil
}

func (e Envelope) verifies(key ed25519.PublicKey) bool {
	sig, err := base64.StdEncoding.DecodeString(e.Signature)
	return err == nil && len(key) == ed25519.PublicKeySize && ed25519.Verify(key, []byte(e.Declaration), sig)
}

// AlertSubject is where the controller publishes every raising and clearing
// of a condition that is not silenced.
const AlertSubject = "mesh.alert"

// AlertType is an alert's type: declarations have none, so a declaration
// the controller signed is never taken for an alert, nor an alert for a
// declaration (it has no node and no serial).
const AlertType = "alert"

// Alert is what mesh.alert carries, in the declaration's envelope (the same
// canonical form, signature and key): a reader verifies it against the
// controller's key (identity show) and so tells the controller's alerts
// from anything else published there.
type Alert struct {
	Type      string          `json:"type"`
	Event     string          `json:"event"` // raised or cleared
	Condition json.RawMessage `json:"condition"`
	At        time.Time       `json:"at"`
}

// ErrNotAlert means a signed envelope is not an alert.
var ErrNotAlert = errors.New("not an alert")

// OpenAlert checks an alert's envelope against the controller key and
// decodes it.
func OpenAlert(msg []byte, key ed25519.PublicKey) (Alert, error) {
	var e Envelope
	if err := json.Unmarshal(msg, &e); err != nil {
		return Alert{}, fmt.Errorf("alert: %w", ErrBadSignature)
	}
	if !e.verifies(key) {
		return Alert{}, fmt.Errorf("alert: %w", ErrBadSignature)
	}
	var a Alert
	if err := json.Unmarshal([]byte(e.Declaration), &a); err != nil {
		return Alert{}, fmt.Errorf("alert: %w", err)
	}
	if a.Type != AlertType {
		return Alert{}, fmt.Errorf("alert: %w (type %q)", ErrNotAlert, a.Type)
	}
	return a, nil
}
