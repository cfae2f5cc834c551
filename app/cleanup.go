package app

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"mesh-controller/app/plan"
	"mesh-controller/contexts/health"
	"mesh-controller/contexts/inventory"
)

// Why cleanup delete refuses.
var (
	// ErrNeedsDigest means the data is irreplaceable or costly and no backup
	// of it was heard within its cadence: it is deleted only with --yes and
	// the digest of the preview the refusal shows.
	ErrNeedsDigest = errors.New("is deleted only with --yes and the digest of its preview")
	// ErrDigestChanged means the digest given is not the preview's as it is
	// now: its size, its last backup or what it is changed since it was shown.
	ErrDigestChanged = errors.New("the preview changed since that digest was shown")
	// ErrAmbiguous means one name matches data on a removed node and on the
	// node now bearing its name: the digest of one preview says which.
	ErrAmbiguous = errors.New("names data on a removed node and on the node now bearing its name")
	// ErrBeingDeleted means a deletion of it was asked already.
	ErrBeingDeleted = errors.New("is being deleted already: its host reports when it is gone")
)

// Cleanable is one retired consumer or retired (or dropped) data set a
// provider keeps, still on its node's disk until a person deletes it.
type Cleanable struct {
	Node   string `json:"node"`
	Module string `json:"module"`
	Target string `json:"target"`
	Kind   string `json:"kind"` // data or consumer
	Path   string `json:"path,omitempty"`
	// Precious is the data set's level, or for a consumer its provider's
	// per_consumer.data level ("" when it keeps no data for consumers).
	Precious string `json:"precious"`
	// State is retired (precious data, or a retired consumer) or dropped
	// (rebuildable data whose module left).
	State   string    `json:"state"`
	Since   time.Time `json:"since"`
	AgeDays int       `json:"age_days"`
	Bytes   *int64    `json:"bytes"`
	// LastBackup is the latest backup heard of it: from its host's data
	// report or from the backup seat's holder; nil if none ever was.
	LastBackup *time.Time `json:"last_backup"`
	// Cadence is how often it should be backed up (hourly, daily, weekly);
	// "" when it needs no backup.
	Cadence string `json:"cadence"`
	// VerifiedAt is the last restore drill of it that passed (the backup
	// seat's holder restored its snapshot and verified every file).
	VerifiedAt *time.Time `json:"verified_at"`
	// NeedsDigest says it is deleted only with --yes Digest: irreplaceable
	// or costly, and no verified backup within its cadence (a backup heard
	// within its cadence, and a drill passed within its drill bound).
	NeedsDigest bool `json:"needs_digest"`
	// Digest is the digest of its preview (see previewDigest).
	Digest string `json:"digest"`
	// NodeRemovedAt says its node was removed (and when): no host is left to
	// delete it, so cleanup delete records it deleted by hand.
	NodeRemovedAt *time.Time `json:"node_removed_at"`
	Why           string     `json:"why"`
	// Deleting says a deletion was asked and the host has not reported it done.
	Deleting bool `json:"deleting"`

	// retirement is its row, for data on a removed node (recorded by hand).
	retirement int64
}

// OnRemovedNode says its node was removed from the mesh.
func (cl Cleanable) OnRemovedNode() bool { return cl.NodeRemovedAt != nil }

// preview is exactly what a cleanup preview shows of one target, in a fixed
// order: the digest a person confirms is over these bytes and nothing else.
type preview struct {
	Node          string  `json:"node"`
	Module        string  `json:"module"`
	Target        string  `json:"target"`
	Kind          string  `json:"kind"`
	Path          string  `json:"path"`
	Precious      string  `json:"precious"`
	Bytes         *int64  `json:"bytes"`
	LastBackup    *string `json:"last_backup"`
	NodeRemovedAt *string `json:"node_removed_at"`
}

// digestLen is how many hex characters of the sha256 a digest shows:
// enough that a changed preview never matches by chance, short enough to type.
const digestLen = 12

// previewDigest is the first digestLen hex characters of the sha256 of the
// preview's canonical JSON (preview's fields in order, times in RFC 3339
// UTC): a changed size, a backup heard since, or another record of the same
// name each give another digest.
func previewDigest(cl Cleanable) string {
	stamp := func(t *time.Time) *string {
		if t == nil {
			return nil
		}
		s := t.UTC().Format(time.RFC3339Nano)
		return &s
	}
	b, err := json.Marshal(preview{Node: cl.Node, Module: cl.Module, Target: cl.Target, Kind: cl.Kind, Path: cl.Path, Precious: cl.Precious,
		Bytes: cl.Bytes, LastBackup: stamp(cl.LastBackup), NodeRemovedAt: stamp(cl.NodeRemovedAt)})
	if err != nil {
		panic(err) // strings, numbers and nils always marshal
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:digestLen]
}

