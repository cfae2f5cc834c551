package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"mesh-controller/app/daemon"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/health"
	"mesh-controller/contexts/inventory"
)

// ErrRollOutRolledBack means a roll-out failed past its --max-failures and
// every node it moved was sent back to the version it ran: it stopped
// (ErrRollOutStopped), and went back.
var ErrRollOutRolledBack = fmt.Errorf("%w and was rolled back", ErrRollOutStopped)

// ErrBadRollOut means a roll-out's options cannot be followed.
var ErrBadRollOut = errors.New("bad roll-out options")

// rollOutEvery is how often serve looks for a roll-out to drive (one
// indexed read): a roll-out written by a command starts within it.
const rollOutEvery = 100 * time.Millisecond

// followEvery is how often a command reads the roll-out it follows.
const followEvery = 50 * time.Millisecond

// BatchSize reads --batch: N nodes (N ≥ 1) or P% (0 < P ≤ 100) of total,
// rounded up; "" is 1.
func BatchSize(batch string, total int) (int, error) {
	if batch == "" {
		return 1, nil
	}
	if p, ok := strings.CutSuffix(batch, "%"); ok {
		n, err := strconv.Atoi(p)
		if err != nil || n <= 0 || n > 100 {
			return 0, fmt.Errorf("%w: --batch %s: a percentage is from 1%% to 100%%", ErrBadRollOut, batch)
		}
		return max(1, (total*n+99)/100), nil
	}
	n, err := strconv.Atoi(batch)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%w: --batch %s: say a number of nodes (1 or more) or a percentage (1%% to 100%%)", ErrBadRollOut, batch)
	}
	return n, nil
}

// CheckRollOut judges a roll-out's options before anything is read.
func CheckRollOut(r UpgradeRequest) error {
	switch {
	case r.Canary < 0:
		return fmt.Errorf("%w: --canary %d: say how many nodes go first, 0 or more", ErrBadRollOut, r.Canary)
	case r.MaxFailures < 0:
		return fmt.Errorf("%w: --max-failures %d: say how many nodes may fail, 0 or more", ErrBadRollOut, r.MaxFailures)
	case r.Soak < 0:
		return fmt.Errorf("%w: --soak %s: a soak is 0 or longer", ErrBadRollOut, r.Soak)
	case r.WithoutSnapshot && strings.TrimSpace(r.Why) == "":
		return fmt.Errorf("%w: --without-snapshot needs --why: say why its nodes may upgrade with no snapshot of the data they cannot lose", ErrBadRollOut)
	}
	_, err := BatchSize(r.Batch, 1)
	return err
}

// rolled names what a roll-out moves: for the store (key) and for a
// person (label, and the commands that show, start and roll back one).
type rolled struct {
	key, label            string
	show, start, rollback string
}

// moduleRolled is a module's roll-outs.
func moduleRolled(module string) rolled {
	cmd := "mesh-controller upgrade " + module
	return rolled{key: module, label: module, show: cmd + " show", start: cmd + " roll-out", rollback: cmd + " rollback"}
}

// hostRolled is the hosts' roll-outs.
var hostRolled = rolled{key: inventory.HostRollOut, label: "mesh-host", show: "mesh-controller host upgrade",
	start: "mesh-controller host upgrade --to VERSION", rollback: "mesh-controller host upgrade rollback"}

// rolledOf names what ro moves.
func rolledOf(ro inventory.RollOut) rolled {
	if ro.Kind == inventory.RollOutOfHost {
		return hostRolled
	}
	return moduleRolled(ro.Module)
}

// rolledKey names what the roll-out kept under key moves.
func rolledKey(key string) rolled {
	if key == inventory.HostRollOut {
		return hostRolled
	}
	return moduleRolled(key)
}

// kindOf is how ro's nodes are moved and judged.
func (c uses) kindOf(ro inventory.RollOut) rollKind {
	if ro.Kind == inventory.RollOutOfHost {
		return &hostRoll{c: c}
	}
	return moduleRoll{c: c}
}

// startRollOut records a roll-out of v's nodes, in batches, for the
// serving controller to drive, and follows it until it ends.
func (c uses) startRollOut(ctx context.Context, st *Stores, snap *inventory.Snapshot, v UpgradeView, r UpgradeRequest) (UpgradeView, error) {
	return c.recordRollOut(ctx, st, moduleRolled(v.Module), inventory.RollOutOfModule, v, r)
}

