package app

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"mesh-controller/app/plan"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/health"
	"mesh-controller/contexts/inventory"
)

// Backups of data sets (issue 29; protocol's backup.go): the holder of the
// backup seat schedules and keeps the repositories, the data's own host
// backs up and restores, and the controller relays and records.

var (
	// ErrNotBackupHolder refuses what the backup seat's holder alone may say.
	ErrNotBackupHolder = errors.New("does not hold the backup seat")
	// ErrNotBackedUp means a data set is not one the mesh backs up.
	ErrNotBackedUp = errors.New("is not a data set the mesh backs up")
	// ErrBackupNotTaken means the data's host did not take an ask.
	ErrBackupNotTaken = errors.New("was not taken")
	// ErrNoSnapshot refuses a restore of a data set the repository holds no
	// snapshot of.
	ErrNoSnapshot = errors.New("has no snapshot")
	// ErrNoBackupHolder means no module holds the backup seat.
	ErrNoBackupHolder = errors.New("no module holds the backup seat")
)

// SetRef names a data set: node/module/data.
type SetRef struct{ Node, Module, Data string }

func (r SetRef) String() string { return r.Node + "/" + r.Module + "/" + r.Data }

// ParseSetRef reads node/module/data, each a valid name.
func ParseSetRef(s string) (SetRef, error) {
	parts := strings.Split(s, "/")
	if len(parts) != 3 {
		return SetRef{}, fmt.Errorf("%q is not NODE/MODULE/DATASET: name a data set as data lists it", s)
	}
	if err := CheckNames(parts...); err != nil {
		return SetRef{}, err
	}
	return SetRef{parts[0], parts[1], parts[2]}, nil
}

// backupSet finds ref among the data sets the mesh backs up.
func backupSet(snap *inventory.Snapshot, ref SetRef) (plan.BackupSet, error) {
	for _, s := range plan.BackupSets(snap) {
		if s.Node == ref.Node && s.Module == ref.Module && s.Data.Name == ref.Data {
			return s, nil
		}
	}
	return plan.BackupSet{}, fmt.Errorf("%s %w", ref, ErrNotBackedUp)
}

// holdsBackupSeat checks the node holds the backup seat.
func holdsBackupSeat(snap *inventory.Snapshot, node string) error {
	for _, h := range snap.Seats.Holders[snap.Seats.SeatName(backupSeat)] {
		if h.Node == node {
			return nil
		}
	}
	return fmt.Errorf("%s %w", node, ErrNotBackupHolder)
}

// newRunID names a backup or restore ask: its kind, when, and a random tail.
func newRunID(kind string) string {
	var b [4]byte
	rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", kind, time.Now().UnixMilli(), hex.EncodeToString(b[:]))
}

// BackupDue asks the data's host to back up a line the holder on holder
// says is due (the daemon's relay): the holder must hold the backup seat
// and the line must be one the mesh backs up.
func (c *Seats) BackupDue(ctx context.Context, nc *nats.Conn, holder string, due protocol.BackupDue) error {
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return err
	}
	if err := holdsBackupSeat(snap, holder); err != nil {
		return err
	}
	s, err := backupSet(snap, SetRef{due.Node, due.Module, due.Data})
	if err != nil {
		return err
	}
	_, err = c.askBackup(ctx, st, nc, s, "due")
	return err
}

