package host

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/mod/semver"

	"mesh-controller/app/protocol"
	"mesh-controller/app/restic"
)

// Upgrades with a way back (issue 31, a module's prepare). When an apply
// moves a module from the version it runs to one whose declaration has a
// prepare, the host, after the new version's archive is unpacked and
// before anything of the declaration is written (the "prepare" phase):
// holds the old version stopped, snapshots each precious data set the
// module keeps into the node's repository on the backup holder (the
// backup an ask makes, reported as one), and runs the new version's
// prepare as the module runs. A prepare that fails or outlives its
// timeout fails the apply whole: a data set it changed (judged by a tree
// digest) is restored from the snapshot just taken, what it left moved
// aside and kept, and the old version runs again. One that succeeds is
// remembered (upgrades.json): a later declaration that moves the module
// back restores each set from that snapshot before the old version starts
// (the "restore" phase, and the swap once the declaration is the host's).
// What the host did of a module's data is said in its state's detail.

// fileUpgrades is, in the state dir, what the host remembers of the
// upgrades it prepared, and what it said of each module's data.
const fileUpgrades = "upgrades.json"

// upgradesState is fileUpgrades.
type upgradesState struct {
	// Prepared is, per module, its last upgrade whose prepare ran, kept
	// while the module runs that upgrade's To version.
	Prepared []preparedUpgrade `json:"prepared,omitempty"`
	// Notes are what the host says of each module's data since its last
	// move (Supervisor.Note).
	Notes []dataNote `json:"notes,omitempty"`
}

// preparedUpgrade is an upgrade whose prepare ran: the way back.
type preparedUpgrade struct {
	Module string    `json:"module"`
	From   string    `json:"from"`
	To     string    `json:"to"`
	At     time.Time `json:"at"`
	// Snapshots are those taken of its precious data sets just before.
	Snapshots []setSnapshot `json:"snapshots,omitempty"`
	// Unsnapshotted are its precious data sets none was taken of, each
	// with why ("cache: no access yet").
	Unsnapshotted []string `json:"unsnapshotted,omitempty"`
}

// setSnapshot is a snapshot of a data set: where it was, restic's id.
type setSnapshot struct {
	Data     string `json:"data"`
	Path     string `json:"path"`
	Snapshot string `json:"snapshot"`
}

// dataNote is what the host says of a module's data while it runs a version.
type dataNote struct {
	Module  string `json:"module"`
	Version string `json:"version"`
	Detail  string `json:"detail"`
}

// The precious levels whose data sets an upgrade snapshots.
const (
	irreplaceable = "irreplaceable"
	costly        = "costly"
)

// upgradeClaimWait bounds how long an upgrade waits for a backup or a
// restore of the module's data that runs already.
const upgradeClaimWait = 10 * time.Minute

// holderDialWait bounds the look at whether the backup holder answers,
// before the module is stopped for a snapshot.
const holderDialWait = 3 * time.Second

// loadUpgrades reads what the host remembers of its upgrades, and says
// again what it said of each module's data.
func (r *Runner) loadUpgrades() error {
	ups, err := loadJSON[upgradesState](r.State.Dir, fileUpgrades)
	if err != nil {
		return fmt.Errorf("read %s: %w", fileUpgrades, err)
	}
	r.ups = ups
	for _, n := range ups.Notes {
		r.sup.Note(n.Module, n.Version, n.Detail)
	}
	return nil
}

// The kinds of a module's move from one version to another.
const (
	movePlain   = iota // nothing to do of its data
	movePrepare        // the new version has a prepare
	moveBack           // back to the version a prepare moved it from
	moveDown           // to an older version no prepare moved it from
)

// move is a module an apply moves from the version it runs to another.
type move struct {
	kind int
	m    protocol.DeclaredModule
	// old is how it runs now, next how it will.
	old, next runRecord
	// back is the upgrade a moveBack undoes.
	back *preparedUpgrade
}

// upgrading is what one apply does to the modules whose version it
// moves, and how it is finished (finish): once the declaration is the
// host's, or undone when it is not.
type upgrading struct {
	r  *Runner
	nc *nats.Conn

	planned bool
	moves   []move
	// held releases the modules held stopped; claimed are the backup
	// work's keys claimed.
	held    []func()
	claimed [][]string
	// prepared are the modules whose data was snapshotted (and prepared),
	// to be undone if the apply fails.
	prepared []*preparing
	// back are the snapshots fetched to go back, swapped in by commit.
	back []*goingBack
	// dialed are the repositories looked at: "" if they answered, else why not.
	dialed map[string]string
}