// recordRollOut records a roll-out of v's steps (their nodes to v.Current)
// of kind, in batches, as a hand act, for the serving controller to drive,
// and follows it until it ends.
func (c uses) recordRollOut(ctx context.Context, st *Stores, what rolled, kind string, v UpgradeView, r UpgradeRequest) (UpgradeView, error) {
	if r.Together {
		r.Canary, r.Batch = 0, "100%"
	}
	if err := CheckRollOut(r); err != nil {
		return v, err
	}
	// Serve drives it: none serving, nothing is written.
	if _, err := c.brokerURL(ctx, st.Identity); err != nil {
		return v, err
	}
	size, _ := BatchSize(r.Batch, len(v.Steps))
	id := make([]byte, 8)
	rand.Read(id)
	ro := inventory.RollOut{ID: hex.EncodeToString(id), Kind: kind, Module: what.key, To: v.Current, Canary: r.Canary, Batch: r.Batch,
		Wait: r.Wait, Soak: r.Soak, MaxFailures: r.MaxFailures, WithoutSnapshot: r.WithoutSnapshot, Phase: inventory.RollOutRunning, Who: who()}
	if ro.Batch == "" {
		ro.Batch = "1"
	}
	for i, s := range v.Steps {
		// Batch 0 is the canary; then batches of size.
		b := 0
		if i >= r.Canary {
			b = 1 + (i-r.Canary)/size
		}
		ro.Nodes = append(ro.Nodes, inventory.RollOutNode{Node: s.Node, From: s.From, Batch: b, Result: "waiting"})
	}
	if err := st.Inventory.StartRollOut(ctx, ro, c.Now()); err != nil {
		if errors.Is(err, inventory.ErrRollOutUnderWay) {
			return v, fmt.Errorf("a roll-out of %s is under way: follow it with '%s', and start another once it ended", what.label, what.show)
		}
		return v, err
	}
	act := fmt.Sprintf("roll-out %s %s to %s (canary %d, batch %s, wait %s, soak %s, max failures %d)", what.label, v.Current,
		Plural(len(ro.Nodes), "node"), ro.Canary, ro.Batch, ro.Wait, ro.Soak, ro.MaxFailures)
	asked := strings.TrimPrefix(what.start, "mesh-controller ")
	if kind == inventory.RollOutOfHost {
		asked = "host upgrade --to " + v.Current
	}
	why := "asked by '" + asked + "'"
	if ro.WithoutSnapshot {
		// The person's why is kept with the act that allowed it.
		act += ", allowed without a snapshot of irreplaceable data"
		why = r.Why
	}
	if _, err := st.Health.RecordHandAct(ctx, health.HandAct{At: c.Now(), What: act, Why: why, Cause: "roll-out", Who: ro.Who}); err != nil {
		return v, err
	}
	if ro.WithoutSnapshot {
		r.Progress(fmt.Sprintf("its nodes may upgrade %s where its irreplaceable data cannot be snapshotted first (--without-snapshot: %s)", v.Module, r.Why))
	}
	if ro.Canary > 0 {
		r.Progress(fmt.Sprintf("roll-out of %s %s recorded: %s first, then batches of %d; the serving controller drives it", what.label, v.Current, Plural(min(ro.Canary, len(ro.Nodes)), "canary node"), size))
	} else {
		r.Progress(fmt.Sprintf("roll-out of %s %s recorded: batches of %d; the serving controller drives it", what.label, v.Current, size))
	}
	return c.followRollOut(ctx, st, what, v, ro, r.Progress, r.Tally)
}

// rollBackByHand marks the module's ended roll-out rolling back, for the
// serving controller to return the nodes it moved, and follows it.
func (c uses) rollBackByHand(ctx context.Context, st *Stores, snap *inventory.Snapshot, v UpgradeView, r UpgradeRequest) (UpgradeView, error) {
	return c.rollBackRolled(ctx, st, snap, moduleRolled(v.Module), v, r)
}