func cleanables(snap *inventory.Snapshot, retirements []inventory.Retirement, data map[string][]inventory.DataSet, now time.Time) []Cleanable {
	asked := map[string]bool{}
	for _, d := range snap.Seats.Deletions {
		asked[d.Node+"/"+d.Module+"/"+d.Kind+"/"+d.Target] = true
	}
	out := []Cleanable{}
	for _, r := range retirements {
		if r.State != "retired" && r.State != "dropped" {
			continue
		}
		cl := Cleanable{Node: r.Node, Module: r.Module, Target: r.DataSet, Kind: "data", Path: r.Path, Precious: r.Precious, State: r.State,
			Since: r.RetiredAt, Why: r.Why, NodeRemovedAt: r.NodeRemovedAt, retirement: r.ID}
		var spec inventory.DataSpec
		if r.Consumer != "" {
			// What a provider on a removed node kept for one consumer.
			cl.Kind, cl.Target = "consumer", r.Consumer
			spec = inventory.DataSpec{Precious: r.Precious}
		} else {
			spec = dataSpecOf(snap, r.Module, r.DataSet, r.Precious)
		}
		if r.NodeRemovedAt != nil {
			// Its node's reports went with it: what was last heard was kept.
			cl.Bytes, cl.LastBackup = r.Bytes, r.LastBackup
		} else {
			cl.Deleting = asked[r.Node+"/"+r.Module+"/data/"+r.DataSet]
			if d := reportedSet(data[r.Node], r.Module, r.DataSet); d != nil {
				cl.Bytes = &d.Bytes
			}
			cl.LastBackup = lastBackupHeard(snap, data, r.Node, r.Module, r.DataSet)
			cl.VerifiedAt = snap.Seats.BackupStates[r.Node+"/"+r.Module+"/"+r.DataSet].VerifiedAt
		}
		out = append(out, finish(cl, spec, now))
	}
	for _, cs := range snap.Seats.Consumers {
		if cs.State != "retired" {
			continue
		}
		precious := perConsumerPrecious(snap, cs.Provider, cs.Provision)
		cl := Cleanable{Node: cs.Provider.Node, Module: cs.Provider.Module, Target: cs.Consumer, Kind: "consumer", Precious: precious, State: "retired",
			Since: cs.Since, Why: cs.Why, Deleting: asked[cs.Provider.Node+"/"+cs.Provider.Module+"/consumer/"+cs.Consumer],
			// The mesh keeps no backup line per consumer: a backup of one
			// is heard only if a holder reports it under the consumer's name.
			LastBackup: lastBackupHeard(snap, data, cs.Provider.Node, cs.Provider.Module, cs.Consumer)}
		out = append(out, finish(cl, inventory.DataSpec{Precious: precious}, now))
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Node+"/"+a.Module+"/"+a.Target != b.Node+"/"+b.Module+"/"+b.Target {
			return a.Node+"/"+a.Module+"/"+a.Target < b.Node+"/"+b.Module+"/"+b.Target
		}
		return a.OnRemovedNode() && !b.OnRemovedNode() // a removed node's record first: it is the older
	})
	return out
}

// finish judges a cleanable against its backup cadence and digests its preview.
func finish(cl Cleanable, spec inventory.DataSpec, now time.Time) Cleanable {
	cl.AgeDays = int(now.Sub(cl.Since).Hours() / 24)
	if spec.Precious == inventory.Irreplaceable || spec.Precious == inventory.Costly {
		cl.Cadence = plan.CadenceWord(spec)
		cl.NeedsDigest = cl.LastBackup == nil || now.Sub(*cl.LastBackup) > plan.BackupCadence(spec) ||
			cl.VerifiedAt == nil || now.Sub(*cl.VerifiedAt) > plan.DrillBound(spec)
	}
	cl.Digest = previewDigest(cl)
	return cl
}

