// Package protocol is what crosses the broker between the controller and its
// hosts (protocol.md): subjects, message bodies, the signed envelope of every
// host message, and canonical, signed declarations. Both binaries use it; it
// imports no context.
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

// Timings every party keeps, named once.
const (
	// DefaultHeartbeat is how often a host beats unless told otherwise; a
	// node is silent after three of its intervals.
	DefaultHeartbeat = 10 * time.Second
	// AnswerTimeout is how long a party waits for an answer to a request,
	// or for the broker to confirm what it sent.
	AnswerTimeout = 5 * time.Second
)

// Subjects.
const (
	// JoinSubject is where a joining host asks to join (request). A
	// connection without credentials is the join user, in an account of its
	// own that imports this one subject from the mesh account as a service:
	// the controller sees the request with a reply the broker made and the
	// asker's address, and its answer can only go back to the asker's inbox
	// in the join account (embedded/broker.JoinUser).
	JoinSubject = "mesh.join"
	// JoinInboxPrefix is the inbox a joining connection answers on; the join
	// user may subscribe there and nowhere else. Every connection without
	// credentials may, so what an answer grants is sealed (JoinReply).
	JoinInboxPrefix = "_INBOX.join"
	// JoinBusy is the answer to a join the controller had no room or time
	// for: the host asks again a moment later.
	JoinBusy = "the controller is busy admitting other hosts: ask again"
	// JoinRefused is the one answer to every refused join (a token unknown,
	// of another node, used, replaced or expired; a node unknown or its name
	// reserved; a request malformed): an asker learns nothing of which
	// tokens or names exist. The controller's log says why, and repeated
	// refusals from one address raise join.refused.
	JoinRefused = "the token is not one this node can use (the controller's log says why)"
	// JoinFailed is the answer when the controller could not admit a host
	// for a reason of its own (a store it cannot write): ask again later.
	JoinFailed = "the controller could not admit the host now: ask again later"
)

// JoinAnswerWithin is how long a join may wait for its answer: the
// controller answers within it or not at all (the broker forgets the way
// back), and a host that heard nothing by then asks again.
const JoinAnswerWithin = 5 * time.Second

// What a host says, the last token of mesh.node.N.<what>.
const (
	Heartbeat   = "heartbeat"
	FactsReport = "facts"
	Applied     = "applied"
	DataReport  = "data"
	// DeclarationAsk is the host's request for its latest declaration.
	DeclarationAsk = "declaration"
)

// NodeSubject is mesh.node.<node>.<what>.
func NodeSubject(node, what string) string { return "mesh.node." + node + "." + what }

// NodeWildcard is mesh.node.*.<what>, for the controller's subscriptions.
func NodeWildcard(what string) string { return "mesh.node.*." + what }

// NodeOfSubject returns N of mesh.node.N.<anything>, or "".
func NodeOfSubject(subject string) string {
	const prefix = "mesh.node."
	if len(subject) <= len(prefix) || subject[:len(prefix)] != prefix {
		return ""
	}
	rest := subject[len(prefix):]
	for i := 0; i < len(rest); i++ {
		if rest[i] == '.' {
			return rest[:i]
		}
	}
	return ""
}

// DeclarationInbox is where the controller publishes a node's new declaration.
func DeclarationInbox(node string) string { return NodeSubject(node, "inbox.declaration") }

// HostInboxPrefix is the inbox prefix of node N's connection: only that host
// may subscribe there, so no host reads another's answers.
func HostInboxPrefix(node string) string { return "_INBOX." + node }

// AnswerToken is the word after mesh.node.N. of where node N's host answers
// a request the controller sends it (AnswerSubject).
const AnswerToken = "answer"

// AnswerSubject is the reply subject of one request to node N's host
// (mesh.node.N.answer.<id>), id one token unique to that request (the
// requester makes it, a NUID say, and subscribes to the subject before it
// asks). It lies under the node's own subjects, which the host may publish
// to already (mesh.node.N.>), so a host needs no permission to publish in
// anyone's inbox to answer, and no other host, module or anonymous
// connection may publish or subscribe there: only node N's host and
// controllers. Hosts answer on whatever reply subject a request carries
// (protocol 1.0 and 1.1 too), so this asks nothing new of them.
func AnswerSubject(node, id string) string { return NodeSubject(node, AnswerToken+"."+id) }