// askBackup asks the data's host to back up one set now, and returns the
// ask's id. A host that does not answer, or refuses for a reason other
// than being busy with it, is a failed attempt, recorded as one.
func (c uses) askBackup(ctx context.Context, st *Stores, nc *nats.Conn, s plan.BackupSet, reason string) (string, error) {
	id := newRunID("bk")
	taken, err := c.askHost(ctx, st, nc, s.Node, protocol.BackupInbox(s.Node), protocol.BackupAsk{ID: id, Module: s.Module, Data: s.Data.Name, Reason: reason})
	var why string
	switch {
	case errors.Is(err, nats.ErrNoResponders), errors.Is(err, nats.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		why = "its host did not answer: it is away"
	case err != nil:
		why = err.Error()
	case !taken.Taken && (strings.Contains(taken.Why, "already") || strings.Contains(taken.Why, "busy")):
		return "", fmt.Errorf("a backup of %s/%s/%s %w: %s", s.Node, s.Module, s.Data.Name, ErrBackupNotTaken, taken.Why)
	case !taken.Taken:
		why = "its host did not take it: " + taken.Why
	default:
		return id, nil
	}
	err = st.Inventory.RecordBackupRun(ctx, inventory.BackupRun{Ask: id, Node: s.Node, Module: s.Module, Name: s.Data.Name, Kind: inventory.RunBackup,
		At: c.Now(), Why: why})
	return "", errors.Join(fmt.Errorf("a backup of %s/%s/%s %w: %s", s.Node, s.Module, s.Data.Name, ErrBackupNotTaken, why), err)
}

// askHost asks a node's host on its inbox subject and opens its signed
// answer with the key it joined with, as every host message is opened,
// though only that host and the controllers may publish where it comes
// (requestHost).
func (c uses) askHost(ctx context.Context, st *Stores, nc *nats.Conn, node, subject string, ask any) (protocol.BackupTaken, error) {
	var taken protocol.BackupTaken
	hosts, err := st.Identity.Hosts(ctx)
	if err != nil {
		return taken, err
	}
	var key ed25519.PublicKey
	for _, h := range hosts {
		if h.Node == node {
			key = h.HostKey
		}
	}
	if key == nil {
		return taken, fmt.Errorf("node %s %w", node, ErrNotJoined)
	}
	body, _ := json.Marshal(ask)
	m, err := requestHost(ctx, nc, node, subject, body)
	if err != nil {
		return taken, err
	}
	if err := protocol.Open(m.Data, key, &taken); err != nil {
		return taken, fmt.Errorf("the answer of %s's host: %w", node, err)
	}
	return taken, nil
}

// BackupAccess keeps a node's access the holder sealed to it.
func (c *Seats) BackupAccess(ctx context.Context, holder string, a protocol.BackupAccessIssued) error {
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return err
	}
	if err := holdsBackupSeat(snap, holder); err != nil {
		return err
	}
	if !strings.HasPrefix(a.Sealed, "-----BEGIN AGE ENCRYPTED FILE-----") || len(a.Sealed) > 16<<10 {
		return errors.New("an access that is not one sealed with age")
	}
	return st.Inventory.KeepBackupAccess(ctx, a.Node, inventory.BackupAccess{Holder: holder, Sealed: a.Sealed, IssuedAt: c.Now()})
}

// BackupDrilled records the holder's restore drill.
func (c *Seats) BackupDrilled(ctx context.Context, holder string, o protocol.DrillOutcome) error {
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return err
	}
	if err := holdsBackupSeat(snap, holder); err != nil {
		return err
	}
	if _, err := backupSet(snap, SetRef{o.Node, o.Module, o.Data}); err != nil {
		return err
	}
	return st.Inventory.RecordBackupRun(ctx, inventory.BackupRun{Ask: newRunID("dr"), Node: o.Node, Module: o.Module, Name: o.Data, Kind: inventory.RunDrill,
		At: c.Now(), OK: o.OK, Why: clipWhy(o.Why), Snapshot: o.Snapshot, Files: o.Files, Bytes: o.Bytes, DurationMS: o.DurationMS})
}

// BackedUp records a host's outcome of a backup or a restore of one of
// its own data sets; a restore's aside is kept as a retired data set.
func (c *Seats) BackedUp(ctx context.Context, node string, o protocol.BackupOutcome) error {
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return err
	}
	kind := map[string]string{protocol.KindBackup: inventory.RunBackup, protocol.KindRestore: inventory.RunRestore}[o.Kind]
	if kind == "" {
		return fmt.Errorf("an outcome of kind %q", o.Kind)
	}
	precious := ""
	if s, err := backupSet(snap, SetRef{node, o.Module, o.Data}); err == nil {
		precious = s.Data.Precious
	} else if kind == inventory.RunBackup {
		return err
	} else if precious = dataPrecious(snap, node, o.Module, o.Data); precious == "" {
		return fmt.Errorf("%s/%s/%s is not a data set of the node", node, o.Module, o.Data)
	}
	return st.Inventory.RecordBackupRun(ctx, inventory.BackupRun{Ask: o.ID, Node: node, Module: o.Module, Name: o.Data, Kind: kind, At: c.Now(),
		OK: o.OK, Why: clipWhy(o.Why), Snapshot: o.Snapshot, Files: o.Files, Bytes: o.Bytes, BytesAdded: o.BytesAdded, DurationMS: o.DurationMS,
		Aside: o.Aside, Precious: precious})
}