// rollBackRolled marks the last roll-out of what ended rolling back, for
// the serving controller to return the nodes it moved, and follows it.
func (c uses) rollBackRolled(ctx context.Context, st *Stores, snap *inventory.Snapshot, what rolled, v UpgradeView, r UpgradeRequest) (UpgradeView, error) {
	if strings.TrimSpace(r.Why) == "" {
		return v, fmt.Errorf("%w: say why with --why", ErrBadRollOut)
	}
	ro, ok, err := st.Inventory.RollOut(ctx, what.key)
	if err != nil {
		return v, err
	}
	if !ok {
		return v, fmt.Errorf("%s has no roll-out to roll back: '%s' starts one", what.label, what.start)
	}
	switch {
	case !ro.Ended():
		return v, fmt.Errorf("a roll-out of %s is under way: follow it with '%s', and roll it back once it ended", what.label, what.show)
	case ro.Phase == inventory.RollOutRolledBack:
		return v, fmt.Errorf("the last roll-out of %s (to %s) was rolled back already: nothing to roll back", what.label, ro.To)
	case len(c.kindOf(ro).returning(snap, ro)) == 0:
		return v, fmt.Errorf("no node the last roll-out of %s moved runs %s now: nothing to roll back", what.label, ro.To)
	}
	// Serve drives the rollback: none serving, nothing is written.
	if _, err := c.brokerURL(ctx, st.Identity); err != nil {
		return v, err
	}
	ro, err = st.Inventory.RollBackRollOut(ctx, what.key, "rolled back by hand: "+r.Why, c.Now())
	switch {
	case errors.Is(err, inventory.ErrNoRollOut):
		return v, fmt.Errorf("%s has no roll-out to roll back: '%s' starts one", what.label, what.start)
	case errors.Is(err, inventory.ErrRollOutUnderWay):
		return v, fmt.Errorf("a roll-out of %s is under way: follow it with '%s', and roll it back once it ended", what.label, what.show)
	case err != nil:
		return v, err
	}
	if _, err := st.Health.RecordHandAct(ctx, health.HandAct{At: c.Now(), What: fmt.Sprintf("rollback of the roll-out of %s to %s", what.label, ro.To),
		Why: r.Why, Cause: "roll-out", Who: who()}); err != nil {
		return v, err
	}
	r.Progress(fmt.Sprintf("rollback of the roll-out of %s to %s recorded; the serving controller drives it", what.label, ro.To))
	v, err = c.followRollOut(ctx, st, what, v, ro, r.Progress, r.Tally)
	if !errors.Is(err, ErrRollOutRolledBack) {
		return v, err
	}
	// Rolled back is what was asked: only the nodes not back are an error.
	var not []string
	for _, n := range v.RollOut.Nodes {
		if n.Back == "not-returned" {
			not = append(not, nodeBack(*v.RollOut, n))
		}
	}
	if len(not) > 0 {
		return v, fmt.Errorf("%w, but not every node is back: %s", ErrRollOutRolledBack, strings.Join(not, "; "))
	}
	return v, nil
}

// followRollOut reads the roll-out from the store until it ends, saying
// each node's steps as they are recorded, or, given a tally, telling it
// the counts each time it is read; ctx ending leaves it to serve. What
// its nodes had done when it was started (a rollback of one that ended)
// is not said again.
func (c uses) followRollOut(ctx context.Context, st *Stores, what rolled, v UpgradeView, from inventory.RollOut, progress func(string), tally func(RollOutTally)) (UpgradeView, error) {
	id := from.ID
	// Said of a node or a batch: on a running line, its counts say it.
	step := progress
	if tally != nil {
		step = func(string) {}
	}
	seen := map[string]inventory.RollOutNode{}
	for _, n := range from.Nodes {
		seen[n.Node] = n
	}
	phase, lastMark := "", ""
	unserved := false
	for polls := 1; ; polls++ {
		// Serve drives it: a command left following a roll-out no one
		// drives says so, and goes on following (serve resumes it).
		if polls%100 == 0 {
			_, err := c.brokerURL(ctx, st.Identity)
			if gone := err != nil; gone != unserved {
				unserved = gone
				if gone {
					progress("no controller is serving: the roll-out waits for 'mesh-controller serve', which resumes it")
				} else {
					progress("a controller serves again: the roll-out goes on")
				}
			}
		}
		// Its nodes are read when it was written since (a roll-out of
		// thousands of nodes is not read whole every poll), and each second
		// whatever the mark says (it is kept to the millisecond).
		mark, err := st.Inventory.RollOutMark(ctx, what.key)
		if err != nil {
			return v, err
		}
		if mark == lastMark && polls%20 != 0 {
			if err := pause(ctx, followEvery); err != nil {
				return v, err
			}
			continue
		}
		lastMark = mark
		ro, ok, err := st.Inventory.RollOut(ctx, what.key)
		if err != nil {
			return v, err
		}
		if !ok || ro.ID != id {
			return v, fmt.Errorf("the roll-out of %s followed was replaced by another: see '%s'", what.label, what.show)
		}
		for _, n := range ro.Nodes {
			sayNode(step, ro, seen[n.Node], n)
			seen[n.Node] = n
		}
		// After its nodes' steps: the phase moved once they were done.
		if ro.Phase != phase {
			switch ro.Phase {
			case inventory.RollOutSoaking:
				step(fmt.Sprintf("the batch is ready: soaking %s (it must stay ready)", ro.Soak))
			case inventory.RollOutRollingBack:
				progress("rolling back: " + ro.Why)
			}
			phase = ro.Phase
		}
		v = rollOutView(v, ro)
		if tally != nil {
			tally(TallyOf(ro))
		}
		if ro.Ended() {
			return v, rollOutEnd(ro)
		}
		if err := pause(ctx, followEvery); err != nil {
			return v, err
		}
	}
}