// JoinRequest is what a host sends to join.
type JoinRequest struct {
	Token        string `json:"token"`
	Node         string `json:"node"`
	HostKey      string `json:"host_key"` // ed25519 public key, base64
	AgeRecipient string `json:"age_recipient"`
	NKey         string `json:"nkey"` // the host's broker user public nkey
	HostVersion  string `json:"host_version"`
	// Renew, instead of a token, is a renewal of an expired credential:
	// a RenewBody signed by the host key the node joined with (Sign).
	Renew json.RawMessage `json:"renew,omitempty"`
	// Protocol is the protocol the host speaks (Version); none is
	// Unversioned. A controller that does not speak it refuses the join,
	// saying why in the answer, before the token is looked at.
	Protocol string `json:"protocol,omitempty"`
}

// JoinReply is the controller's answer to a join: the grant, sealed to the
// age recipient the request named, or an error (JoinRefused, JoinBusy or
// JoinFailed). Any connection without credentials may read the answers in
// the join account's inboxes (the broker cannot keep them to their asker),
// so what a grant holds is readable only by the holder of that age identity.
type JoinReply struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
	// Sealed is the JoinGrant, sealed (SealJoinGrant).
	Sealed string `json:"sealed,omitempty"`
	// Protocol is the controller's (Version), as on all its answers.
	Protocol string `json:"protocol,omitempty"`
}

// JoinGrant is what a joined host is given.
type JoinGrant struct {
	// Node is the node it joined as: a grant for another is refused.
	Node string `json:"node"`
	// Creds is the host's user JWT as the JWT half of a .creds document; the
	// host adds its own nkey seed, which never leaves it.
	Creds         string   `json:"creds"`
	ControllerKey string   `json:"controller_key"` // ed25519 public key, base64
	BrokerURLs    []string `json:"broker_urls"`
}

// HeartbeatBody is a host's regular beat.
type HeartbeatBody struct {
	At            time.Time `json:"at"`
	IntervalS     float64   `json:"interval_s"`
	SerialApplied int64     `json:"serial_applied"`
	UptimeS       int64     `json:"uptime_s"`
	// HostVersion is the version the host binary is stamped with, as it
	// says at join: beaten every time, so that the controller knows what
	// each host runs across its own upgrades. Absent from hosts that
	// predate it (their version is the one they joined with).
	HostVersion string `json:"host_version,omitempty"`
	// Modules are the states of the modules its host supervises.
	Modules []ModuleState `json:"modules,omitempty"`
	// Peers are its overlay peers' last handshakes, when it has an overlay.
	Peers []PeerHandshake `json:"peers,omitempty"`
	// Applying is the declaration its host is applying, while it is: an
	// apply that fetches a large archive takes minutes, and the host beats
	// meanwhile. Absent between applies, and from hosts that predate it;
	// a controller that predates it ignores it.
	Applying *Applying `json:"applying,omitempty"`
	// ControllerKey is the newest controller key the host verifies with
	// (a KeyID): its acknowledgement of a rotation. Absent from hosts
	// that predate rotations.
	ControllerKey string `json:"controller_key,omitempty"`
}

// Applying is a declaration a host is applying.
type Applying struct {
	Serial int64 `json:"serial"`
	// Since is when the host began applying it, on its own clock.
	Since time.Time `json:"since"`
	// Phase is the part of the apply under way, named as the apply
	// report's tiers are (verify, archives, files…).
	Phase string `json:"phase,omitempty"`
}

// Module states a host reports (protocol.md, "Added in the second round").
const (
	StateWaiting      = "waiting"       // for secrets: not started
	StateStarting     = "starting"      // started, not ready yet
	StateReady        = "ready"         // its ready check passed
	StateBackingOff   = "backing-off"   // exited; restarted after a pause
	StateCrashLooping = "crash-looping" // keeps exiting: retried at the cap
	StateStopped      = "stopped"       // stopped on purpose
	StateFailed       = "failed"        // cannot start: not found, not executable, exits before ready
)

// ModuleState is one supervised module as its host sees it.
type ModuleState struct {
	Module  string `json:"module"`
	Version string `json:"version"`
	// Archive is the digest of the archive it runs from ("" for a module
	// the mesh did not build): the collection reads what runs where from it.
	Archive string `json:"archive,omitempty"`
	State   string `json:"state"`
	// Serial is the declaration whose apply last (re)started it, and
	// DeclaredAt when the controller issued that declaration: a start is
	// timed on the controller's clock.
	Serial     int64     `json:"serial,omitempty"`
	DeclaredAt time.Time `json:"declared_at,omitzero"`
	Pid        int       `json:"pid,omitempty"`
	Since      time.Time `json:"since"`
	// Restarts1h counts the restarts in the last hour.
	Restarts1h int `json:"restarts_1h"`
	// LastExit is how its last run ended ("exit status 1", "signal: killed").
	LastExit string `json:"last_exit,omitempty"`
	// Detail says what it waits for, or why it failed.
	Detail string `json:"detail,omitempty"`
	// LogTail is the last lines of its log when it failed or crash-loops.
	LogTail []string `json:"log_tail,omitempty"`
}