// dataPrecious is how precious a data set of a module on node is, "" if
// it has no such data set.
func dataPrecious(snap *inventory.Snapshot, node, module, data string) string {
	for _, d := range snap.Manifests[module][snap.VersionOn(node, module)].Data {
		if d.Name == data {
			return d.Precious
		}
	}
	return ""
}

// clipWhy keeps a host's or holder's why to one bounded line.
func clipWhy(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 512 {
		s = s[:512]
	}
	return s
}

// BackupRequest is data backup: the sets, why, and how long to wait.
type BackupRequest struct {
	Sets []string
	Why  string
	// Wait bounds how long each backup is waited for (0: 30 minutes).
	Wait time.Duration
}

// BackupDone is one backup data backup asked for, and what came of it.
type BackupDone struct {
	Set string              `json:"set"`
	Run inventory.BackupRun `json:"run"`
}

// DataBackup backs up each set now, one after the other, each waited for
// until its host reports it, and records the act as a hand act.
func (c *Seats) DataBackup(ctx context.Context, r BackupRequest) ([]BackupDone, error) {
	if strings.TrimSpace(r.Why) == "" {
		return nil, health.ErrNoWhy
	}
	refs := make([]SetRef, 0, len(r.Sets))
	for _, s := range r.Sets {
		ref, err := ParseSetRef(s)
		if err != nil {
			return nil, err
		}
		refs = append(refs, ref)
	}
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return nil, err
	}
	var sets []plan.BackupSet
	for _, ref := range refs {
		s, err := backupSet(snap, ref)
		if err != nil {
			return nil, err
		}
		sets = append(sets, s)
	}
	nc, err := c.dialBroker(ctx, st.Identity)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	if _, err := st.Health.RecordHandAct(ctx, health.HandAct{At: c.Now(), What: "data backup " + strings.Join(r.Sets, " "), Why: r.Why, Cause: "backup", Who: who()}); err != nil {
		return nil, err
	}
	var out []BackupDone
	for _, s := range sets {
		run, err := c.backupNow(ctx, st, nc, s, "by hand: "+r.Why, r.Wait)
		if err != nil {
			return out, err
		}
		out = append(out, BackupDone{Set: s.Key(), Run: run})
		if !run.OK {
			return out, fmt.Errorf("the backup of %s failed: %s", s.Key(), run.Why)
		}
	}
	return out, nil
}

// backupNow asks a backup of one set and waits for its outcome.
func (c uses) backupNow(ctx context.Context, st *Stores, nc *nats.Conn, s plan.BackupSet, reason string, wait time.Duration) (inventory.BackupRun, error) {
	id, err := c.askBackup(ctx, st, nc, s, reason)
	if err != nil {
		return inventory.BackupRun{}, err
	}
	return c.waitRun(ctx, st, id, wait)
}