// RollOutTally is how far a roll-out is, counted over its nodes: those
// through (ready), failed, and waiting (not yet sent, or sent and not yet
// ready) of Total; once it goes back, over the nodes it returns: back,
// not back, and still returning.
type RollOutTally struct {
	// To is the version rolled out; Phase the roll-out's (running,
	// soaking, done, stopped, rolling-back, rolled-back); Batch the
	// highest batch sent so far (0 is the canary).
	To    string
	Phase string
	Batch int
	// Back says the counts are of the nodes going back.
	Back                         bool
	Total, Done, Failed, Waiting int
}

// TallyOf counts a roll-out's nodes.
func TallyOf(ro inventory.RollOut) RollOutTally {
	t := RollOutTally{To: ro.To, Phase: ro.Phase}
	t.Back = ro.Phase == inventory.RollOutRollingBack || ro.Phase == inventory.RollOutRolledBack
	for _, n := range ro.Nodes {
		if n.Serial != 0 && n.Batch > t.Batch {
			t.Batch = n.Batch
		}
		if t.Back {
			if n.Back == "" && (!n.Moved || n.From == ro.To) {
				continue // never moved: nothing to return
			}
			t.Total++
			switch n.Back {
			case "returned":
				t.Done++
			case "not-returned":
				t.Failed++
			}
			continue
		}
		t.Total++
		switch n.Result {
		case "ready":
			t.Done++
		case "failed":
			t.Failed++
		}
	}
	t.Waiting = t.Total - t.Done - t.Failed
	return t
}

