package protocol

import (
	"bytes"
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
	// Protocol is the sending controller's (Version). What a host judges
	// is the declaration's own, signed inside it (Declaration.Protocol).
	Protocol string `json:"protocol,omitempty"`
}

// None is the answer to a host asking for its latest declaration when there is none.
type None struct {
	None     bool   `json:"none"`
	Protocol string `json:"protocol,omitempty"`
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
	// Backups are the node's own data sets its host backs up when asked
	// (protocol's backup.go).
	Backups []DeclaredBackup `json:"backups,omitempty"`
	// Delete is what a person asked this node to delete (cleanup delete):
	// the only way a host ever removes data.
	Delete []DeclaredDeletion `json:"delete,omitempty"`
	// Filter is the packet filter the mesh owns on this node (a converged
	// node's); nil means it owns none, and a host that applied one before
	// removes the mesh's table, and only that.
	Filter *DeclaredFilter `json:"filter,omitempty"`
	// Host is the host release the node should run: its host upgrades
	// itself to it when it runs another (host.go). nil: it is left on
	// whatever it runs.
	Host     *DeclaredHost    `json:"host,omitempty"`
	IssuedAt time.Time        `json:"issued_at,omitzero"`
	Mode     string           `json:"mode"`
	Modules  []DeclaredModule `json:"modules"`
	// Networks are the networks the node routes for what it hosts
	// (canonical CIDR prefixes, sorted): its filter forwards them.
	Networks []string `json:"networks,omitempty"`
	Node     string   `json:"node"`
	// Overlay is the node's part of the mesh's private network; nil: none
	// yet (its host brings no interface up, and takes down one it had).
	Overlay *DeclaredOverlay `json:"overlay,omitempty"`
	// Protocol is the protocol it is written in, filled in when it is
	// sealed (Version); none is Unversioned. A host refuses a newer major
	// than it reads (Reads) before touching anything.
	Protocol string `json:"protocol,omitempty"`
	// PublicDomain is the domain its public ports' routed names are
	// composed under (<port>.<module>.<domain>); none: they are closed.
	PublicDomain string `json:"public_domain,omitempty"`
	// Seats are the seats the node's modules hold.
	Seats  []string `json:"seats"`
	Serial int64    `json:"serial,omitzero"`
	// Taken are the cutovers of modules taken onto an adopted node (take):
	// each done once, before its module first starts.
	Taken []DeclaredTake `json:"taken,omitempty"`
}

// BackupLine is one data set the backup seat's holder keeps copies of.
type BackupLine struct {
	Cadence string `json:"cadence"`
	Data    string `json:"data"`
	// Keep is how many snapshots of each period the holder keeps.
	Keep       Retention  `json:"keep"`
	LastBackup *time.Time `json:"last_backup"`
	// LastVerified is the last restore drill that passed.
	LastVerified *time.Time `json:"last_verified,omitempty"`
	Module       string     `json:"module"`
	Node         string     `json:"node"`
	Path         string     `json:"path"`
	Precious     string     `json:"precious"`
	// Recipient is the node's age recipient: the holder seals the node's
	// access to it.
	Recipient string `json:"recipient,omitempty"`
	// Retired says the data set's module left the node: its data is kept
	// there, and backed up, until a person deletes it.
	Retired bool `json:"retired,omitempty"`
}

// DeclaredFilter is the packet filter the mesh owns on a node: one nftables
// table of its own (FilterTable), which the host replaces atomically and
// rolls back by itself when it cannot hear the controller after applying.
type DeclaredFilter struct {
	// Kind is the filter's language: FilterNftables.
	Kind string `json:"kind"`
	// Ruleset is the whole table, as nft -f reads it: exactly one
	// "table inet mesh { … }" and nothing beside it.
	Ruleset string `json:"ruleset"`
}

// Filters a declaration may carry, and the one table the mesh owns.
const (
	FilterNftables = "nftables"
	FilterTable    = "inet mesh"
)

// DeclaredDeletion is one cleanup a host carries out and reports done.
type DeclaredDeletion struct {
	Kind   string `json:"kind"` // data or consumer
	Module string `json:"module"`
	Path   string `json:"path,omitempty"`
	Target string `json:"target"`
}