// preparing is one module's forward upgrade under way.
type preparing struct {
	mv   move
	sets []upgradeSet
	// ran says its prepare ran (failed says it failed); rec is what is
	// remembered if the apply goes through.
	ran, failed bool
	rec         preparedUpgrade
	// notes are what is said of sets that had no snapshot.
	notes []string
}

// upgradeSet is a precious data set of a module being upgraded.
type upgradeSet struct {
	ds  dataSet
	rel string
	// b is how it is backed up (nil: it is not); why says why no snapshot
	// can be taken ("" if one can).
	b   *protocol.DeclaredBackup
	why string
	// snap is the snapshot taken, before the digest before prepare ran.
	snap, before string
	short        string
}

// goingBack is a data set restored into its scratch directory, to be
// swapped in when the module goes back.
type goingBack struct {
	mv  move
	sn  setSnapshot
	f   *fetched
	out protocol.BackupOutcome
}

// upgrading starts an apply's upgrading; nil when the host runs no
// modules (a simulated one).
func (r *Runner) upgrading(nc *nats.Conn) *upgrading {
	return &upgrading{r: r, nc: nc, dialed: map[string]string{}}
}

// preparedOf is the module's remembered upgrade, nil if none.
func (r *Runner) preparedOf(module string) *preparedUpgrade {
	for i := range r.ups.Prepared {
		if r.ups.Prepared[i].Module == module {
			p := r.ups.Prepared[i]
			return &p
		}
	}
	return nil
}

// plan works out, once the declaration verified, which modules it moves
// and how.
func (u *upgrading) plan(j *applyJob) []move {
	if u == nil {
		return nil
	}
	if u.planned {
		return u.moves
	}
	u.planned = true
	old, next := map[string]runRecord{}, map[string]runRecord{}
	for _, r := range j.last.Runs {
		old[r.Module] = r
	}
	for _, r := range j.next.Runs {
		next[r.Module] = r
	}
	for _, m := range j.d.Modules {
		o, ok := old[m.Module]
		if !ok || o.Version == m.Version {
			continue
		}
		mv := move{kind: movePlain, m: m, old: o, next: next[m.Module]}
		switch rec := u.r.preparedOf(m.Module); {
		case rec != nil && rec.To == o.Version && rec.From == m.Version:
			mv.kind, mv.back = moveBack, rec
		case m.Prepare != nil:
			mv.kind = movePrepare
		case semver.Compare("v"+m.Version, "v"+o.Version) < 0:
			mv.kind = moveDown
		}
		u.moves = append(u.moves, mv)
	}
	return u.moves
}

// has says the apply moves a module of kind.
func (u *upgrading) has(j *applyJob, kind int) bool {
	return slices.ContainsFunc(u.plan(j), func(mv move) bool { return mv.kind == kind })
}

