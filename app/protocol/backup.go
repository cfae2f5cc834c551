package protocol

import "time"

// Backups of data sets (issue 29). The holder of the backup seat runs the
// backup module (cmd/mesh-backup): a restic REST server, append-only, one
// private repository per node beneath its repository data set, all
// encrypted with its repository_password secret. The holder schedules:
// when a line is due it tells the controller (BackupDueSubject), which
// asks the data's own host (BackupAsk on the host's inbox); the host runs
// restic backup of that path into its node's repository through the
// holder's REST server (only what changed crosses the network), and
// reports the outcome (BackupOutcome, on its node's BackedUp subject). The
// holder issues each node its access (a REST user of its own and the
// repository password, sealed to that node: BackupAccessSubject), prunes
// the repositories locally (retention: nodes can only append), and drills
// restores (DrillSubject).

// DeclaredBackup is one of a node's own data sets its host backs up when
// asked: in the data node's declaration, for every backup line of it.
// Fields in the order of their JSON names (Declaration).
type DeclaredBackup struct {
	// Access is the node's BackupAccess sealed to it (age armor, Label:
	// this node, module BackupModule, name BackupAccessName); "" until the
	// holder has issued it (the host then answers an ask not taken).
	Access string `json:"access,omitempty"`
	// Before is run by the host before each backup, as the module's user in
	// the module's directory, with the module's environment (a database
	// dump into the data set, say); a failure fails the backup.
	Before  []string `json:"before,omitempty"`
	Cadence string   `json:"cadence"`
	Data    string   `json:"data"`
	Module  string   `json:"module"`
	// Path is the data set's path on the node (beneath its host's root).
	Path string `json:"path"`
	// Repository is where the node's repository is, as restic names it,
	// with no credential: rest:http://ADDRESS:PORT/NODE/.
	Repository string `json:"repository"`
}

// BackupAccess is what a node needs to write to its repository, sealed to
// it by the holder: its REST user and password (a private repository is
// its user's alone) and the repository password restic encrypts with.
type BackupAccess struct {
	User               string `json:"user"`
	Password           string `json:"password"`
	RepositoryPassword string `json:"repository_password"`
}

// FactRestic is the fact in which a host reports the restic it backs up
// and restores with: its version ("0.14.0"), or "" when there is none on
// its PATH (its why says so).
const FactRestic = "restic"

// BackupModule is the module the backup seat's holder runs, whose name the
// sealed accesses carry, and BackupAccessName a sealed access's name.
const (
	BackupModule     = "backup"
	BackupAccessName = "backup-access"
)

// Retention is how many snapshots of each period the holder keeps of a
// data set (restic forget --keep-hourly … --prune); the manifest's data
// set says it (DataBackup.Keep), else DefaultRetention.
type Retention struct {
	Daily   int `json:"daily"`
	Hourly  int `json:"hourly"`
	Monthly int `json:"monthly"`
	Weekly  int `json:"weekly"`
}

// DefaultRetention keeps a day of hourlies, a week of dailies, five weeks
// and a year of monthlies.
var DefaultRetention = Retention{Hourly: 24, Daily: 7, Weekly: 5, Monthly: 12}

// BackupLinesEnv names the file (in the holder module's directory) its
// host writes the backup lines of its declaration to, as JSON (a
// BackupLines document), every time they change.
const (
	BackupLinesEnv  = "MESH_BACKUP_LINES"
	BackupLinesName = "backup-lines.json"
)

// BackupLines is the file BackupLinesEnv names.
type BackupLines struct {
	Lines []BackupLine `json:"lines"`
}

// The subjects of backups.
const (
	// BackupAskName is the host's inbox subject (mesh.node.N.inbox.backup)
	// the controller asks a backup on: BackupAsk, answered BackupTaken at
	// once; the outcome follows on BackedUp.
	BackupAskName = "backup"
	// RestoreAskName is the host's inbox subject (mesh.node.N.inbox.restore)
	// the controller asks a restore on: RestoreAsk, answered BackupTaken;
	// the outcome follows on BackedUp.
	RestoreAskName = "restore"
	// BackedUp is the host's report (mesh.node.N.backed-up, signed) of a
	// backup or restore it did: BackupOutcome.
	BackedUp = "backed-up"
)

// BackupDueSubject is where the holder on node says a line is due (a
// request: BackupDue, answered OKReply once the data's host was asked).
func BackupDueSubject(node string) string { return "mesh.backup.due." + node }

// BackupAccessSubject is where the holder on node hands the controller a
// node's sealed access (a request: BackupAccessIssued, answered OKReply
// once kept).
func BackupAccessSubject(node string) string { return "mesh.backup.access." + node }

// DrillSubject is where the holder on node reports a restore drill (a
// request: DrillOutcome, answered OKReply once recorded).
func DrillSubject(node string) string { return "mesh.backup.drilled." + node }

// BackupDue says a line is due.
type BackupDue struct {
	Node   string `json:"node"`
	Module string `json:"module"`
	Data   string `json:"data"`
}

// BackupAccessIssued is a node's access, sealed to it.
type BackupAccessIssued struct {
	Node   string `json:"node"`
	Sealed string `json:"sealed"`
}

// BackupAsk asks a host to back up one of its data sets now. ID names the
// ask in its outcome; Reason is why (due, by hand, before a risky act).
type BackupAsk struct {
	ID     string `json:"id"`
	Module string `json:"module"`
	Data   string `json:"data"`
	Reason string `json:"reason,omitempty"`
}