// DeclaredModule is one module in a declaration.
type DeclaredModule struct {
	// Archive is what the mesh built of this version, when it built it: its
	// host fetches it from the broker's object store (ArchiveBucket),
	// verifies its sha256, unpacks it into the module's version directory
	// and runs run.command from there.
	Archive *Archive `json:"archive,omitempty"`
	// Bindings are where it gets each provision from, with the credential
	// sealed to both ends.
	Bindings []DeclaredBinding `json:"bindings"`
	// BrokerCreds is the module's own broker user (a .creds document),
	// sealed to the node alone: it can always be issued again.
	BrokerCreds string `json:"broker_creds,omitempty"`
	// Consumers are a provider's consumers, their access and credentials.
	Consumers []DeclaredConsumer `json:"consumers,omitempty"`
	Data      []DeclaredData     `json:"data"`
	// HoldsBackup says it holds the backup seat, whatever the seat is
	// called now (seat rename): its host gives it the declaration's backup
	// lines in a file (BackupLinesName).
	HoldsBackup bool `json:"holds_backup,omitempty"`
	// Licences are the licences it holds, each sealed to the node (and the
	// operator): its host writes each beside its secrets and names it in
	// its environment (LicenceEnv).
	Licences []DeclaredLicence `json:"licences,omitempty"`
	// Manages are the refreshable licences it manages: each its refresh
	// token, sealed to the node (and the operator); its host writes each
	// beside its licences and names it in its environment (RefreshEnv).
	Manages []DeclaredLicence `json:"manages,omitempty"`
	// MemoryMB is the manifest's requires.memory_mb: a host that can
	// bounds the module's memory to it.
	MemoryMB int64  `json:"memory_mb,omitempty"`
	Module   string `json:"module"`
	// Ports are the ports it listens on.
	Ports []Port `json:"ports,omitempty"`
	// Prepare is how this version brings the module's data to its shape:
	// its host runs it on an upgrade to this version, between the old
	// version stopped (its precious data snapshotted) and this one started.
	Prepare *Prepare `json:"prepare,omitempty"`
	// Run is how the module is started, as its manifest says.
	Run *Run `json:"run,omitempty"`
	// Seats are the seats it holds, by their names now.
	Seats   []string         `json:"seats,omitempty"`
	Secrets []DeclaredSecret `json:"secrets"`
	// Settings are its effective settings: one JSON object, canonical.
	Settings json.RawMessage `json:"settings"`
	Version  string          `json:"version"`
	// WaitingFor names secrets the module waits for: its host does not start
	// it half-configured.
	WaitingFor []string `json:"waiting_for,omitempty"`
	// WaitingForLicences names licences its manifest needs that it does
	// not hold yet: its host does not start it without them either.
	WaitingForLicences []string `json:"waiting_for_licences,omitempty"`
	// WithoutSnapshot says a person allowed this version to be prepared
	// without a snapshot of the module's irreplaceable data (upgrade M
	// roll-out --without-snapshot --why): its host goes on, and says so,
	// where no snapshot can be taken. It is not part of the module's run:
	// its host restarts no module for it (runRecords).
	WithoutSnapshot bool `json:"without_snapshot,omitempty"`
}

// Prepare is a version's prepare (manifest.md): a command and how long it
// may run, a Go duration ("" is DefaultPrepareTimeout).
type Prepare struct {
	Command []string `json:"command"`
	Timeout string   `json:"timeout,omitempty"`
}

// The bounds of a prepare's timeout, and its default.
const (
	DefaultPrepareTimeout = 10 * time.Minute
	MinPrepareTimeout     = time.Second
	MaxPrepareTimeout     = 24 * time.Hour
)

// PrepareTimeout is how long p may run.
func (p Prepare) PrepareTimeout() time.Duration {
	d, err := time.ParseDuration(p.Timeout)
	if err != nil || d < MinPrepareTimeout || d > MaxPrepareTimeout {
		return DefaultPrepareTimeout // judged by Problems: only "" is here
	}
	return d
}

// DeclaredLicence is one version of a licence's token, sealed to the node
// (and the operator).
type DeclaredLicence struct {
	Name    string `json:"name"`
	Sealed  string `json:"sealed"`
	Version int64  `json:"version"`
}