// claim claims the backup work's keys of a module's data sets (and the
// module's, as a restore does), waiting while a backup or restore of them
// runs.
func (u *upgrading) claim(module string, sets []string) error {
	keys := []string{module}
	for _, s := range sets {
		keys = append(keys, module+"/"+s)
	}
	deadline := time.Now().Add(upgradeClaimWait)
	for {
		running, ok := u.r.bk.claim("prepare", keys...)
		if ok {
			u.claimed = append(u.claimed, keys)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("a %s of %s's data runs on %s still, after %s", running, module, u.r.State.Node, upgradeClaimWait)
		}
		select {
		case <-u.r.ctx.Done():
			return context.Cause(u.r.ctx)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// hold holds a module stopped while why, until finish.
func (u *upgrading) hold(module, why string) error {
	release, err := u.r.sup.HoldWhile(module, why)
	if err != nil {
		return fmt.Errorf("stop %s: %w", module, err)
	}
	u.held = append(u.held, release)
	return nil
}

// backupOf is how a data set of module is backed up, as the declaration
// being applied says (the truth of where its backup holder is now); nil
// if it is not.
func backupOf(j *applyJob, module, data string) *protocol.DeclaredBackup {
	for _, b := range j.d.Backups {
		if b.Module == module && b.Data == data {
			return &b
		}
	}
	return nil
}

// preciousSets are the irreplaceable and costly data sets the module
// keeps as it runs now, each with how it is backed up and whether a
// snapshot can be taken of it now.
func (u *upgrading) preciousSets(j *applyJob, mv move) []upgradeSet {
	var out []upgradeSet
	for _, ds := range j.last.Data {
		if ds.Module != mv.m.Module || mv.old.Data[ds.Name] != ds.Path || (ds.Precious != irreplaceable && ds.Precious != costly) {
			continue
		}
		s := upgradeSet{ds: ds}
		s.rel, _ = dataRel(ds.Path) // judged when it was declared
		s.b = backupOf(j, ds.Module, ds.Name)
		s.why = u.cannotSnapshot(s.b)
		out = append(out, s)
	}
	return out
}

// cannotSnapshot says why no snapshot can be taken through b now: none
// declared, no access issued, no restic here, the holder not answering;
// "" when one can.
func (u *upgrading) cannotSnapshot(b *protocol.DeclaredBackup) string {
	switch {
	case b == nil:
		return "no backup holder keeps it (no module holds the backup seat, or its address is unknown)"
	case b.Access == "":
		return "this node has no access to its backup repository yet (the backup seat's holder has not issued it)"
	}
	if _, err := exec.LookPath("restic"); err != nil {
		return restic.ErrNotInstalled.Error()
	}
	why, ok := u.dialed[b.Repository]
	if !ok {
		why = dialHolder(b.Repository)
		u.dialed[b.Repository] = why
	}
	return why
}

// dialHolder says why the REST server of a repository does not take a
// connection, "" if it does.
func dialHolder(repository string) string {
	u, err := url.Parse(strings.TrimPrefix(repository, "rest:"))
	if err != nil || u.Host == "" {
		return fmt.Sprintf("the repository %q is not rest:http://ADDRESS:PORT/NODE/", repository)
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), map[bool]string{true: "443", false: "80"}[u.Scheme == "https"])
	}
	c, err := net.DialTimeout("tcp", addr, holderDialWait)
	if err != nil {
		return fmt.Sprintf("the backup holder at %s cannot be reached: %v", addr, err)
	}
	c.Close()
	return ""
}

// prepare is the apply's prepare phase: every module moved to a version
// with a prepare is judged first (an irreplaceable data set of which no
// snapshot can be taken refuses the declaration, nothing touched, unless
// a person allowed it), then each is held stopped, snapshotted and
// prepared in turn. The first that fails fails the apply; finish undoes
// them all.
func (j *applyJob) prepare() error {
	u := j.up
	var todo []*preparing
	for _, mv := range u.plan(j) {
		if mv.kind != movePrepare {
			continue
		}
		p := &preparing{mv: mv, sets: u.preciousSets(j, mv)}
		for _, s := range p.sets {
			if s.why != "" && s.ds.Precious == irreplaceable && !mv.m.WithoutSnapshot {
				return fmt.Errorf("refused: %s cannot be upgraded to %s: its irreplaceable data set %s cannot be snapshotted first: %s; %s %s runs on, untouched (upgrade %s roll-out --without-snapshot --why ... allows it)",
					mv.m.Module, mv.m.Version, s.ds.Name, s.why, mv.m.Module, mv.old.Version, mv.m.Module)
			}
		}
		todo = append(todo, p)
	}
	for _, p := range todo {
		if err := u.prepareOne(p); err != nil {
			return err
		}
	}
	return nil
}

// prepareOne holds a module stopped, snapshots its precious data sets and
// runs its new version's prepare.
func (u *upgrading) prepareOne(p *preparing) error {
	r, mv := u.r, p.mv
	module, to := mv.m.Module, mv.m.Version
	var names []string
	for _, s := range p.sets {
		names = append(names, s.ds.Name)
	}
	if err := u.claim(module, names); err != nil {
		return fmt.Errorf("refused: %s cannot be upgraded to %s now: %v", module, to, err)
	}
	if err := u.hold(module, to+" prepares its data"); err != nil {
		return err
	}
	u.prepared = append(u.prepared, p)
	p.rec = preparedUpgrade{Module: module, From: mv.old.Version, To: to, At: time.Now().UTC()}
	reason := fmt.Sprintf("before the upgrade of %s to %s", module, to)
	for i := range p.sets {
		s := &p.sets[i]
		if s.why == "" {
			out, err := r.snapshotSet(u.nc, *s.b, s.ds.Path, reason, "mesh:before-upgrade-to-"+to)
			if err != nil {
				s.why = "the snapshot failed: " + oneLine(err.Error())
			} else {
				s.snap, s.short = out.Snapshot, protocol.ShortSnapshot(out.Snapshot)
				p.rec.Snapshots = append(p.rec.Snapshots, setSnapshot{Data: s.ds.Name, Path: s.ds.Path, Snapshot: out.Snapshot})
			}
		}
		if s.why == "" {
			continue
		}
		if s.ds.Precious == irreplaceable && !mv.m.WithoutSnapshot {
			return fmt.Errorf("refused: %s cannot be upgraded to %s: its irreplaceable data set %s could not be snapshotted first: %s", module, to, s.ds.Name, s.why)
		}
		said := s.why
		if s.ds.Precious == irreplaceable {
			said = "allowed without a snapshot: " + s.why
		}
		p.rec.Unsnapshotted = append(p.rec.Unsnapshotted, s.ds.Name+": "+said)
		p.notes = append(p.notes, fmt.Sprintf("%s not snapshotted (%s)", s.ds.Name, said))
		r.warnf("upgrade of %s to %s: %s %s is not snapshotted first: %s", module, to, s.ds.Precious, s.ds.Name, said)
	}
	rt := root{dir: r.Root}
	for i := range p.sets {
		s := &p.sets[i]
		var err error
		if s.before, err = rt.digest(s.rel); err != nil {
			s.before = "unreadable: " + err.Error()
		}
	}
	p.ran = true
	workDir, env := moduleEnv(r.State, r.Root, mv.next)
	env = append(env, "MESH_PREPARE_FROM="+mv.old.Version)
	timeout := mv.m.Prepare.PrepareTimeout()
	r.logf("upgrade of %s to %s: prepare %s (at most %s)", module, to, strings.Join(mv.m.Prepare.Command, " "), timeout)
	if _, err := r.runHook(r.ctx, moduleHook{module: module, argv: mv.m.Prepare.Command, dir: workDir, env: env, timeout: timeout,
		what: "prepare of " + to}); err != nil {
		p.failed = true
		return fmt.Errorf("prepare of %s %s failed: %v", module, to, err)
	}
	r.logf("upgrade of %s to %s: prepare done", module, to)
	return nil
}

// snapshotSet backs a data set up now, where it is (path), as a backup
// ask would, tagged with more; its module is stopped, so no before hook
// runs. Its outcome is reported like any backup's, so that the controller
// records the snapshot.
func (r *Runner) snapshotSet(nc *nats.Conn, b protocol.DeclaredBackup, path, reason string, more ...string) (protocol.BackupOutcome, error) {
	b.Path, b.Before = path, nil
	out := protocol.BackupOutcome{ID: outcomeID("upgrade"), Kind: protocol.KindBackup, Module: b.Module, Data: b.Data, Reason: reason}
	start := time.Now()
	ctx, cancel := context.WithTimeout(r.ctx, backupWithin)
	defer cancel()
	err := r.backup(ctx, b, &out, more...)
	r.outcome(nc, &out, start, err)
	return out, err
}

// outcomeID names an outcome the host reports of its own accord.
func outcomeID(kind string) string {
	return fmt.Sprintf("%s-%d-%s", kind, time.Now().UnixMilli(), strings.ToLower(rand.Text()[:8]))
}

// outcome completes an outcome the host reports of its own accord, logs
// it and reports it beside the apply (it is sent again while the
// controller does not answer; the host waits for it before it stops).
func (r *Runner) outcome(nc *nats.Conn, out *protocol.BackupOutcome, start time.Time, err error) {
	out.OK = err == nil
	if err != nil {
		out.Why = oneLine(err.Error())
	}
	out.DurationMS = float64(time.Since(start).Microseconds()) / 1000
	out.At = time.Now().UTC()
	r.metrics.backedUp(out.Kind, out.OK)
	if out.OK {
		r.logf("%s of %s/%s %s: snapshot %s, %d files, %d bytes in %.0f ms", out.Kind, out.Module, out.Data, out.Reason,
			protocol.ShortSnapshot(out.Snapshot), out.Files, out.Bytes, out.DurationMS)
	} else {
		r.warnf("%s of %s/%s %s failed: %s", out.Kind, out.Module, out.Data, out.Reason, out.Why)
	}
	if nc == nil {
		return
	}
	sent := *out
	r.bk.wg.Go(func() { r.reportOutcome(nc, sent) })
}

// restoreBack is the apply's restore phase: of each module going back to
// the version a prepare moved it from, each snapshot taken before is
// restored and verified beside its data set while the module still runs;
// commit swaps them in. One that cannot be fetched refuses the
// declaration: the module stays on the version it runs, its data as it is.
func (j *applyJob) restoreBack() error {
	u, r := j.up, j.up.r
	for _, mv := range u.plan(j) {
		if mv.kind != moveBack {
			continue
		}
		var names []string
		for _, sn := range mv.back.Snapshots {
			names = append(names, sn.Data)
		}
		if err := u.claim(mv.m.Module, names); err != nil {
			return fmt.Errorf("refused: %s cannot go back to %s now: %v", mv.m.Module, mv.m.Version, err)
		}
		for _, sn := range mv.back.Snapshots {
			ds := dataSet{Module: mv.m.Module, Name: sn.Data, Path: sn.Path}
			for _, d := range mv.m.Data {
				if d.Name == sn.Data {
					ds.Path = d.Path // where the version it goes back to keeps it
				}
			}
			for _, d := range j.last.Data {
				if d.Module == ds.Module && d.Name == ds.Name {
					ds.Made, ds.Precious = d.Made, d.Precious
				}
			}
			fail := func(why string) error {
				return fmt.Errorf("refused: %s cannot go back to %s: its data set %s cannot be restored from the pre-upgrade snapshot %s: %s; %s %s runs on, its data as it is",
					mv.m.Module, mv.m.Version, sn.Data, protocol.ShortSnapshot(sn.Snapshot), why, mv.m.Module, mv.old.Version)
			}
			b := backupOf(j, ds.Module, ds.Name)
			if b == nil || b.Access == "" {
				return fail(u.cannotSnapshot(b))
			}
			ask := protocol.RestoreAsk{ID: outcomeID("upgrade"), Module: ds.Module, Data: ds.Name, Snapshot: sn.Snapshot, From: r.State.Node, SnapshotPath: sn.Path}
			out := protocol.BackupOutcome{ID: ask.ID, Kind: protocol.KindRestore, Module: ds.Module, Data: ds.Name,
				Reason: fmt.Sprintf("%s goes back to %s: the data as it was before the upgrade to %s", ds.Module, mv.m.Version, mv.old.Version)}
			f, err := r.fetch(r.ctx, ask, ds, b.Repository, b.Access, &out)
			if err != nil {
				return fail(oneLine(err.Error()))
			}
			u.back = append(u.back, &goingBack{mv: mv, sn: sn, f: f, out: out})
		}
	}
	return nil
}

// commit swaps in what restoreBack fetched, each module held stopped (it
// starts again at the version it goes back to once the declaration is the
// host's): the last step of an apply before the declaration is
// remembered. What fails leaves the module on the version it runs.
func (u *upgrading) commit() error {
	if u == nil {
		return nil
	}
	held := map[string]bool{}
	for _, g := range u.back {
		module := g.mv.m.Module
		if !held[module] {
			if err := u.hold(module, "its data is restored from the pre-upgrade snapshot"); err != nil {
				return err
			}
			held[module] = true
		}
		start := time.Now()
		err := u.r.swapIn(g.f, &g.out)
		u.r.outcome(u.nc, &g.out, start, err)
		if err != nil {
			return fmt.Errorf("%s cannot go back to %s: restoring its data set %s from the pre-upgrade snapshot %s: %v", module, g.mv.m.Version,
				g.sn.Data, protocol.ShortSnapshot(g.sn.Snapshot), err)
		}
	}
	return nil
}

// finish ends an apply's upgrading. Applied (the declaration is the
// host's, its modules given to the supervisor): what was prepared is
// remembered, what went back forgotten, and each module's data said of.
// Not applied: each module snapshotted is undone (a data set its prepare
// changed restored from its snapshot, what it left moved aside), and said
// of; the returned words are added to the apply's error. Then the
// modules held are released: each starts, at its new version or again
// at its old one.
func (u *upgrading) finish(applied bool) string {
	if u == nil {
		return ""
	}
	r := u.r
	var said string
	ups := r.ups
	ups.Prepared, ups.Notes = slices.Clone(ups.Prepared), slices.Clone(ups.Notes)
	was, _ := json.Marshal(r.ups)
	note := func(module, version, detail string) {
		ups.Notes = slices.DeleteFunc(ups.Notes, func(n dataNote) bool { return n.Module == module })
		if detail != "" {
			ups.Notes = append(ups.Notes, dataNote{Module: module, Version: version, Detail: detail})
		}
	}
	forget := func(module string) {
		ups.Prepared = slices.DeleteFunc(ups.Prepared, func(p preparedUpgrade) bool { return p.Module == module })
	}
	if applied {
		for _, mv := range u.moves {
			forget(mv.m.Module)
			switch mv.kind {
			case movePlain:
				note(mv.m.Module, "", "")
			case moveDown:
				note(mv.m.Module, mv.m.Version, fmt.Sprintf("data left as it was (no prepare of %s had run)", mv.old.Version))
			case moveBack:
				note(mv.m.Module, mv.m.Version, backDetail(mv, u.back))
			}
		}
		for _, p := range u.prepared {
			ups.Prepared = append(ups.Prepared, p.rec)
			note(p.mv.m.Module, p.mv.m.Version, preparedDetail(p))
		}
		// A module no longer declared has no way back, nor a word said.
		declared := map[string]bool{}
		for _, run := range r.last.Runs {
			declared[run.Module] = true
		}
		ups.Prepared = slices.DeleteFunc(ups.Prepared, func(p preparedUpgrade) bool { return !declared[p.Module] })
		ups.Notes = slices.DeleteFunc(ups.Notes, func(n dataNote) bool { return !declared[n.Module] })
	} else {
		for i := len(u.prepared) - 1; i >= 0; i-- {
			p := u.prepared[i]
			detail, words := u.undo(p)
			if detail != "" {
				note(p.mv.m.Module, p.mv.old.Version, detail)
			}
			said += words
		}
	}
	for _, g := range u.back {
		g.f.drop(r)
	}
	if now, _ := json.Marshal(ups); !bytes.Equal(now, was) {
		if err := saveJSON(r.State.Dir, fileUpgrades, ups); err != nil {
			r.warnf("remember the upgrades: %v", err)
		}
		r.ups = ups
	}
	// Said before the modules start again: the first state reported
	// of each says it.
	for _, mv := range u.moves {
		version, detail := "", ""
		for _, n := range ups.Notes {
			if n.Module == mv.m.Module {
				version, detail = n.Version, n.Detail
			}
		}
		r.sup.Note(mv.m.Module, version, detail)
	}
	for _, release := range u.held {
		release()
	}
	for _, keys := range u.claimed {
		r.bk.free(keys...)
	}
	return said
}

// preparedDetail is what the host says of a module's data once its
// prepare ran.
func preparedDetail(p *preparing) string {
	var snaps []string
	for _, s := range p.sets {
		if s.snap != "" {
			snaps = append(snaps, s.ds.Name+" "+s.short)
		}
	}
	detail := fmt.Sprintf("prepare of %s ran", p.mv.m.Version)
	if len(snaps) > 0 {
		detail += "; snapshotted first: " + strings.Join(snaps, ", ")
	}
	if len(p.notes) > 0 {
		detail += "; " + strings.Join(p.notes, "; ")
	}
	return detail
}

// backDetail is what the host says of a module's data once it went back.
func backDetail(mv move, back []*goingBack) string {
	var restored []string
	short := ""
	for _, g := range back {
		if g.mv.m.Module == mv.m.Module {
			short = protocol.ShortSnapshot(g.sn.Snapshot)
			restored = append(restored, g.sn.Data+" "+short)
		}
	}
	ran := fmt.Sprintf(" (prepare of %s had run)", mv.old.Version)
	var detail string
	switch {
	case len(restored) == 0:
		return "data left as it is: no snapshot was taken before prepare of " + mv.old.Version + " ran"
	case len(restored) == 1 && len(mv.back.Unsnapshotted) == 0:
		detail = "data restored from the pre-upgrade snapshot " + short + ran
	default:
		detail = "data restored from the pre-upgrade snapshots " + strings.Join(restored, ", ") + ran
	}
	for _, un := range mv.back.Unsnapshotted {
		name, _, _ := strings.Cut(un, ":")
		detail += "; " + name + " left as it is (no snapshot)"
	}
	return detail
}

// undo undoes a module's forward upgrade that did not go through: each
// data set its prepare changed is restored from the snapshot taken before
// (what it left moved aside and kept, and reported), and the old version
// runs again once released. It returns what the host says of the module's
// data, and the words added to the apply's error.
func (u *upgrading) undo(p *preparing) (detail, words string) {
	r, mv := u.r, p.mv
	module, to := mv.m.Module, mv.m.Version
	cause := "the upgrade to " + to + " failed"
	if p.failed {
		cause = "prepare of " + to + " failed"
	}
	if !p.ran {
		return "", fmt.Sprintf("; %s %s runs again, its data untouched", module, mv.old.Version)
	}
	rt := root{dir: r.Root}
	var restored, kept, left, unchanged []string
	for _, s := range p.sets {
		now, err := rt.digest(s.rel)
		if err != nil {
			now = "unreadable: " + err.Error()
		}
		switch {
		case now == s.before:
			unchanged = append(unchanged, s.ds.Name)
			continue
		case s.snap == "":
			left = append(left, s.ds.Name+" changed and had no snapshot: left as prepare left it")
			continue
		}
		ask := protocol.RestoreAsk{ID: outcomeID("upgrade"), Module: module, Data: s.ds.Name, Snapshot: s.snap, From: r.State.Node}
		out := protocol.BackupOutcome{ID: ask.ID, Kind: protocol.KindRestore, Module: module, Data: s.ds.Name,
			Reason: fmt.Sprintf("%s: %s restored as it was before it", cause, s.ds.Name)}
		start := time.Now()
		err = u.restoreSet(ask, s, &out)
		r.outcome(u.nc, &out, start, err)
		if err != nil {
			left = append(left, fmt.Sprintf("%s changed; restoring it from the pre-upgrade snapshot %s failed: %s (restore it with 'mesh-controller data restore %s/%s/%s --snapshot %s --why ...')",
				s.ds.Name, s.short, oneLine(err.Error()), r.State.Node, module, s.ds.Name, s.short))
			continue
		}
		restored = append(restored, s.ds.Name+" "+s.short)
		if out.Aside != "" {
			kept = append(kept, out.Aside)
		}
	}
	var parts []string
	switch {
	case len(restored) == 1 && len(p.sets) == 1:
		_, short, _ := strings.Cut(restored[0], " ")
		parts = append(parts, "data restored from the pre-upgrade snapshot "+short)
	case len(restored) > 0:
		parts = append(parts, "data restored from the pre-upgrade snapshots "+strings.Join(restored, ", "))
	}
	parts = append(parts, left...)
	if len(restored) == 0 && len(left) == 0 {
		parts = append(parts, "data left as it was (prepare changed none of it)")
	} else if len(unchanged) > 0 {
		parts = append(parts, strings.Join(unchanged, ", ")+" unchanged")
	}
	detail = cause + "; " + strings.Join(parts, "; ")
	words = fmt.Sprintf("; %s %s runs again: %s", module, mv.old.Version, strings.Join(parts, "; "))
	if len(kept) > 0 {
		words += " (what prepare left is kept at " + strings.Join(kept, ", ") + ")"
	}
	return detail, words
}

// restoreSet restores a data set from the snapshot taken before its
// module's prepare, the module held stopped already.
func (u *upgrading) restoreSet(ask protocol.RestoreAsk, s upgradeSet, out *protocol.BackupOutcome) error {
	if s.b == nil {
		return errors.New("the data set is no longer backed up here")
	}
	f, err := u.r.fetch(u.r.ctx, ask, s.ds, s.b.Repository, s.b.Access, out)
	if err != nil {
		return err
	}
	defer f.drop(u.r)
	return u.r.swapIn(f, out)
}

// runPart is a declared module's part of a declaration as its run is
// judged by (runRecords' digest): without what does not change how it
// runs, so that a roll-out's mark (without_snapshot), set or dropped,
// restarts nothing.
func runPart(raw json.RawMessage) []byte {
	if !bytes.Contains(raw, []byte(`"without_snapshot"`)) {
		return raw
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return raw
	}
	delete(m, "without_snapshot")
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if enc.Encode(m) != nil {
		return raw
	}
	return bytes.TrimRight(b.Bytes(), "\n")
}