// LogsInbox is the last tokens of the subject a controller asks a host for
// a module's log on (mesh.node.N.inbox.logs): only controller users may
// publish there and only node N's host reads it.
const LogsInbox = "inbox.logs"

// LogsAsk is a request for a module's log.
type LogsAsk struct {
	Module string `json:"module"`
	Lines  int    `json:"lines"`
	Follow bool   `json:"follow"`
}

// LogsAnswer is a part of a module's log. Following, the host sends each
// part as a request to the asker's reply subject and stops when nobody
// answers it; an empty part says it is still following.
type LogsAnswer struct {
	Lines []string `json:"lines"`
	Error string   `json:"error,omitempty"`
	// End says the host sends no more (it stops following).
	End bool `json:"end,omitempty"`
}

// LogsKeepalive is how often a following host sends a part, empty if
// nothing was written: a follower that stopped answering is noticed, and a
// follower that hears nothing for a few of these knows the host is gone.
const LogsKeepalive = 5 * time.Second

// MaxLogLine bounds one line of a log as a host sends it.
const MaxLogLine = 4096

// MaxLogLines bounds what one logs answer carries.
const MaxLogLines = 10000

// ToolSubject is mesh.tool.M.T, answered by any running instance of M
// (queue group M); ToolSubjectOn is mesh.tool.M.T.N, M on node N.
func ToolSubject(module, tool string) string { return "mesh.tool." + module + "." + tool }

// ToolSubjectOn is the tool subject of the instance on one node.
func ToolSubjectOn(module, tool, node string) string { return ToolSubject(module, tool) + "." + node }

// Fact is one thing a host reported about its machine, with its evidence.
type Fact struct {
	Name  string `json:"name"`
	Value string `json:"value"`
	Why   string `json:"why"`
}

// Found is something a host found running beside the mesh's modules.
type Found struct {
	Kind   string `json:"kind"` // port, service or path
	Name   string `json:"name"`
	Detail string `json:"detail"`
	// Address is where a port listens ("0.0.0.0", "[::1]").
	Address string `json:"address,omitempty"`
	// Pid and Command are the process that holds a port (or runs a
	// service), when the host could see it.
	Pid     int    `json:"pid,omitempty"`
	Command string `json:"command,omitempty"`
	// Unit is the systemd unit the process runs in, from its cgroup.
	Unit string `json:"unit,omitempty"`
}

// FactsBody is a host's facts report.
type FactsBody struct {
	Facts []Fact  `json:"facts"`
	Found []Found `json:"found"`
}

// Tier is the duration of one stage of applying.
type Tier struct {
	Tier string  `json:"tier"`
	MS   float64 `json:"ms"`
}

// AppliedBody is a host's report after applying (or refusing) a declaration.
type AppliedBody struct {
	Serial  int64   `json:"serial"`
	OK      bool    `json:"ok"`
	Error   string  `json:"error,omitempty"`
	Tiers   []Tier  `json:"tiers"`
	TotalMS float64 `json:"total_ms"`
	// Waiting says which modules wait (for secrets) rather than run.
	Waiting []string `json:"waiting,omitempty"`
	// Modules are the states of its modules once the declaration's files
	// were applied: one that cannot start is failed there, which is a
	// module's condition, not a failed apply.
	Modules []ModuleState `json:"modules,omitempty"`
	// StatesAt is when, on its host's clock, Modules were read: a report
	// the controller keeps after a later beat (its writer is not the
	// beats') must not put older states over newer ones. Absent from hosts
	// that predate it.
	StatesAt time.Time `json:"states_at,omitzero"`
}

// FilterFact is the fact in which a host reports the mesh's packet filter
// on its machine: its value one of the Filter… states below, its why the
// declaration's serial and, when rolled back, why. A host reports it in
// its facts at every (re)connection, so a rollback done while the
// controller could not be heard is heard once it can be.
const FilterFact = "filter"

// The states of a node's packet filter, as its host reports them.
const (
	// FilterWaiting: applied, the host not yet having heard the controller.
	FilterWaiting = "waiting"
	// FilterKept: applied, and the controller heard after it.
	FilterKept = "kept"
	// FilterRolledBack: the controller not heard within the confirm
	// window after applying; the ruleset before it is back.
	FilterRolledBack = "rolled-back"
	// FilterRemoved: the declaration carries none; the mesh's table is gone.
	FilterRemoved = "removed"
)