// pause waits for d, or until ctx ends (its error).
func pause(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// sayNode says what changed for a node of a roll-out since was.
func sayNode(progress func(string), ro inventory.RollOut, was, n inventory.RollOutNode) {
	label := rolledOf(ro).label
	if n.Serial != 0 && was.Serial != n.Serial {
		progress(fmt.Sprintf("%s sent declaration %d (%s %s -> %s)", n.Node, n.Serial, label, n.From, ro.To))
	}
	if n.Applied && !was.Applied {
		progress(fmt.Sprintf("%s applied declaration %d (%s %s)", n.Node, n.Serial, label, ro.To))
	}
	if n.Result != was.Result {
		switch n.Result {
		case "ready":
			progress(fmt.Sprintf("%s runs %s %s: ready%s", n.Node, label, ro.To, inParens(n.Prepared)))
		case "failed":
			progress(fmt.Sprintf("%s failed: %s", n.Node, n.Error))
		}
	}
	if n.Back != was.Back {
		switch n.Back {
		case "returning":
			progress(fmt.Sprintf("%s going back to %s %s (declaration %d)", n.Node, label, n.From, n.BackSerial))
		case "returned", "not-returned":
			progress(nodeBack(ro, n))
		}
	}
}

// inParens is " (s)", or "" when s is.
func inParens(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}

// nodeBack says what became of a node's return, with its host's word.
func nodeBack(ro inventory.RollOut, n inventory.RollOutNode) string {
	label := rolledOf(ro).label
	line := fmt.Sprintf("%s back on %s %s", n.Node, label, n.From)
	if n.Back == "not-returned" {
		line = fmt.Sprintf("%s not back on %s %s: %s", n.Node, label, n.From, n.BackError)
	}
	return line + inParens(n.Detail)
}

// rollOutView is v with what the roll-out recorded of its nodes.
func rollOutView(v UpgradeView, ro inventory.RollOut) UpgradeView {
	v.RollOut = &ro
	by := map[string]inventory.RollOutNode{}
	for _, n := range ro.Nodes {
		by[n.Node] = n
	}
	for i := range v.Steps {
		s := &v.Steps[i]
		if n, ok := by[s.Node]; ok {
			s.Serial, s.Applied, s.Ready, s.Error = n.Serial, n.Applied, n.Result == "ready", n.Error
			if n.Result == "failed" && v.Stopped == "" {
				v.Stopped = n.Node
			}
		}
	}
	return v
}

// rollOutEnd is the error an ended roll-out is said with: nil when done.
func rollOutEnd(ro inventory.RollOut) error {
	switch ro.Phase {
	case inventory.RollOutRolledBack:
		var back []string
		for _, n := range ro.Nodes {
			if n.Back != "" {
				back = append(back, nodeBack(ro, n))
			}
		}
		if len(back) == 0 {
			back = []string{"none had moved"}
		}
		return fmt.Errorf("%w: %s; the nodes it moved: %s", ErrRollOutRolledBack, ro.Why, strings.Join(back, "; "))
	case inventory.RollOutStopped:
		return fmt.Errorf("%w: %s", ErrRollOutStopped, ro.Why)
	}
	return nil
}

// returning are the indexes of the roll-out's nodes a rollback returns:
// those it moved off another version that still run its version (a node
// moved by hand since, or its module unassigned, is left alone), and
// those whose return was committed before a restart (planned at their
// from version again), to be waited for. at says what version a node is
// planned at now ("" for none).
func returning(ro inventory.RollOut, at func(node string) string) []int {
	var out []int
	for i, n := range ro.Nodes {
		if n.From == ro.To || n.Back == "returned" || n.Back == "not-returned" {
			continue
		}
		want := ro.To
		if n.Back == "returning" {
			want = n.From
		}
		if at(n.Node) == want {
			out = append(out, i)
		}
	}
	return out
}

// rollOutJob is serve's: every rollOutEvery it starts a driver for each
// roll-out under way that none drives (one resumed after a restart, or
// just written by a command); the drivers end with the daemon's term.
func (c uses) rollOutJob(ctx context.Context, log *slog.Logger) daemon.Job {
	ctx, cancel := context.WithCancel(ctx)
	tick := time.NewTicker(rollOutEvery)
	var mu sync.Mutex
	driving := map[string]bool{}
	lastErr := map[string]string{}
	var wg sync.WaitGroup
	return daemon.Job{Name: "roll-outs", Due: func() <-chan time.Time { return tick.C },
		Run: func(context.Context) {
			st, err := c.stores(ctx)
			if err != nil {
				return
			}
			keys, err := st.Inventory.RollOutsUnderWay(ctx)
			if err != nil {
				log.Warn("roll-outs: read those under way", "err", err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for _, m := range keys {
				if driving[m] {
					continue
				}
				driving[m] = true
				wg.Go(func() {
					err := c.driveRollOut(ctx, st, m, log)
					mu.Lock()
					defer mu.Unlock()
					delete(driving, m)
					// An error is said once until it changes: the driver is
					// tried again each tick.
					if err != nil && ctx.Err() == nil && lastErr[m] != err.Error() {
						log.Warn("roll-out: driving it failed; tried again", "of", rolledKey(m).label, "err", err)
					}
					lastErr[m] = fmt.Sprint(err)
				})
			}
		},
		Stop: func() {
			tick.Stop()
			cancel()
			wg.Wait()
		}}
}

// driveRollOut drives a roll-out (a module's, or the hosts') until it ends (or ctx does):
// batch after batch, moved as one act each and waited for until ready and
// through the soak; past --max-failures, every node it moved goes back.
// Each step is recorded in the store before the next, so that a serve
// started again resumes it where it was: a batch moved and not yet judged
// is waited for again, a rollback under way goes on.
func (c uses) driveRollOut(ctx context.Context, st *Stores, key string, log *slog.Logger) error {
	m, err := c.newRollMover(ctx, st)
	if err != nil {
		return err
	}
	defer m.close()
	var kind rollKind // one for the driver's life: it remembers between batches
	for {
		ro, ok, err := st.Inventory.RollOut(ctx, key)
		if err != nil || !ok || ro.Ended() {
			return err
		}
		if kind == nil {
			kind = c.kindOf(ro)
		}
		if ro.Phase == inventory.RollOutRollingBack {
			err = c.rollBack(ctx, st, m, kind, &ro)
		} else {
			err = c.rollBatch(ctx, st, m, kind, &ro)
		}
		if err != nil {
			return err
		}
		log.Info("roll-out", "of", rolledKey(key).label, "to", ro.To, "phase", ro.Phase)
	}
}

// rollBatch moves the roll-out's next batch and judges it: it ends the
// roll-out (done) when none is left, and turns it to rolling back when
// the failures pass --max-failures.
func (c uses) rollBatch(ctx context.Context, st *Stores, m *rollMover, kind rollKind, ro *inventory.RollOut) error {
	inv := st.Inventory
	label := rolledOf(*ro).label
	batch := -1
	for _, n := range ro.Nodes {
		if n.Result == "waiting" || n.Result == "moved" {
			batch = n.Batch
			break
		}
	}
	if batch < 0 {
		ro.Phase = inventory.RollOutDone
		if err := c.saveRollOut(ctx, st, ro); err != nil {
			return err
		}
		return c.rollOutActs(ctx, st, ro, fmt.Sprintf("roll-out %s to %s done: %s ready", label, ro.To, Plural(countResult(*ro, "ready"), "node")))
	}
	v := UpgradeView{Module: label, Current: ro.To}
	var idx, toMove []int // idx[k] is v.Steps[k]'s node in ro.Nodes
	for i, n := range ro.Nodes {
		if n.Batch != batch || (n.Result != "waiting" && n.Result != "moved") {
			continue
		}
		if n.Result == "waiting" {
			toMove = append(toMove, len(v.Steps))
		}
		v.Steps = append(v.Steps, UpgradeStep{Node: n.Node, From: n.From, To: ro.To, Serial: n.Serial})
		idx = append(idx, i)
	}
	var failures []string
	fail := func(k int, why string) {
		n := &ro.Nodes[idx[k]]
		n.Result, n.Error = "failed", why
		failures = append(failures, n.Node+": "+why)
	}
	if len(toMove) > 0 {
		committed, err := kind.move(ctx, m, ro, &v, toMove)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		for _, k := range toMove {
			n, s := &ro.Nodes[idx[k]], v.Steps[k]
			switch {
			case !committed:
				fail(k, err.Error())
			case s.Error != "":
				n.Moved, n.Serial = true, s.Serial
				fail(k, "declaration not sent: "+s.Error)
			default:
				n.Moved, n.Serial, n.Result = true, s.Serial, "moved"
			}
		}
		if err := c.saveRollOut(ctx, st, ro); err != nil {
			return err
		}
		var acts []string
		for _, k := range toMove {
			n := ro.Nodes[idx[k]]
			result := fmt.Sprintf("declaration %d sent", n.Serial)
			if n.Result == "failed" {
				result = "failed: " + n.Error
			}
			acts = append(acts, fmt.Sprintf("roll-out %s batch %d: move %s from %s to %s: %s", label, batch, n.Node, n.From, ro.To, result))
		}
		if err := c.rollOutActs(ctx, st, ro, acts...); err != nil {
			return err
		}
	}
	// Read once the batch is sent, not before: what its wait and soak read
	// of the mesh (the versions' manifests) delays no declaration.
	snap, err := inv.Snapshot(ctx)
	if err != nil {
		return err
	}
	wait, err := c.waitFor(ctx, st, snap, kind, ro, &v, idx, func(n inventory.RollOutNode) bool { return n.Result == "moved" })
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var ready []int
	for _, k := range wait {
		n, s := &ro.Nodes[idx[k]], v.Steps[k]
		n.Applied = s.Applied
		if s.Ready {
			n.Prepared = s.Detail
			ready = append(ready, k)
		} else {
			fail(k, s.Error)
			failures = failures[:len(failures)-1] // said by err, below
		}
	}
	// The wait says its failures at once (the nodes silent past the wait
	// in one line), as a roll-out always said them.
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			failures = append(failures, strings.TrimPrefix(strings.TrimPrefix(e.Error(), ErrRollOutStopped.Error()+": "), ErrRollOutStopped.Error()+" at "))
		}
	} else if err != nil {
		failures = append(failures, strings.TrimPrefix(strings.TrimPrefix(err.Error(), ErrRollOutStopped.Error()+": "), ErrRollOutStopped.Error()+" at "))
	}
	if err != nil && !errors.Is(err, ErrRollOutStopped) {
		return err
	}
	if kind.soaks(snap, *ro) && ro.Soak > 0 && len(ready) > 0 {
		ro.Phase = inventory.RollOutSoaking
		if err := c.saveRollOut(ctx, st, ro); err != nil {
			return err
		}
		if err := kind.soak(ctx, st, &v, ready, ro.Soak); err != nil {
			return err
		}
	}
	for _, k := range ready {
		if s := v.Steps[k]; s.Ready {
			ro.Nodes[idx[k]].Result = "ready"
		} else {
			fail(k, s.Error)
		}
	}
	ro.Phase = inventory.RollOutRunning
	if failed := countResult(*ro, "failed"); failed > ro.MaxFailures {
		ro.Phase = inventory.RollOutRollingBack
		if len(failures) > 10 {
			failures = append(failures[:10], fmt.Sprintf("and %d more", len(failures)-10))
		}
		ro.Why = fmt.Sprintf("%s failed, past --max-failures %d: %s", Plural(failed, "node"), ro.MaxFailures, strings.Join(failures, "; "))
	}
	if err := c.saveRollOut(ctx, st, ro); err != nil {
		return err
	}
	var acts []string
	for _, k := range wait {
		n := ro.Nodes[idx[k]]
		result := "ready"
		if n.Result == "failed" {
			result = "failed: " + n.Error
		} else if ro.Soak > 0 {
			result = "ready through the " + ro.Soak.String() + " soak"
		}
		result += inParens(n.Prepared)
		acts = append(acts, fmt.Sprintf("roll-out %s batch %d: %s on %s %s: %s", label, batch, n.Node, label, ro.To, result))
	}
	if ro.Phase == inventory.RollOutRollingBack {
		acts = append(acts, fmt.Sprintf("roll-out %s to %s stopped, rolling back: %s", label, ro.To, ro.Why))
	}
	return c.rollOutActs(ctx, st, ro, acts...)
}

// rollBack returns every node the roll-out moved to the version it ran,
// one act per batch, and waits for them all to report it ready; a node
// not back in time is said, and the rollback ends rolled back.
func (c uses) rollBack(ctx context.Context, st *Stores, m *rollMover, kind rollKind, ro *inventory.RollOut) error {
	snap, err := st.Inventory.Snapshot(ctx)
	if err != nil {
		return err
	}
	label := rolledOf(*ro).label
	v := UpgradeView{Module: label, Current: ro.To}
	var idx []int
	byBatch := map[int][]int{}
	var batches []int
	for _, i := range kind.returning(snap, *ro) {
		n := ro.Nodes[i]
		k := len(v.Steps)
		v.Steps = append(v.Steps, UpgradeStep{Node: n.Node, From: ro.To, To: n.From, Serial: n.BackSerial})
		idx = append(idx, i)
		if n.Back == "returning" {
			continue // sent before a restart: waited for again
		}
		if _, ok := byBatch[n.Batch]; !ok {
			batches = append(batches, n.Batch)
		}
		byBatch[n.Batch] = append(byBatch[n.Batch], k)
	}
	// A node of the roll-out no longer on its version is said, not moved.
	for i := range ro.Nodes {
		n := &ro.Nodes[i]
		if n.Moved && n.Back == "" && n.From != ro.To && !slices.Contains(idx, i) {
			n.Back, n.BackError = "not-returned", "it no longer runs "+label+" "+ro.To+": left as it is"
		}
	}
	// Later batches first: the canary, which moved first, goes back last.
	for b := len(batches) - 1; b >= 0; b-- {
		steps := byBatch[batches[b]]
		committed, err := kind.move(ctx, m, ro, &v, steps)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		for _, k := range steps {
			n, s := &ro.Nodes[idx[k]], v.Steps[k]
			switch {
			case !committed:
				n.Back, n.BackError = "not-returned", err.Error()
			case s.Error != "":
				n.Back, n.BackSerial, n.BackError = "not-returned", s.Serial, "declaration not sent: "+s.Error
			default:
				n.Back, n.BackSerial = "returning", s.Serial
			}
		}
		if err := c.saveRollOut(ctx, st, ro); err != nil {
			return err
		}
	}
	wait, err := c.waitFor(ctx, st, snap, kind, ro, &v, idx, func(n inventory.RollOutNode) bool { return n.Back == "returning" })
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil && !errors.Is(err, ErrRollOutStopped) {
		return err
	}
	names := make([]string, len(wait))
	for j, k := range wait {
		names[j] = v.Steps[k].Node
	}
	details, err := kind.details(ctx, st, *ro, names)
	if err != nil {
		return err
	}
	for _, k := range wait {
		n, s := &ro.Nodes[idx[k]], v.Steps[k]
		if s.Ready {
			n.Back = "returned"
		} else {
			n.Back, n.BackError = "not-returned", s.Error
		}
		n.Detail = details[n.Node]
	}
	ro.Phase = inventory.RollOutRolledBack
	if len(v.Steps) == 0 {
		// Nothing had moved (the first move was refused): nothing went back.
		ro.Phase = inventory.RollOutStopped
	}
	if err := c.saveRollOut(ctx, st, ro); err != nil {
		return err
	}
	var acts []string
	for _, n := range ro.Nodes {
		if n.Back != "" {
			acts = append(acts, "rollback of "+label+" "+ro.To+": "+nodeBack(*ro, n))
		}
	}
	return c.rollOutActs(ctx, st, ro, acts...)
}

// waitFor waits, bounded by the roll-out's --wait, for the steps of v
// whose node (ro.Nodes[idx[k]]) is picked, and returns them.
func (c uses) waitFor(ctx context.Context, st *Stores, snap *inventory.Snapshot, kind rollKind, ro *inventory.RollOut, v *UpgradeView, idx []int, pick func(inventory.RollOutNode) bool) ([]int, error) {
	var wait []int
	for k := range v.Steps {
		if pick(ro.Nodes[idx[k]]) {
			wait = append(wait, k)
		}
	}
	return wait, kind.wait(ctx, st, snap, v, wait, ro.Wait)
}

// rollKind is what a roll-out moves, and how it judges its nodes: a
// module's assignments to one of its versions (moduleRoll), or hosts to a
// host release (hostRoll). The batches, soak, failures and rollback are
// the roll-out's own (rollBatch, rollBack), whatever it moves.
type rollKind interface {
	// returning are the indexes of ro's nodes a rollback returns
	// (returning).
	returning(snap *inventory.Snapshot, ro inventory.RollOut) []int
	// move moves these steps of v (each to its To; their nodes ro's) as
	// one act and sends their declarations (rollMover.move).
	move(ctx context.Context, m *rollMover, ro *inventory.RollOut, v *UpgradeView, steps []int) (committed bool, err error)
	// wait waits, bounded by wait, until these steps' hosts report them
	// ready at their To, or failed (ErrRollOutStopped, joined).
	wait(ctx context.Context, st *Stores, snap *inventory.Snapshot, v *UpgradeView, steps []int, wait time.Duration) error
	// soaks says whether ro's ready batches are watched through a soak.
	soaks(snap *inventory.Snapshot, ro inventory.RollOut) bool
	// soak watches these ready steps for d; a step that did not stay
	// ready is no longer Ready, and its Error says what it did.
	soak(ctx context.Context, st *Stores, v *UpgradeView, steps []int, d time.Duration) error
	// details are the hosts' word on these nodes once back, by node.
	details(ctx context.Context, st *Stores, ro inventory.RollOut, nodes []string) (map[string]string, error)
}

// moduleRoll moves a module's nodes to one of its versions.
type moduleRoll struct{ c uses }

func (k moduleRoll) returning(snap *inventory.Snapshot, ro inventory.RollOut) []int {
	return returning(ro, func(node string) string { return snap.VersionOn(node, ro.Module) })
}

func (k moduleRoll) move(ctx context.Context, m *rollMover, _ *inventory.RollOut, v *UpgradeView, steps []int) (bool, error) {
	return m.move(ctx, v, steps)
}

func (k moduleRoll) wait(ctx context.Context, st *Stores, snap *inventory.Snapshot, v *UpgradeView, steps []int, wait time.Duration) error {
	return k.c.waitApplied(ctx, st, snap, v, steps, UpgradeRequest{Module: v.Module, Wait: wait, Progress: func(string) {}})
}

// soaks: a module with nothing to run is done once applied.
func (k moduleRoll) soaks(snap *inventory.Snapshot, ro inventory.RollOut) bool {
	return snap.Manifests[ro.Module][ro.To].Run != nil
}

// details are the modules' details back at their from versions (the data
// restored, or kept).
func (k moduleRoll) details(ctx context.Context, st *Stores, ro inventory.RollOut, nodes []string) (map[string]string, error) {
	states, err := st.Health.ModuleStatesOn(ctx, ro.Module, nodes)
	if err != nil {
		return nil, err
	}
	from := map[string]string{}
	for _, n := range ro.Nodes {
		from[n.Node] = n.From
	}
	out := map[string]string{}
	for node, m := range states {
		if m.Version == from[node] {
			out[node] = m.Detail
		}
	}
	return out, nil
}

// soak watches these ready steps for d: a step whose module is no longer
// ready at its version, or was restarted (its pid or restart count
// changed), within it is no longer Ready, and its Error says what it did.
func (k moduleRoll) soak(ctx context.Context, st *Stores, v *UpgradeView, steps []int, d time.Duration) error {
	names := make([]string, len(steps))
	for j, k := range steps {
		names[j] = v.Steps[k].Node
	}
	first, err := st.Health.ModuleStatesOn(ctx, v.Module, names)
	if err != nil {
		return err
	}
	until := time.Now().Add(d)
	left := append([]int(nil), steps...)
	for len(left) > 0 {
		states, err := st.Health.ModuleStatesOn(ctx, v.Module, names)
		if err != nil {
			return err
		}
		var still []int
		for _, k := range left {
			s := &v.Steps[k]
			m, was := states[s.Node], first[s.Node]
			switch {
			case m.Version != s.To:
				s.Ready, s.Error = false, fmt.Sprintf("ready, then %s %q within the %s soak", v.Module, m.Version, d)
			case m.State != protocol.StateReady || m.Pid != was.Pid || m.Restarts1h > was.Restarts1h:
				s.Ready, s.Error = false, fmt.Sprintf("ready, then %s within the %s soak", m.State, d)
				if m.State == protocol.StateReady {
					s.Error = fmt.Sprintf("ready, then restarted within the %s soak", d)
				}
				if why := strings.TrimSpace(m.Detail + " " + m.LastExit); why != "" {
					s.Error += ": " + why
				}
			default:
				still = append(still, k)
			}
		}
		left = still
		if !time.Now().Before(until) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(min(followEvery, time.Until(until))):
		}
	}
	return nil
}

// countResult counts the roll-out's nodes whose result is result.
func countResult(ro inventory.RollOut, result string) int {
	n := 0
	for _, x := range ro.Nodes {
		if x.Result == result {
			n++
		}
	}
	return n
}

// saveRollOut records the roll-out's progress.
func (c uses) saveRollOut(ctx context.Context, st *Stores, ro *inventory.RollOut) error {
	return st.Inventory.SaveRollOut(ctx, *ro, c.Now())
}

// rollOutActs records steps of a roll-out as hand acts (each naming its
// node and result), by whom the roll-out was started: one write for a
// batch's nodes, however many.
func (c uses) rollOutActs(ctx context.Context, st *Stores, ro *inventory.RollOut, whats ...string) error {
	if len(whats) == 0 {
		return nil
	}
	why := ro.Why
	if why == "" {
		why = "a step of the roll-out of " + rolledOf(*ro).label + " to " + ro.To
	}
	now := c.Now()
	acts := make([]health.HandAct, len(whats))
	for i, w := range whats {
		acts[i] = health.HandAct{At: now, What: w, Why: why, Cause: "roll-out", Who: ro.Who}
	}
	_, err := st.Health.RecordHandActs(ctx, acts)
	return err
}