// Archive names a built module's archive: content-addressed by its sha256.
type Archive struct {
	Bytes  int64  `json:"bytes"`
	Digest string `json:"digest"`
	// UnpackedBytes is what it unpacks to, as its builder packed it: the
	// sum of its regular files' sizes. Signed with the digest, so a host
	// judges before unpacking whether it fits its disk and stops an
	// archive that unpacks past it. 0 (absent) for archives built before
	// it was kept: the host learns it from the archive's own headers.
	UnpackedBytes int64 `json:"unpacked_bytes,omitempty"`
}

// ArchiveBucket is the broker's object store bucket of module archives,
// each named by its sha256 (hex): builders write it, hosts and the
// controller read it.
const ArchiveBucket = "mesh-archives"

// MaxArchiveBytes bounds an archive a host fetches.
const MaxArchiveBytes = 4 << 30

// MaxUnpackedBytes bounds what an archive may unpack to (32 GiB): the sum
// of its files' sizes (app/archive's MaxTotalBytes).
const MaxUnpackedBytes int64 = 32 << 30

// Run is how a module is started, as its manifest says (manifest.md,
// "Running"), with env values taken from settings already filled in.
type Run struct {
	Command []string          `json:"command"`
	Env     map[string]string `json:"env,omitempty"`
	Ready   *Ready            `json:"ready,omitempty"`
	// StopGrace is how long a module has between SIGTERM and SIGKILL, as a
	// Go duration ("10s"); empty is DefaultStopGrace.
	StopGrace string `json:"stop_grace,omitempty"`
}

// Ready says when a started module is ready: exactly one field is set, or
// none (DefaultReadyAfter of running without exiting).
type Ready struct {
	// After: running this long (a Go duration) without exiting.
	After string `json:"after,omitempty"`
	// Command: this command, run in the module's directory, exits 0.
	Command []string `json:"command,omitempty"`
	// Port: the declared port of this name accepts TCP connections.
	Port string `json:"port,omitempty"`
}

// Defaults of Run.
const (
	DefaultStopGrace  = 10 * time.Second
	DefaultReadyAfter = 2 * time.Second
)

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
	// Port is the port the provider provides on, if it names one.
	Port      int    `json:"port,omitempty"`
	Provision string `json:"provision"`
	Why       string `json:"why"`
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
	if d.Protocol == "" {
		d.Protocol = Version
	}
	canon, err := d.Encode()
	if err != nil {
		return Envelope{}, err
	}
	return envelope(canon, sign, keyID), nil
}

// SealBody signs any body, canonicalised: for what the planner never makes
// (a fixture, or an attack a test performs with the controller's key).
func SealBody(body any, sign func([]byte) []byte, keyID string) (Envelope, error) {
	canon, err := Canonical(body)
	if err != nil {
		return Envelope{}, err
	}
	return envelope(canon, sign, keyID), nil
}

// envelope signs canonical bytes and carries them as the string signed.
func envelope(canon []byte, sign func([]byte) []byte, keyID string) Envelope {
	return Envelope{Declaration: string(canon), Signature: base64.StdEncoding.EncodeToString(sign(canon)), Key: keyID, Protocol: Version}
}

// Verify checks an envelope against the controller key a host received at
// join and decodes the declaration. One written in a protocol this build
// does not read (Reads) is refused with a *MismatchError, its node and
// serial alone decoded, before the rest is read.
func (e Envelope) Verify(key ed25519.PublicKey) (Declaration, error) {
	if !e.verifies(key) {
		return Declaration{}, fmt.Errorf("declaration: %w", ErrBadSignature)
	}
	var head struct {
		Node     string `json:"node"`
		Serial   int64  `json:"serial"`
		Protocol string `json:"protocol"`
	}
	if err := json.Unmarshal([]byte(e.Declaration), &head); err != nil {
		return Declaration{}, fmt.Errorf("declaration: %w", err)
	}
	if err := Reads(head.Protocol); err != nil {
		return Declaration{Node: head.Node, Serial: head.Serial, Protocol: head.Protocol}, err
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
	// Protocol is the controller's (Version).
	Protocol  string          `json:"protocol,omitempty"`
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