// waitRun waits for the outcome of ask id to be recorded (by the serving
// controller, which hears the host), within wait (0: 30 minutes).
func (c uses) waitRun(ctx context.Context, st *Stores, id string, wait time.Duration) (inventory.BackupRun, error) {
	if wait <= 0 {
		wait = 30 * time.Minute
	}
	deadline := time.Now().Add(wait)
	for {
		r, err := st.Inventory.BackupRunOf(ctx, id)
		if err != nil {
			return inventory.BackupRun{}, err
		}
		if r != nil {
			return *r, nil
		}
		if time.Now().After(deadline) {
			return inventory.BackupRun{}, fmt.Errorf("%s: no outcome within %s: it may still be under way (data shows it when it ends)", id, wait)
		}
		select {
		case <-ctx.Done():
			return inventory.BackupRun{}, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// askHolder asks the backup module's tool on the seat's holder and reads
// its JSON answer into out.
func (c uses) askHolder(ctx context.Context, nc *nats.Conn, snap *inventory.Snapshot, tool string, in, out any, timeout time.Duration) error {
	hs := snap.Seats.Holders[snap.Seats.SeatName(backupSeat)]
	if len(hs) == 0 {
		return ErrNoBackupHolder
	}
	h := hs[0]
	body, _ := json.Marshal(in)
	m, err := nc.Request(protocol.ToolSubjectOn(h.Module, tool, h.Node), body, timeout)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return fmt.Errorf("%w %s on %s to answer %s", ErrNoInstance, h.Module, h.Node, tool)
	case errors.Is(err, nats.ErrTimeout):
		return fmt.Errorf("%s on %s %w %s within %s", h.Module, h.Node, ErrNoAnswer, tool, timeout)
	case err != nil:
		return err
	}
	return json.Unmarshal(m.Data, out)
}

// DataSnapshots lists what the repository holds of a data set, newest first.
func (c *Seats) DataSnapshots(ctx context.Context, set string) ([]protocol.Snapshot, error) {
	ref, err := ParseSetRef(set)
	if err != nil {
		return nil, err
	}
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := backupSet(snap, ref); err != nil {
		return nil, err
	}
	nc, err := c.dialBroker(ctx, st.Identity)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	return c.snapshotsOf(ctx, nc, snap, ref)
}

func (c uses) snapshotsOf(ctx context.Context, nc *nats.Conn, snap *inventory.Snapshot, ref SetRef) ([]protocol.Snapshot, error) {
	var a protocol.SnapshotsAnswer
	if err := c.askHolder(ctx, nc, snap, protocol.ToolSnapshots, protocol.SnapshotsAsk{Node: ref.Node, Module: ref.Module, Data: ref.Data}, &a, 30*time.Second); err != nil {
		return nil, err
	}
	if a.Error != "" {
		return nil, fmt.Errorf("the backup holder: %s", a.Error)
	}
	if a.Snapshots == nil {
		a.Snapshots = []protocol.Snapshot{}
	}
	return a.Snapshots, nil
}

// VerifyRequest is data verify.
type VerifyRequest struct {
	Set  string
	Wait time.Duration
}

// DataVerify drills a restore of the set's latest snapshot now, on the
// holder; the holder reports it (recorded as every drill is).
func (c *Seats) DataVerify(ctx context.Context, r VerifyRequest) (protocol.DrillOutcome, error) {
	ref, err := ParseSetRef(r.Set)
	if err != nil {
		return protocol.DrillOutcome{}, err
	}
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return protocol.DrillOutcome{}, err
	}
	if _, err := backupSet(snap, ref); err != nil {
		return protocol.DrillOutcome{}, err
	}
	nc, err := c.dialBroker(ctx, st.Identity)
	if err != nil {
		return protocol.DrillOutcome{}, err
	}
	defer nc.Close()
	if r.Wait <= 0 {
		r.Wait = 30 * time.Minute
	}
	var o protocol.DrillOutcome
	if err := c.askHolder(ctx, nc, snap, protocol.ToolVerify, protocol.SnapshotsAsk{Node: ref.Node, Module: ref.Module, Data: ref.Data}, &o, r.Wait); err != nil {
		return o, err
	}
	if !o.OK {
		return o, fmt.Errorf("the drill of %s failed: %s", ref, o.Why)
	}
	return o, nil
}

// RestoreRequest is data restore.
type RestoreRequest struct {
	Set      string
	Snapshot string // "" : the latest
	To       string // "" : the set's own node
	Why      string
	Wait     time.Duration
}

// DataRestored is what data restore did: the fresh snapshot taken first (if
// the set's host could take one) and the restore.
type DataRestored struct {
	Before  *inventory.BackupRun `json:"before,omitempty"`
	Restore inventory.BackupRun  `json:"restore"`
	// AsideName is the retired data set the contents were moved aside to.
	AsideName string `json:"aside_name,omitempty"`
}

// DataRestore restores a data set from a snapshot: on its own node, or
// --to another that runs the module. A fresh snapshot of what is there
// now is taken first; the module is stopped, its data set's contents moved
// aside (kept, retired, deleted only by cleanup delete), the snapshot
// restored, the module started again. Refused while the repository holds
// no snapshot of it.
func (c *Seats) DataRestore(ctx context.Context, r RestoreRequest) (DataRestored, error) {
	if strings.TrimSpace(r.Why) == "" {
		return DataRestored{}, health.ErrNoWhy
	}
	ref, err := ParseSetRef(r.Set)
	if err != nil {
		return DataRestored{}, err
	}
	to := ref.Node
	if r.To != "" {
		if err := CheckName(r.To); err != nil {
			return DataRestored{}, err
		}
		to = r.To
	}
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return DataRestored{}, err
	}
	if _, err := backupSet(snap, ref); err != nil {
		return DataRestored{}, err
	}
	target, err := backupSet(snap, SetRef{to, ref.Module, ref.Data})
	if err != nil {
		return DataRestored{}, fmt.Errorf("%s does not run %s with data set %s: %w", to, ref.Module, ref.Data, err)
	}
	nc, err := c.dialBroker(ctx, st.Identity)
	if err != nil {
		return DataRestored{}, err
	}
	defer nc.Close()
	snaps, err := c.snapshotsOf(ctx, nc, snap, ref)
	if err != nil {
		return DataRestored{}, err
	}
	if len(snaps) == 0 {
		return DataRestored{}, fmt.Errorf("%s %w in the repository: back it up first (mesh-controller data backup %s --why …)", ref, ErrNoSnapshot, ref)
	}
	chosen := snaps[0]
	if r.Snapshot != "" && r.Snapshot != "latest" {
		i := slices.IndexFunc(snaps, func(s protocol.Snapshot) bool { return s.ID == r.Snapshot || strings.HasPrefix(s.ID, r.Snapshot) })
		if i < 0 {
			return DataRestored{}, fmt.Errorf("%s %w %s: data snapshots %s lists those it has", ref, ErrNoSnapshot, r.Snapshot, ref)
		}
		chosen = snaps[i]
	}
	ask := protocol.RestoreAsk{ID: newRunID("rs"), Module: ref.Module, Data: ref.Data, Snapshot: chosen.ID, From: ref.Node}
	if len(chosen.Paths) > 0 {
		ask.SnapshotPath = chosen.Paths[0]
	}
	if to != ref.Node {
		recipients, err := hostRecipients(ctx, st.Identity)
		if err != nil {
			return DataRestored{}, err
		}
		rcpt, err := recipientOf(recipients, to)
		if err != nil {
			return DataRestored{}, err
		}
		var g protocol.BackupAccessIssued
		if err := c.askHolder(ctx, nc, snap, protocol.ToolGrant, protocol.GrantAsk{From: ref.Node, To: to, Recipient: rcpt}, &g, 30*time.Second); err != nil {
			return DataRestored{}, err
		}
		if g.Sealed == "" {
			return DataRestored{}, fmt.Errorf("the backup holder gave %s no access to %s's repository", to, ref.Node)
		}
		b := plan.New(snap, nil).Backup()
		ask.Repository, ask.Access = plan.Repository(b.Address, b.Port, ref.Node), g.Sealed
	}
	if _, err := st.Health.RecordHandAct(ctx, health.HandAct{At: c.Now(), What: fmt.Sprintf("data restore %s from snapshot %s onto %s", ref, protocol.ShortSnapshot(chosen.ID), to),
		Why: r.Why, Cause: "restore", Who: who()}); err != nil {
		return DataRestored{}, err
	}
	var out DataRestored
	// What is there now is kept twice: backed up first, then moved aside.
	if before, err := c.backupNow(ctx, st, nc, target, "before a restore: "+r.Why, r.Wait); err == nil {
		out.Before = &before
	}
	taken, err := c.askHost(ctx, st, nc, to, protocol.RestoreInbox(to), ask)
	if err != nil {
		return out, fmt.Errorf("the host of %s did not take the restore: %w", to, err)
	}
	if !taken.Taken {
		return out, fmt.Errorf("the restore %w by %s's host: %s", ErrBackupNotTaken, to, taken.Why)
	}
	run, err := c.waitRun(ctx, st, ask.ID, r.Wait)
	if err != nil {
		return out, err
	}
	out.Restore = run
	if run.Aside != "" {
		out.AsideName = inventory.AsideName(ref.Data, run.At)
	}
	if !run.OK {
		return out, fmt.Errorf("the restore of %s onto %s failed: %s", ref, to, run.Why)
	}
	return out, nil
}