// dataSpecOf is a retired data set as its module's manifest describes it:
// the current version's, else the newest registered version naming it (a
// forgotten module leaves only the preciousness the retirement recorded).
func dataSpecOf(snap *inventory.Snapshot, module, name, precious string) inventory.DataSpec {
	versions := snap.Manifests[module]
	order := []string{snap.Current[module]}
	others := make([]string, 0, len(versions))
	for v := range versions {
		others = append(others, v)
	}
	sort.Sort(sort.Reverse(sort.StringSlice(others)))
	for _, v := range append(order, others...) {
		for _, d := range versions[v].Data {
			if d.Name == name {
				d.Precious = precious // what was retired is judged as it was retired
				return d
			}
		}
	}
	return inventory.DataSpec{Name: name, Precious: precious}
}

// perConsumerPrecious is how precious the data a provider keeps for each
// consumer of a provision is, "" if it keeps none: from the manifest it is
// assigned at, else (it left) its module's current manifest.
func perConsumerPrecious(snap *inventory.Snapshot, provider inventory.Holder, provision string) string {
	m := snap.ManifestOn(provider)
	if m.Module == "" {
		m = snap.Manifests[provider.Module][snap.Current[provider.Module]]
	}
	for _, p := range m.Provides {
		if p.Provision == provision && p.PerConsumer != nil && p.PerConsumer.Data != nil {
			return p.PerConsumer.Data.Precious
		}
	}
	return ""
}

// lastBackupHeard is the latest backup heard of a data set: from its host's
// data report or from the backup seat's holder. It is a copy, so no caller
// can change the report it came from.
func lastBackupHeard(snap *inventory.Snapshot, data map[string][]inventory.DataSet, node, module, name string) *time.Time {
	var last *time.Time
	if r := reportedSet(data[node], module, name); r != nil && r.LastBackup != nil {
		t := *r.LastBackup
		last = &t
	}
	if t, ok := snap.Seats.Backups[node+"/"+module+"/"+name]; ok && (last == nil || t.After(*last)) {
		last = &t
	}
	return last
}

// dataState is what data and cleanup judge data sets from: the inventory,
// every retirement, and every node's data report.
type dataState struct {
	snap        *inventory.Snapshot
	retirements []inventory.Retirement
	data        map[string][]inventory.DataSet
}

func readDataState(ctx context.Context, inv *inventory.Store) (dataState, error) {
	var ds dataState
	var err error
	if ds.snap, err = inv.Snapshot(ctx); err != nil {
		return dataState{}, err
	}
	if ds.retirements, err = inv.Retirements(ctx, ""); err != nil {
		return dataState{}, err
	}
	if ds.data, err = inv.AllDataSets(ctx); err != nil {
		return dataState{}, err
	}
	return ds, nil
}

func (c uses) readCleanup(ctx context.Context, inv *inventory.Store) ([]Cleanable, error) {
	ds, err := readDataState(ctx, inv)
	if err != nil {
		return nil, err
	}
	return cleanables(ds.snap, ds.retirements, ds.data, c.Now()), nil
}

// Cleanup lists every retired consumer and retired or dropped data set per
// provider, on nodes in the mesh and on removed ones.
func (c *Seats) Cleanup(ctx context.Context) ([]Cleanable, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return nil, err
	}
	return c.readCleanup(ctx, st.Inventory)
}

// CleanupRequest is a cleanup delete: one target, or every one older than some days.
type CleanupRequest struct {
	Node, Module, Target string
	OlderThanDays        int
	Why                  string
	// Confirm carries out an --older-than deletion; without it, it only lists.
	Confirm bool
	// Yes is the digest of the one target's preview, as a person confirms
	// it: needed for irreplaceable or costly data with no backup within its
	// cadence, refused if the preview changed since.
	Yes string
}

// CleanupResult is what a cleanup delete did, or would do.
type CleanupResult struct {
	// Deleted are asked of their hosts, or, on a removed node, recorded
	// deleted by hand.
	Deleted []Cleanable `json:"deleted"`
	// Preview is what would be deleted: --older-than without --confirm, or
	// the one target a digest is needed for (or changed).
	Preview []Cleanable `json:"preview"`
	// Refused need --yes with their own digest, one by one: --older-than
	// --confirm never deletes them.
	Refused []Cleanable `json:"refused"`
	Pushed  []Pushed    `json:"pushed"`
	// Fresh are the snapshots taken of the data sets just before they were
	// deleted (the mesh backs them up), or why none could be.
	Fresh []FreshSnapshot `json:"fresh"`
}

// FreshSnapshot is a snapshot taken before a risky act, or why none was.
type FreshSnapshot struct {
	Set      string `json:"set"`
	Snapshot string `json:"snapshot,omitempty"`
	Why      string `json:"why,omitempty"`
}

