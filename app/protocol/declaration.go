package protocol

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
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

// Declaration is a node's plan as it is sent: the one type the controller's
// planner makes and a host decodes. Serial and IssuedAt are filled in when
// it is numbered and signed (a plan shown by 'plan --json' has neither). A
// host ignores fields it does not know.
//
// The fields of every declaration type stand in the order of their JSON
// names, so that encoding one writes canonical JSON in a single pass
// (TestDeclaration_EncodesCanonically keeps it so): a push to thousands of
// nodes signs each without a round trip through a generic map.
type Declaration struct {
	// BackupLines are, for the holder of the backup seat, every data set it
	// keeps copies of.
	BackupLines []BackupLine `json:"backup_lines"`
	// Delete is what a person asked this node to delete (cleanup delete):
	// the only way a host ever removes data.
	Delete   []DeclaredDeletion `json:"delete,omitempty"`
	IssuedAt time.Time          `json:"issued_at,omitzero"`
	Mode     string             `json:"mode"`
	Modules  []DeclaredModule   `json:"modules"`
	Node     string             `json:"node"`
	// Seats are the seats the node's modules hold.
	Seats  []string `json:"seats"`
	Serial int64    `json:"serial,omitzero"`
}

// BackupLine is one data set the backup seat's holder keeps copies of.
type BackupLine struct {
	Cadence    string     `json:"cadence"`
	Data       string     `json:"data"`
	LastBackup *time.Time `json:"last_backup"`
	Module     string     `json:"module"`
	Node       string     `json:"node"`
	Path       string     `json:"path"`
	Precious   string     `json:"precious"`
}

// DeclaredDeletion is one cleanup a host carries out and reports done.
type DeclaredDeletion struct {
	Kind   string `json:"kind"` // data or consumer
	Module string `json:"module"`
	Path   string `json:"path,omitempty"`
	Target string `json:"target"`
}

// DeclaredModule is one module in a declaration.
type DeclaredModule struct {
	// Bindings are where it gets each provision from, with the credential
	// sealed to both ends.
	Bindings []DeclaredBinding `json:"bindings"`
	// Consumers are a provider's consumers, their access and credentials.
	Consumers []DeclaredConsumer `json:"consumers,omitempty"`
	Data      []DeclaredData     `json:"data"`
	Module    string             `json:"module"`
	// Ports are the ports it listens on.
	Ports []Port `json:"ports,omitempty"`
	// Run is how the module is started, as its manifest says.
	Run     *Run             `json:"run,omitempty"`
	Secrets []DeclaredSecret `json:"secrets"`
	// Settings are its effective settings: one JSON object, canonical.
	Settings json.RawMessage `json:"settings"`
	Version  string          `json:"version"`
	// WaitingFor names secrets the module waits for: its host does not start
	// it half-configured.
	WaitingFor []string `json:"waiting_for,omitempty"`
}

// Run is how a module is started.
type Run struct {
	Command []string `json:"command"`
}

// Port is a port a module listens on.
type Port struct {
	Expose string `json:"expose,omitempty"`
	Name   string `json:"name"`
	Port   int    `json:"port"`
}

// DeclaredBinding is one provision a module gets from a provider, and why
// that one.
type DeclaredBinding struct {
	Credential        string `json:"credential,omitempty"`
	CredentialName    string `json:"credential_name,omitempty"`
	CredentialVersion int64  `json:"credential_version,omitempty"`
	From              string `json:"from"` // node/module
	Provision         string `json:"provision"`
	Why               string `json:"why"`
}

// DeclaredConsumer is one consumer of a provider module.
type DeclaredConsumer struct {
	Consumer          string `json:"consumer"` // node/module
	Credential        string `json:"credential,omitempty"`
	CredentialName    string `json:"credential_name,omitempty"`
	CredentialVersion int64  `json:"credential_version,omitempty"`
	Provision         string `json:"provision"`
	State             string `json:"state"`
}

// DeclaredSecret is a secret sealed to the node (and the operator).
type DeclaredSecret struct {
	Name    string `json:"name"`
	Sealed  string `json:"sealed"`
	Version int64  `json:"version"`
}

// DeclaredData is one data set of a declared module.
type DeclaredData struct {
	Name     string `json:"name"`
	Path     string `json:"path"`
	Precious string `json:"precious"`
}

// Encode writes a declaration as canonical JSON in one pass (see
// Declaration); settings must already be canonical, as plans make them.
func (d Declaration) Encode() ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(d); err != nil {
		return nil, err
	}
	return bytes.TrimRight(b.Bytes(), "\n"), nil
}

// Seal numbers a declaration, canonicalises it and signs it: the envelope
// carries the canonical bytes as a string, so the signature is over exactly
// what arrives.
func Seal(d Declaration, sign func([]byte) []byte, keyID string) (Envelope, error) {
	canon, err := d.Encode()
	if err != nil {
		return Envelope{}, err
	}
	return Envelope{Declaration: string(canon), Signature: base64.StdEncoding.EncodeToString(sign(canon)), Key: keyID}, nil
}

// SealBody signs any body, canonicalised: for what the planner never makes
// (a fixture, or an attack a test performs with the controller's key).
func SealBody(body any, sign func([]byte) []byte, keyID string) (Envelope, error) {
	canon, err := Canonical(body)
	if err != nil {
		return Envelope{}, err
	}
	return Envelope{Declaration: string(canon), Signature: base64.StdEncoding.EncodeToString(sign(canon)), Key: keyID}, nil
}

// Verify checks an envelope against the controller key a host received at
// join and decodes the declaration.
func (e Envelope) Verify(key ed25519.PublicKey) (Declaration, error) {
	sig, err := base64.StdEncoding.DecodeString(e.Signature)
	if err != nil || len(key) != ed25519.PublicKeySize || !ed25519.Verify(key, []byte(e.Declaration), sig) {
		return Declaration{}, fmt.Errorf("declaration: %w", ErrBadSignature)
	}
	var d Declaration
	if err := json.Unmarshal([]byte(e.Declaration), &d); err != nil {
		return Declaration{}, fmt.Errorf("declaration: %w", err)
	}
	return d, nil
}