// DataSet is one data set as a host found it.
type DataSet struct {
	Module     string     `json:"module"`
	Name       string     `json:"name"`
	Path       string     `json:"path"`
	Bytes      int64      `json:"bytes"`
	Precious   string     `json:"precious"`
	LastBackup *time.Time `json:"last_backup"`
}

// DataBody is a host's data report.
type DataBody struct {
	Sets []DataSet `json:"sets"`
	// Deleted are the deletions its declaration asked for, done.
	Deleted []DeclaredDeletion `json:"deleted,omitempty"`
}

// BackupReport is the backup seat holder's host saying a backup line was done.
const BackupReport = "backup"

// BackupBody is one backup line done.
type BackupBody struct {
	Node   string    `json:"node"`
	Module string    `json:"module"`
	Data   string    `json:"data"`
	At     time.Time `json:"at"`
}

// DeclarationAskBody is a host's request for its latest declaration.
type DeclarationAskBody struct {
	SerialApplied int64 `json:"serial_applied"`
}

// OKReply is the controller's plain acknowledgement.
type OKReply struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
	// Protocol is the answering controller's (Version).
	Protocol string `json:"protocol,omitempty"`
}

// Signed wraps every host message: the body's exact bytes and the host key's
// signature over them, and the protocol the host speaks (none:
// Unversioned). The protocol stands outside what is signed, so that a
// controller that predates it verifies the body as before; only the node's
// own host may publish under its subjects, so no one else can say it.
type Signed struct {
	Body      json.RawMessage `json:"body"`
	Signature string          `json:"signature"`
	Protocol  string          `json:"protocol,omitempty"`
}

// ErrBadSignature means a message did not verify against the key it claims.
var ErrBadSignature = errors.New("signature does not verify")

// Sign marshals body and wraps it with the host key's signature.
func Sign(key ed25519.PrivateKey, body any) ([]byte, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	return json.Marshal(Signed{Body: b, Signature: base64.StdEncoding.EncodeToString(ed25519.Sign(key, b)), Protocol: Version})
}

// Open verifies a signed message against key and decodes its body into v.
func Open(data []byte, key ed25519.PublicKey, v any) error {
	_, err := OpenVersioned(data, key, v)
	return err
}

// OpenVersioned is Open, and says which protocol the message speaks
// (Unversioned when it says none): the controller judges it (Speaks)
// once the signature verified.
func OpenVersioned(data []byte, key ed25519.PublicKey, v any) (protocol string, err error) {
	var s Signed
	if err := json.Unmarshal(data, &s); err != nil {
		return "", fmt.Errorf("not a signed message: %w", err)
	}
	sig, err := base64.StdEncoding.DecodeString(s.Signature)
	if err != nil || len(key) != ed25519.PublicKeySize || !ed25519.Verify(key, s.Body, sig) {
		return "", ErrBadSignature
	}
	if v == nil {
		return Of(s.Protocol), nil
	}
	return Of(s.Protocol), json.Unmarshal(s.Body, v)
}

// Canonical is v as canonical JSON: object keys sorted, no insignificant
// white space, numbers as written, no HTML escaping.
func Canonical(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var generic any
	if err := dec.Decode(&generic); err != nil {
		return nil, err
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(generic); err != nil { // maps marshal with sorted keys
		return nil, err
	}
	return bytes.TrimRight(out.Bytes(), "\n"), nil
}

// Build subjects (protocol.md, "Builders and tools"). Only the holders of
// the build seat may take asks and report on them; the controller asks.
const (
	// BuildProgress carries a build's log lines as they are written.
	BuildProgress = "mesh.build.progress"
	// BuildResult carries a build's outcome (a request: the controller
	// answers once it has recorded it).
	BuildResult = "mesh.build.result"
)

// BuildAskSubject is where the controller asks the builder on node to
// build (a request, answered at once with BuildTaken).
func BuildAskSubject(node string) string { return "mesh.build.ask." + node }

// BuildKillSubject is where the controller ends a build on node.
func BuildKillSubject(node string) string { return "mesh.build.kill." + node }

// BuildTaken is a builder's answer to an ask.
type BuildTaken struct {
	Taken bool   `json:"taken"`
	Why   string `json:"why,omitempty"`
}

// BuildLine is one line of a build's log.
type BuildLine struct {
	ID   string `json:"id"`
	Line string `json:"line"`
}

// BuildKill ends a build.
type BuildKill struct {
	ID string `json:"id"`
}