// freshSnapshots backs up, just before a risky act, each of the data sets
// it touches that the mesh backs up, one after the other, and says of each
// its snapshot or why there is none; it never stops the act.
func (c uses) freshSnapshots(ctx context.Context, st *Stores, sets []SetRef, reason string) []FreshSnapshot {
	if len(sets) == 0 {
		return nil
	}
	snap, err := st.Inventory.Snapshot(ctx)
	if err != nil {
		return nil
	}
	var todo []plan.BackupSet
	for _, ref := range sets {
		if s, err := backupSet(snap, ref); err == nil {
			todo = append(todo, s)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	var out []FreshSnapshot
	nc, err := c.dialBroker(ctx, st.Identity)
	if err != nil {
		for _, s := range todo {
			out = append(out, FreshSnapshot{Set: s.Key(), Why: err.Error()})
		}
		return out
	}
	defer nc.Close()
	for _, s := range todo {
		f := FreshSnapshot{Set: s.Key()}
		run, err := c.backupNow(ctx, st, nc, s, reason, 0)
		switch {
		case err != nil:
			f.Why = err.Error()
		case !run.OK:
			f.Why = run.Why
		default:
			f.Snapshot = run.Snapshot
		}
		out = append(out, f)
	}
	return out
}

// DigestError refuses a cleanup delete until a person confirms, with the
// digest of the preview returned beside it, what would be lost.
type DigestError struct {
	Target Cleanable
	// Err is ErrNeedsDigest, ErrDigestChanged or ErrAmbiguous.
	Err error
}

func (e *DigestError) Error() string {
	cl := e.Target
	what := fmt.Sprintf("%s/%s %s", cl.Node, cl.Module, cl.Target)
	switch {
	case errors.Is(e.Err, ErrAmbiguous):
		return fmt.Sprintf("nothing deleted: %s %v", what, e.Err)
	case errors.Is(e.Err, ErrDigestChanged):
		return fmt.Sprintf("nothing deleted: %s: %v; its digest is now %s", what, e.Err, cl.Digest)
	}
	return fmt.Sprintf("nothing deleted: %s is %s and %s, so it %v (%s)", what, cl.Precious, backupState(cl), e.Err, cl.Digest)
}

func (e *DigestError) Unwrap() error { return e.Err }

// backupState says how a precious target stands against its cadence.
func backupState(cl Cleanable) string {
	switch {
	case cl.LastBackup == nil:
		return "no backup of it was ever heard"
	case time.Since(*cl.LastBackup) > plan.BackupCadence(inventory.DataSpec{Backup: inventory.DataBackup{Every: cl.Cadence}}):
		return fmt.Sprintf("its last backup (%s) is older than its cadence (%s)", cl.LastBackup.UTC().Format(time.RFC3339), cl.Cadence)
	case cl.VerifiedAt == nil:
		return fmt.Sprintf("its last backup (%s) was never verified by a restore drill (data verify drills one)", cl.LastBackup.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("its last restore drill that passed (%s) is older than its bound (data verify drills one)", cl.VerifiedAt.UTC().Format(time.RFC3339))
}

// RefusedError says which targets an --older-than --confirm left alone
// because each needs its own digest; the rest were deleted.
type RefusedError struct {
	Deleted int
	Refused []Cleanable
}

func (e *RefusedError) Error() string { return e.Summary() + ": " + strings.Join(e.Details(), "; ") }

// Summary is the refusal in one line.
func (e *RefusedError) Summary() string {
	return fmt.Sprintf("%d deleted, %d refused: irreplaceable or costly data with no backup within its cadence %v, one by one", e.Deleted, len(e.Refused), ErrNeedsDigest)
}

// Details are the refused targets, one a line, each with the command that deletes it.
func (e *RefusedError) Details() []string {
	var out []string
	for _, cl := range e.Refused {
		out = append(out, fmt.Sprintf("%s: 'mesh-controller cleanup delete %s %s %s --why ... --yes %s'", PreviewLine(cl), cl.Node, cl.Module, cl.Target, cl.Digest))
	}
	return out
}

// PreviewLine is a cleanable's preview on one line: everything its digest is over.
func PreviewLine(cl Cleanable) string {
	where := ""
	if cl.Path != "" {
		where = " " + cl.Path
	}
	line := fmt.Sprintf("%s/%s %s (%s%s, %s, %s, %s)", cl.Node, cl.Module, cl.Target, cl.Kind, where, dashed(cl.Precious), sizeOf(cl), backupState(cl))
	if cl.OnRemovedNode() {
		line += fmt.Sprintf(" on %s, removed %s", cl.Node, cl.NodeRemovedAt.UTC().Format(time.RFC3339))
	}
	return line
}

// sizeOf is a cleanable's size as its preview and its hand act say it.
func sizeOf(cl Cleanable) string {
	if cl.Bytes == nil {
		return "size not reported"
	}
	return fmt.Sprintf("%d bytes", *cl.Bytes)
}

func dashed(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (e *RefusedError) Unwrap() error { return ErrNeedsDigest }

// CleanupDelete has providers delete retired data: one target, or (with
// OlderThanDays) every one older, only with Confirm. Irreplaceable or
// costly data with no backup heard within its cadence is deleted only as
// one target confirmed with Yes, the digest of its preview: without it, or
// with a digest the preview no longer has, a DigestError returns the
// preview; --older-than --confirm deletes the others and refuses those
// (RefusedError). Data on a removed node has no host to delete it: it is
// recorded deleted by hand. Every deletion is asked in one inventory
// transaction and every hand act kept in one health transaction.
func (c *Seats) CleanupDelete(ctx context.Context, r CleanupRequest) (CleanupResult, error) {
	return retryAct(ctx, func() (CleanupResult, error) { return c.cleanupDelete(ctx, r) })
}

func (c uses) cleanupDelete(ctx context.Context, r CleanupRequest) (CleanupResult, error) {
	if r.Why == "" {
		return CleanupResult{}, health.ErrNoWhy
	}
	st, err := c.stores(ctx)
	if err != nil {
		return CleanupResult{}, err
	}
	ds, err := readDataState(ctx, st.Inventory)
	if err != nil {
		return CleanupResult{}, err
	}
	all := cleanables(ds.snap, ds.retirements, ds.data, c.Now())
	var out CleanupResult
	var chosen []Cleanable
	if r.OlderThanDays > 0 {
		for _, cl := range all {
			if !cl.Deleting && cl.AgeDays >= r.OlderThanDays {
				chosen = append(chosen, cl)
			}
		}
		if !r.Confirm {
			out.Preview = chosen
			return out, nil
		}
		var fine []Cleanable
		for _, cl := range chosen {
			if cl.NeedsDigest {
				out.Refused = append(out.Refused, cl)
			} else {
				fine = append(fine, cl)
			}
		}
		chosen = fine
	} else {
		cl, named, err := pickTarget(all, r)
		if err != nil {
			var de *DigestError
			if errors.As(err, &de) {
				out.Preview = named
			}
			return out, err
		}
		chosen = []Cleanable{cl}
	}
	what := fmt.Sprintf("cleanup delete %s %s %s", r.Node, r.Module, r.Target)
	if r.OlderThanDays > 0 {
		what = fmt.Sprintf("cleanup delete --older-than %d", r.OlderThanDays)
	}
	if err := refuse(what, heldElsewhere(ds.snap, chosen)); err != nil {
		return out, err
	}
	var touched []SetRef
	for _, cl := range chosen {
		if cl.Kind == "data" && !cl.OnRemovedNode() {
			touched = append(touched, SetRef{cl.Node, cl.Module, cl.Target})
		}
	}
	out.Fresh = c.freshSnapshots(ctx, st, touched, "before cleanup delete: "+r.Why)
	if out.Deleted, out.Pushed, err = c.deleteCleanables(ctx, st, chosen, r, ds.snap.Revision); err != nil {
		return out, err
	}
	if len(out.Refused) > 0 {
		return out, &RefusedError{Deleted: len(out.Deleted), Refused: out.Refused}
	}
	return out, nil
}

// pickTarget finds the one target a cleanup delete names and judges the
// digest given for it. It also returns every cleanable the request names
// that is not being deleted: what a refusal previews, as it is now.
func pickTarget(all []Cleanable, r CleanupRequest) (Cleanable, []Cleanable, error) {
	var named []Cleanable
	deleting := false
	for _, cl := range all {
		if cl.Node == r.Node && cl.Module == r.Module && cl.Target == r.Target {
			if cl.Deleting {
				deleting = true
				continue
			}
			named = append(named, cl)
		}
	}
	switch {
	case len(named) == 0 && deleting:
		return Cleanable{}, named, fmt.Errorf("%s/%s %s %w", r.Node, r.Module, r.Target, ErrBeingDeleted)
	case len(named) == 0:
		return Cleanable{}, named, fmt.Errorf("%s/%s %s %w", r.Node, r.Module, r.Target, ErrNotRetired)
	case len(named) > 1 && r.Yes == "":
		return Cleanable{}, named, &DigestError{Target: named[0], Err: ErrAmbiguous}
	}
	cl := named[0]
	if r.Yes != "" {
		found := false
		for _, n := range named {
			if n.Digest == strings.ToLower(r.Yes) {
				cl, found = n, true
			}
		}
		if !found {
			return Cleanable{}, named, &DigestError{Target: cl, Err: ErrDigestChanged}
		}
		return cl, named, nil
	}
	if cl.NeedsDigest {
		return Cleanable{}, named, &DigestError{Target: cl, Err: ErrNeedsDigest}
	}
	return cl, named, nil
}

// deleteCleanables asks hosts to delete what was chosen (and records what
// lies on removed nodes deleted by hand), keeping one hand act for each,
// saying what was known of its backup.
func (c uses) deleteCleanables(ctx context.Context, st *Stores, chosen []Cleanable, r CleanupRequest, based int64) ([]Cleanable, []Pushed, error) {
	if len(chosen) == 0 {
		return nil, nil, nil
	}
	now := c.Now()
	var asks []inventory.Deletion
	var byHand []int64
	acts := make([]health.HandAct, 0, len(chosen))
	nodes := map[string]bool{}
	for _, cl := range chosen {
		if cl.OnRemovedNode() {
			byHand = append(byHand, cl.retirement)
		} else {
			asks = append(asks, inventory.Deletion{Node: cl.Node, Module: cl.Module, Target: cl.Target, Kind: cl.Kind, Path: cl.Path, Why: r.Why})
			nodes[cl.Node] = true
		}
		acts = append(acts, health.HandAct{At: now, What: cleanupWhat(cl), Why: r.Why, Cause: "cleanup", Who: who()})
	}
	if err := st.Inventory.AskDeletions(ctx, asks, byHand, based, now); err != nil {
		return nil, nil, err
	}
	if _, err := st.Health.RecordHandActs(ctx, acts); err != nil {
		return chosen, nil, err
	}
	pushed, err := c.sendPlans(ctx, st, slices.Sorted(maps.Keys(nodes)))
	return chosen, pushed, err
}

// cleanupWhat is a cleanup's hand act: what went, where, and which of the
// two ways it was allowed: backed up within its cadence, or confirmed by the
// digest of its preview without one.
func cleanupWhat(cl Cleanable) string {
	precious := cl.Precious
	if precious == "" {
		precious = "no data kept"
	}
	what := fmt.Sprintf("cleanup delete %s/%s %s (%s, %s, %s)", cl.Node, cl.Module, cl.Target, cl.Kind, precious, sizeOf(cl))
	if cl.OnRemovedNode() {
		what += fmt.Sprintf(" on %s, removed %s: recorded deleted by hand, no host can act", cl.Node, cl.NodeRemovedAt.UTC().Format(time.RFC3339))
	}
	switch {
	case cl.NeedsDigest && cl.LastBackup == nil:
		return what + ": without backup, confirmed by digest " + cl.Digest
	case cl.NeedsDigest:
		return fmt.Sprintf("%s: without a backup within its cadence (last backed up at %s), confirmed by digest %s", what, cl.LastBackup.UTC().Format(time.RFC3339), cl.Digest)
	case cl.Cadence != "":
		return fmt.Sprintf("%s: backed up at %s", what, cl.LastBackup.UTC().Format(time.RFC3339))
	}
	return what + ": needs no backup"
}

// heldElsewhere says, of the data chosen for deletion, each whose path a
// module assigned on its node keeps (or lies inside or around): a deletion
// never removes a place another live data set holds.
func heldElsewhere(snap *inventory.Snapshot, chosen []Cleanable) []string {
	var problems []string
	for _, cl := range chosen {
		if cl.Kind != "data" || cl.OnRemovedNode() || cl.Path == "" {
			continue
		}
		for _, a := range snap.AssignmentsOf(cl.Node) {
			for _, d := range snap.Manifests[a.Module][a.Version].Data {
				if inventory.PathsOverlap(d.Path, cl.Path) {
					problems = append(problems, fmt.Sprintf("%s/%s %s (%s) is where %s/%s keeps its data %s (%s): nothing deleted; deleting it would delete what %s serves from",
						cl.Node, cl.Module, cl.Target, cl.Path, cl.Node, a.Module, d.Name, d.Path, a.Module))
				}
			}
		}
	}
	return problems
}