// RestoreAsk asks a host to restore one of its data sets: the module is
// stopped, the current contents moved aside (never overwritten), the
// snapshot restored in their place, the module started again.
type RestoreAsk struct {
	ID     string `json:"id"`
	Module string `json:"module"`
	Data   string `json:"data"`
	// Snapshot is restic's id of the snapshot ("latest": the newest of that
	// data set).
	Snapshot string `json:"snapshot"`
	// From is the node whose repository holds the snapshot (this node's
	// own, or another's for data restore --to); Repository and Access are
	// that repository's, the access sealed to this node (empty: this
	// node's own, from its declaration).
	From       string `json:"from"`
	Repository string `json:"repository,omitempty"`
	Access     string `json:"access,omitempty"`
	// Path is where the data set was when the snapshot was taken, when it
	// is not where it is now (the snapshot holds that path).
	SnapshotPath string `json:"snapshot_path,omitempty"`
}

// BackupTaken answers an ask at once.
type BackupTaken struct {
	Taken bool   `json:"taken"`
	Why   string `json:"why,omitempty"`
}

// BackupOutcome is what came of a backup or a restore on a host.
type BackupOutcome struct {
	ID     string `json:"id"`
	Kind   string `json:"kind"` // "backup" or "restore"
	Module string `json:"module"`
	Data   string `json:"data"`
	// Reason is why the host did it of its own accord, when no ask did
	// ("before the upgrade of M to V"; a restore of what a failed prepare
	// left).
	Reason string `json:"reason,omitempty"`
	OK     bool   `json:"ok"`
	// Why says, in one line, why it failed.
	Why string `json:"why,omitempty"`
	// Snapshot is the snapshot made (backup) or restored (restore).
	Snapshot string `json:"snapshot,omitempty"`
	// Files and Bytes are what it processed; BytesAdded what a backup
	// added to the repository (what crossed the network, compressed).
	Files      int64   `json:"files"`
	Bytes      int64   `json:"bytes"`
	BytesAdded int64   `json:"bytes_added"`
	DurationMS float64 `json:"duration_ms"`
	// Aside is where a restore moved the data set's contents before it
	// (a path beneath the node's root, as the data set's path is), "" if
	// it was empty.
	Aside string    `json:"aside,omitempty"`
	At    time.Time `json:"at"`
}

// The kinds of an outcome.
const (
	KindBackup  = "backup"
	KindRestore = "restore"
)

// DrillOutcome is a restore drill: the holder restored a snapshot into a
// scratch directory, checked the repository (restic check
// --read-data-subset) and verified every restored file against the
// snapshot (restic restore --verify).
type DrillOutcome struct {
	Node       string    `json:"node"`
	Module     string    `json:"module"`
	Data       string    `json:"data"`
	Snapshot   string    `json:"snapshot"`
	OK         bool      `json:"ok"`
	Why        string    `json:"why,omitempty"`
	Files      int64     `json:"files"`
	Bytes      int64     `json:"bytes"`
	DurationMS float64   `json:"duration_ms"`
	At         time.Time `json:"at"`
}

// DefaultBackupPort is where the backup module's REST server listens when
// neither its manifest (a port named rest) nor its settings ("port") say.
const DefaultBackupPort = 8420

// The backup module's tools (mesh.tool.backup.T), asked by the controller.
const (
	// ToolSnapshots lists a data set's snapshots, newest first:
	// SnapshotsAsk → SnapshotsAnswer.
	ToolSnapshots = "snapshots"
	// ToolVerify drills a data set now: SnapshotsAsk → DrillOutcome.
	ToolVerify = "verify"
	// ToolGrant seals a node's repository access to another node (data
	// restore --to): GrantAsk → BackupAccessIssued.
	ToolGrant = "grant"
)

// SnapshotsAsk names a data set.
type SnapshotsAsk struct {
	Node   string `json:"node"`
	Module string `json:"module"`
	Data   string `json:"data"`
}

// Snapshot is one snapshot a repository holds.
type Snapshot struct {
	ID    string    `json:"id"`
	Time  time.Time `json:"time"`
	Paths []string  `json:"paths"`
	Tags  []string  `json:"tags"`
}

// SnapshotsAnswer lists snapshots, newest first, or says why not.
type SnapshotsAnswer struct {
	Snapshots []Snapshot `json:"snapshots"`
	Error     string     `json:"error,omitempty"`
}

// GrantAsk asks the holder for From's repository access sealed to To.
type GrantAsk struct {
	From      string `json:"from"`
	To        string `json:"to"`
	Recipient string `json:"recipient"`
}

// BackupTag is the tag a snapshot of a data set carries
// (mesh:MODULE/DATA), by which the holder and hosts find its snapshots.
func BackupTag(module, data string) string { return "mesh:" + module + "/" + data }

// BackupInboxPrefix is the inbox prefix of the backup module on node: its
// requests' answers come there, beneath the node's own inbox, so no other
// node's user reads them.
func BackupInboxPrefix(node string) string { return HostInboxPrefix(node) + ".backup" }

// BackupInbox and RestoreInbox are where node's host is asked to back up
// and to restore (mesh.node.N.inbox.backup, .restore).
func BackupInbox(node string) string  { return NodeSubject(node, "inbox."+BackupAskName) }
func RestoreInbox(node string) string { return NodeSubject(node, "inbox."+RestoreAskName) }

// ShortSnapshot is a snapshot id as restic shows it short.
func ShortSnapshot(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}
