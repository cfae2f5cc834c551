package host

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/sys/unix"

	"mesh-controller/app/process"
	"mesh-controller/app/protocol"
	"mesh-controller/app/restic"
)

// Backups and restores of this node's own data sets (issue 29). The
// controller asks on the host's inbox (mesh.node.N.inbox.backup and
// .restore); the host answers at once whether it takes the ask, does the
// work in a worker of its own (never on the loop's goroutine: a beat is
// never late for a backup), and reports the outcome, signed, on
// mesh.node.N.backed-up. restic does the work, against the node's own
// repository on the backup seat's holder, through its REST server: the
// host opens its sealed access for each backup, gives it to restic in
// restic's environment, and never writes, logs or keeps it open.

const (
	// MaxBackupAsk bounds an ask as the host reads it.
	MaxBackupAsk = 64 << 10
	// BackupsAtOnce bounds the backups and restores a host runs at once;
	// one taken past it waits for its turn.
	BackupsAtOnce = 3
	// DefaultBeforeTimeout bounds a backup's before hook.
	DefaultBeforeTimeout = time.Hour
	// backupWithin bounds one backup or restore, restic and all.
	backupWithin = 24 * time.Hour
	// outcomeWithin is how long an outcome is sent again while the
	// controller does not answer it (it may be starting again).
	outcomeWithin = time.Minute
	// maxHookOutput bounds what the host keeps of a hook's output.
	maxHookOutput = 64 << 10
	// maxAskID bounds an ask's id.
	maxAskID = 128
)

// backupWork is what runs of backups and restores: one per data set at a
// time, one restore per module, BackupsAtOnce in all.
type backupWork struct {
	mu sync.Mutex
	// busy is what runs, by "module/data" (a backup or a restore) and by
	// "module" (a restore, which stops the module).
	busy map[string]string
	// held says none is taken: the host upgrades itself.
	held  bool
	slots chan struct{}
	wg    sync.WaitGroup
}

// claim marks keys busy with what, or says what runs on one of them.
func (w *backupWork) claim(what string, keys ...string) (string, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.busy == nil {
		w.busy = map[string]string{}
		w.slots = make(chan struct{}, BackupsAtOnce)
	}
	if w.held {
		return "the host's own upgrade", false
	}
	for _, k := range keys {
		if running, ok := w.busy[k]; ok {
			return running, false
		}
	}
	for _, k := range keys {
		w.busy[k] = what
	}
	return "", true
}

// hold takes no more backup or restore, and waits up to d for those
// running to end: it says what still runs ("" once none does).
func (w *backupWork) hold(d time.Duration) string {
	w.mu.Lock()
	w.held = true
	w.mu.Unlock()
	deadline := time.Now().Add(d)
	for {
		w.mu.Lock()
		var running []string
		for k, what := range w.busy {
			if strings.Contains(k, "/") {
				running = append(running, "a "+what+" of "+k)
			}
		}
		w.mu.Unlock()
		if len(running) == 0 {
			return ""
		}
		if time.Now().After(deadline) {
			sort.Strings(running)
			return strings.Join(running, ", ")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// unhold takes backups and restores again.
func (w *backupWork) unhold() {
	w.mu.Lock()
	w.held = false
	w.mu.Unlock()
}

// free unmarks keys.
func (w *backupWork) free(keys ...string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, k := range keys {
		delete(w.busy, k)
	}
}

// turn waits for a slot, or for ctx; the slot is given back by the func.
func (w *backupWork) turn(ctx context.Context) (func(), error) {
	w.mu.Lock()
	slots := w.slots
	w.mu.Unlock()
	select {
	case slots <- struct{}{}:
		return func() { <-slots }, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// subscribeBackups answers the controller's backup and restore asks.
func (r *Runner) subscribeBackups(nc *nats.Conn) error {
	if _, err := nc.Subscribe(protocol.NodeSubject(r.State.Node, "inbox."+protocol.BackupAskName), func(m *nats.Msg) {
		r.answerBackup(nc, m)
	}); err != nil {
		return err
	}
	_, err := nc.Subscribe(protocol.NodeSubject(r.State.Node, "inbox."+protocol.RestoreAskName), func(m *nats.Msg) {
		r.answerRestore(nc, m)
	})
	return err
}

// readAsk decodes an ask naming a module's data set into v, whose id,
// module and data are given, and returns "module/data"; an ask it cannot
// take is answered, and "" returned.
func (r *Runner) readAsk(m *nats.Msg, v any, id, module, data *string) string {
	why := ""
	switch {
	case len(m.Data) > MaxBackupAsk:
		why = "the ask is too large"
	case json.Unmarshal(m.Data, v) != nil:
		why = "the ask is not JSON"
	case *id == "" || len(*id) > maxAskID || strings.ContainsFunc(*id, func(c rune) bool { return c < ' ' || c == 0x7f }):
		why = "the ask has no id, or one too long"
	case !protocol.ValidName(*module) || !protocol.ValidName(*data):
		why = "the ask names no valid module and data set"
	default:
		return *module + "/" + *data
	}
	r.taken(m, false, why)
	return ""
}

// taken answers an ask, signed with the host key like every host message.
func (r *Runner) taken(m *nats.Msg, taken bool, why string) {
	if m.Reply == "" {
		return
	}
	b, err := protocol.Sign(r.State.HostKey, protocol.BackupTaken{Taken: taken, Why: why})
	if err == nil {
		err = m.Respond(b)
	}
	if err != nil {
		r.warnf("answer an ask: %v", err)
	}
}

// declaredBackup is the latest applied declaration's backup of a data set.
func (r *Runner) declaredBackup(module, data string) (protocol.DeclaredBackup, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range r.last.Backups {
		if b.Module == module && b.Data == data {
			return b, true
		}
	}
	return protocol.DeclaredBackup{}, false
}

// declaredData is a data set of the latest applied declaration (or one
// no longer declared, whose data the host keeps), by module and name.
func (r *Runner) declaredData(module, data string) (dataSet, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ds := range r.last.Data {
		if ds.Module == module && ds.Name == data {
			return ds, true
		}
	}
	return dataSet{}, false
}

// answerBackup takes or refuses a BackupAsk at once and runs a taken one
// in a worker.
func (r *Runner) answerBackup(nc *nats.Conn, m *nats.Msg) {
	var ask protocol.BackupAsk
	set := r.readAsk(m, &ask, &ask.ID, &ask.Module, &ask.Data)
	if set == "" {
		return
	}
	b, ok := r.declaredBackup(ask.Module, ask.Data)
	switch {
	case !ok:
		r.taken(m, false, fmt.Sprintf("%s declares no backup of %s", r.State.Node, set))
		return
	case b.Access == "":
		r.taken(m, false, fmt.Sprintf("%s has no access to its backup repository yet: the backup seat's holder has not issued it", r.State.Node))
		return
	}
	out := protocol.BackupOutcome{ID: ask.ID, Kind: protocol.KindBackup, Module: ask.Module, Data: ask.Data}
	r.take(nc, m, out, []string{set}, func(ctx context.Context, out *protocol.BackupOutcome) error { return r.backup(ctx, b, out) })
}

// take takes an ask when restic is here and nothing runs on its busy keys
// (its data set's, and its module's for a restore): it answers at once,
// and does the work in a worker of its own.
func (r *Runner) take(nc *nats.Conn, m *nats.Msg, out protocol.BackupOutcome, busy []string, do func(context.Context, *protocol.BackupOutcome) error) {
	if _, err := exec.LookPath("restic"); err != nil {
		r.taken(m, false, restic.ErrNotInstalled.Error())
		return
	}
	if running, ok := r.bk.claim(out.Kind, busy...); !ok {
		r.taken(m, false, fmt.Sprintf("a %s of %s/%s runs already on %s", running, out.Module, out.Data, r.State.Node))
		return
	}
	r.taken(m, true, "")
	r.bk.wg.Add(1)
	go func() {
		defer r.bk.wg.Done()
		r.work(nc, &out, busy, func(ctx context.Context) error { return do(ctx, &out) })
	}()
}

// work runs one backup or restore in its turn, bounded, frees what it
// claimed (busy keys), and reports its outcome: once it is heard, the
// next may be asked.
func (r *Runner) work(nc *nats.Conn, out *protocol.BackupOutcome, busy []string, do func(ctx context.Context) error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(r.ctx, backupWithin)
	defer cancel()
	done, err := r.bk.turn(ctx)
	if err == nil {
		err = do(ctx)
		done()
	}
	out.OK = err == nil
	if err != nil {
		out.Why = oneLine(err.Error())
	}
	r.bk.free(busy...)
	out.DurationMS = float64(time.Since(start).Microseconds()) / 1000
	out.At = time.Now().UTC()
	r.metrics.backedUp(out.Kind, out.OK)
	if out.OK {
		r.logf("%s %s of %s/%s: snapshot %s, %d files, %d bytes in %.0f ms", out.Kind, out.ID, out.Module, out.Data, out.Snapshot, out.Files, out.Bytes, out.DurationMS)
	} else {
		r.warnf("%s %s of %s/%s failed: %s", out.Kind, out.ID, out.Module, out.Data, out.Why)
	}
	r.reportOutcome(nc, *out)
}

// oneLine is s on one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// reportOutcome sends an outcome until the controller says it recorded it,
// for a minute at most (it may be starting again), or it refuses it.
func (r *Runner) reportOutcome(nc *nats.Conn, out protocol.BackupOutcome) {
	b, err := protocol.Sign(r.State.HostKey, out)
	if err != nil {
		return
	}
	deadline := time.Now().Add(outcomeWithin)
	for {
		m, err := nc.Request(protocol.NodeSubject(r.State.Node, protocol.BackedUp), b, protocol.AnswerTimeout)
		if err == nil {
			var reply protocol.OKReply
			if json.Unmarshal(m.Data, &reply) == nil && reply.OK {
				return
			}
			if reply.Error != "" {
				// Heard and refused: sending it again would change nothing.
				r.warnf("the controller refused the outcome of %s %s: %s", out.Kind, out.ID, reply.Error)
				return
			}
			err = errors.New("the answer is not OK")
		}
		if time.Now().After(deadline) || r.ctx.Err() != nil {
			r.warnf("the outcome of %s %s could not be reported: %v", out.Kind, out.ID, err)
			return
		}
		select {
		case <-r.ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// openAccess opens a sealed BackupAccess with this host's age identity.
func (r *Runner) openAccess(sealed string) (protocol.BackupAccess, error) {
	v, _, err := protocol.OpenSealed(sealed, protocol.Label{Node: r.State.Node, Module: protocol.BackupModule, Name: protocol.BackupAccessName}, r.State.Age)
	if err != nil {
		return protocol.BackupAccess{}, fmt.Errorf("the backup access: %w", err)
	}
	defer clear(v.Reveal())
	var a protocol.BackupAccess
	if err := json.Unmarshal(v.Reveal(), &a); err != nil || a.User == "" || a.Password == "" || a.RepositoryPassword == "" {
		return protocol.BackupAccess{}, errors.New("the backup access is not a user, a password and a repository password")
	}
	return a, nil
}

// repo is the repository, as restic reaches it with the access, and this
// host's restic cache.
func (r *Runner) repo(repository string, a protocol.BackupAccess) (restic.Repo, error) {
	rest, ok := strings.CutPrefix(repository, "rest:")
	u, err := url.Parse(rest)
	if !ok || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return restic.Repo{}, fmt.Errorf("the repository %q is not rest:http://ADDRESS:PORT/NODE/", repository)
	}
	u.User = url.UserPassword(a.User, a.Password)
	return restic.Repo{Repository: "rest:" + u.String(), Password: a.RepositoryPassword, CacheDir: filepath.Join(r.State.Dir, "restic-cache")}, nil
}

// backup runs one backup: the before hook, then restic backup of the data
// set's path into the node's repository, as this node, tagged with the
// data set. First, restic unlock: it removes only stale locks (of a restic
// of this machine that is gone, a host killed midway among them, or older
// than restic's half hour), which would keep the holder from pruning and
// drilling. A lock that refuses the backup still is removed once more if
// stale, and the backup tried once again.
// More tags, if given, are added to the data set's.
func (r *Runner) backup(ctx context.Context, b protocol.DeclaredBackup, out *protocol.BackupOutcome, more ...string) error {
	rel, err := dataRel(b.Path)
	if err == nil {
		err = root{dir: r.Root}.check(rel)
	}
	if err != nil {
		return err
	}
	a, err := r.openAccess(b.Access)
	if err != nil {
		return err
	}
	repo, err := r.repo(b.Repository, a)
	if err != nil {
		return err
	}
	if len(b.Before) > 0 {
		if err := r.before(ctx, b); err != nil {
			return err
		}
	}
	if err := repo.Unlock(ctx); err != nil {
		return err
	}
	full := filepath.Join(r.Root, filepath.FromSlash(rel))
	tags := append([]string{protocol.BackupTag(b.Module, b.Data)}, more...)
	sum, err := repo.Backup(ctx, full, r.State.Node, tags...)
	if errors.Is(err, restic.ErrLocked) {
		r.warnf("backup %s of %s/%s: %v; removing stale locks and trying again", out.ID, b.Module, b.Data, err)
		if uerr := repo.Unlock(ctx); uerr != nil {
			return fmt.Errorf("%w; unlock: %v", err, uerr)
		}
		sum, err = repo.Backup(ctx, full, r.State.Node, tags...)
	}
	if err != nil {
		return err
	}
	out.Snapshot, out.Files, out.Bytes, out.BytesAdded = sum.SnapshotID, sum.Files, sum.Bytes, sum.DataAdded
	return nil
}

// beforeTimeout bounds a before hook.
func (r *Runner) beforeTimeout() time.Duration {
	if r.BeforeTimeout > 0 {
		return r.BeforeTimeout
	}
	return DefaultBeforeTimeout
}

// before runs a backup's before hook as its module runs (runHook); a
// failure is said with its last line.
func (r *Runner) before(ctx context.Context, b protocol.DeclaredBackup) error {
	r.mu.Lock()
	var rec *runRecord
	for i := range r.last.Runs {
		if r.last.Runs[i].Module == b.Module {
			rec = &r.last.Runs[i]
		}
	}
	var workDir string
	var env []string
	if rec != nil {
		workDir, env = moduleEnv(r.State, r.Root, *rec)
	}
	r.mu.Unlock()
	if rec == nil {
		return fmt.Errorf("the before hook: module %s is not declared on %s", b.Module, r.State.Node)
	}
	started, err := r.runHook(ctx, moduleHook{module: b.Module, argv: b.Before, dir: workDir, env: env, timeout: r.beforeTimeout(),
		what: "backup of " + b.Data + ": before hook"})
	switch {
	case err == nil:
		return nil
	case !started:
		return fmt.Errorf("the before hook: %w", err)
	}
	return fmt.Errorf("the before hook %s failed: %w", b.Before[0], err)
}

// moduleHook is a command the host runs as its module runs: what a
// backup's before hook and a version's prepare are.
type moduleHook struct {
	module string
	argv   []string
	// dir is where it runs (argv[0] relative to it, when it has a '/'),
	// env its whole environment.
	dir string
	env []string
	// timeout bounds it; what names it in the module's log.
	timeout time.Duration
	what    string
}

// runHook runs h as its module runs: as its user, in a process group of
// its own that is ended with it (or at its timeout, or with ctx). Its
// output goes to the module's log; its error says why it failed, with the
// last line it wrote; started says it ran at all.
func (r *Runner) runHook(ctx context.Context, h moduleHook) (started bool, err error) {
	prog, err := resolveCommand(h.dir, h.argv[0])
	if err != nil {
		return false, err
	}
	home := filepath.Join(r.Root, filepath.FromSlash(path.Join(protocol.ModulesDir, h.module)))
	cred, err := r.sup.credential(ModuleSpec{Module: h.module, Dir: home})
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	var output bytes.Buffer
	lg := r.sup.logFor(h.module)
	lg.note("%s %s", h.what, strings.Join(h.argv, " "))
	w := &limited{w: &output, left: maxHookOutput, tee: lg}
	cmd := &exec.Cmd{Path: prog, Args: h.argv, Env: h.env, Dir: h.dir, Stdout: w, Stderr: w, SysProcAttr: childAttr(cred), WaitDelay: 5 * time.Second}
	if err := process.Start(cmd); err != nil {
		return false, startError(h.argv[0], err)
	}
	pid := cmd.Process.Pid
	stopped := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			unix.Kill(-pid, unix.SIGKILL)
		case <-stopped:
		}
	}()
	err = cmd.Wait()
	close(stopped)
	unix.Kill(-pid, unix.SIGKILL) // what it left running goes with it
	if err == nil {
		lg.note("%s done", h.what)
		return true, nil
	}
	why := err.Error()
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		why = "stopped after " + h.timeout.String()
	}
	lg.note("%s failed: %s", h.what, why)
	if last := lastLine(output.String()); last != "" {
		why += ": " + last
	}
	return true, errors.New(why)
}

// lastLine is the last line of s with something on it.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// limited keeps at most left bytes of what is written to it, and passes
// all of it to tee.
type limited struct {
	w    *bytes.Buffer
	left int
	tee  *moduleLog
}

func (l *limited) Write(p []byte) (int, error) {
	if l.left > 0 {
		k := min(l.left, len(p))
		l.w.Write(p[:k])
		l.left -= k
	}
	l.tee.Write(p)
	return len(p), nil
}

// answerRestore takes or refuses a RestoreAsk at once and runs a taken one
// in a worker.
func (r *Runner) answerRestore(nc *nats.Conn, m *nats.Msg) {
	var ask protocol.RestoreAsk
	set := r.readAsk(m, &ask, &ask.ID, &ask.Module, &ask.Data)
	if set == "" {
		return
	}
	ds, ok := r.declaredData(ask.Module, ask.Data)
	if !ok {
		r.taken(m, false, fmt.Sprintf("%s has no data set %s", r.State.Node, set))
		return
	}
	repository, access := ask.Repository, ask.Access
	if ask.From == "" || ask.From == r.State.Node {
		b, ok := r.declaredBackup(ask.Module, ask.Data)
		if !ok {
			r.taken(m, false, fmt.Sprintf("%s declares no backup of %s: no repository to restore it from", r.State.Node, set))
			return
		}
		repository, access = b.Repository, b.Access
	}
	if repository == "" || access == "" {
		r.taken(m, false, fmt.Sprintf("%s has no access to the repository of %s yet", r.State.Node, orSelf(ask.From, r.State.Node)))
		return
	}
	out := protocol.BackupOutcome{ID: ask.ID, Kind: protocol.KindRestore, Module: ask.Module, Data: ask.Data}
	r.take(nc, m, out, []string{set, ask.Module}, func(ctx context.Context, out *protocol.BackupOutcome) error {
		err := r.restore(ctx, ask, ds, repository, access, out)
		// The controller sees the data set's new size at once.
		r.mu.Lock()
		last := r.last
		r.mu.Unlock()
		r.publish(nc, protocol.DataReport, dataReport(r.Root, last))
		return err
	})
}

func orSelf(from, node string) string {
	if from == "" {
		return node
	}
	return from
}

// restore restores a snapshot of a data set in its place. The snapshot is
// restored (and verified) into a scratch directory beside the data set,
// while the module still runs (fetch); only then is the module stopped, the
// data set's contents moved aside (never overwritten, never deleted), the
// restored tree moved into place, and the module started again (swapIn).
// Whatever fails, what was there stays where it was, and the scratch goes.
func (r *Runner) restore(ctx context.Context, ask protocol.RestoreAsk, ds dataSet, repository, access string, out *protocol.BackupOutcome) error {
	f, err := r.fetch(ctx, ask, ds, repository, access, out)
	if err != nil {
		return err
	}
	defer f.drop(r)
	// Restored whole: now the module stops, and nothing else moves the
	// data set (an apply waits) while it is swapped.
	release, err := r.sup.Hold(ask.Module)
	if err != nil {
		return fmt.Errorf("stop %s: %w", ask.Module, err)
	}
	defer release()
	return r.swapIn(f, out)
}

// fetched is a snapshot of a data set restored, verified and settled into
// a scratch directory beside it: ready to be swapped in (swapIn), or
// dropped.
type fetched struct {
	rt       root
	rel      string // the data set, beneath the root
	scratch  string
	restored string // the snapshot's data set, inside scratch
	// id and short are the snapshot's.
	id, short string
}

// fetch restores the snapshot a restore asks for into a scratch
// directory beside the data set, in a directory no module may write in,
// verified, and settled as the module's; out says its snapshot, files
// and bytes. Nothing of the data set is touched.
func (r *Runner) fetch(ctx context.Context, ask protocol.RestoreAsk, ds dataSet, repository, access string, out *protocol.BackupOutcome) (*fetched, error) {
	rt := root{dir: r.Root}
	rel, err := dataRel(ds.Path)
	if err == nil {
		err = rt.check(rel)
	}
	if err != nil {
		return nil, err
	}
	a, err := r.openAccess(access)
	if err != nil {
		return nil, err
	}
	repo, err := r.repo(repository, a)
	if err != nil {
		return nil, err
	}
	snap, from, err := pickSnapshot(ctx, repo, ask)
	if err != nil {
		return nil, err
	}
	out.Snapshot = snap.ID
	// Beside the data set (one filesystem: the restored tree is moved,
	// not copied), in a directory no module may write in.
	beside, err := rt.hostsOwn(rel)
	if err != nil {
		return nil, err
	}
	f := &fetched{rt: rt, rel: rel, scratch: path.Join(beside, "."+path.Base(rel)+".restore-"+strings.ToLower(rand.Text()[:10])), id: snap.ID, short: snap.ShortID}
	if err := rt.mkdirNew(f.scratch); err != nil {
		return nil, fmt.Errorf("make the scratch directory: %w", err)
	}
	if err := f.fill(ctx, r, repo, from, ask.Module, ds, out); err != nil {
		f.drop(r)
		return nil, err
	}
	return f, nil
}

// fill restores the snapshot into the scratch directory and settles it.
func (f *fetched) fill(ctx context.Context, r *Runner, repo restic.Repo, from, module string, ds dataSet, out *protocol.BackupOutcome) error {
	rt := f.rt
	if err := repo.Restore(ctx, f.id, filepath.Join(r.Root, filepath.FromSlash(f.scratch))); err != nil {
		return err
	}
	f.restored = path.Join(f.scratch, strings.TrimPrefix(from, "/"))
	if exists, _, err := rt.dirState(f.restored); err != nil || !exists {
		return fmt.Errorf("snapshot %s restored no directory %s (%v)", f.short, from, err)
	}
	// The module's, as a data directory the host made is (apply), when
	// modules run as their own users: restic restores the owners of the
	// machine the snapshot was taken on.
	uid, gid := -1, -1
	if ids := r.userIDs(); ids != nil && ds.Made && givable(ds.Path) {
		var err error
		if uid, gid, err = ids(module); err != nil {
			return err
		}
	}
	if err := rt.settle(f.restored, uid, gid); err != nil {
		return fmt.Errorf("snapshot %s: %w", f.short, err)
	}
	out.Files, out.Bytes = rt.tally(f.restored)
	return nil
}

// drop removes the scratch directory, with what is left in it.
func (f *fetched) drop(r *Runner) {
	if err := f.rt.removeAll(f.scratch); err != nil {
		r.warnf("restore: remove the scratch directory %s: %v", f.scratch, err)
	}
}

// swapIn moves the data set's contents aside (out.Aside says where) and
// the restored tree into its place; its module is held stopped by the
// caller. Whatever fails, what was there is put back.
func (r *Runner) swapIn(f *fetched, out *protocol.BackupOutcome) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	rt, rel := f.rt, f.rel
	aside, err := r.moveAside(rt, rel)
	if err != nil {
		return err
	}
	if err := rt.rename(f.restored, rel); err != nil {
		if aside != "" {
			if berr := rt.rename(aside, rel); berr != nil {
				return fmt.Errorf("%w; and moving the data back from %s: %v", err, aside, berr)
			}
		}
		return err
	}
	if aside != "" {
		out.Aside = "/" + aside
	}
	return nil
}

// moveAside moves a data set's contents out of its place, to
// <path>.before-restore-<UTC time>, a name nothing has (-2, -3… added when
// one has), and returns where; an empty directory is removed, and "" said.
func (r *Runner) moveAside(rt root, rel string) (string, error) {
	exists, empty, err := rt.dirState(rel)
	switch {
	case err != nil:
		return "", err
	case !exists:
		return "", nil
	case empty:
		return "", rt.removeEmptyDir(rel)
	}
	base := rel + ".before-restore-" + time.Now().UTC().Format("20060102T150405")
	for i := 1; i <= 100; i++ {
		aside := base
		if i > 1 {
			aside = fmt.Sprintf("%s-%d", base, i)
		}
		err := rt.rename(rel, aside)
		if err == nil {
			return aside, nil
		}
		if !errors.Is(err, unix.EEXIST) && !errors.Is(err, unix.ENOTEMPTY) {
			return "", fmt.Errorf("move the data set aside: %w", err)
		}
	}
	return "", fmt.Errorf("move the data set aside: 100 names taken beside %s", base)
}

// pickSnapshot finds the snapshot a restore asks for among the data set's
// (by its tag: never another data set's), and the path in it that is the
// data set: the snapshot's own, or the one SnapshotPath names when it
// holds several.
func pickSnapshot(ctx context.Context, repo restic.Repo, ask protocol.RestoreAsk) (restic.Snapshot, string, error) {
	set := ask.Module + "/" + ask.Data
	ss, err := repo.Snapshots(ctx, protocol.BackupTag(ask.Module, ask.Data))
	if err != nil {
		return restic.Snapshot{}, "", err
	}
	if len(ss) == 0 {
		return restic.Snapshot{}, "", fmt.Errorf("the repository holds no snapshot of %s", set)
	}
	var snap *restic.Snapshot
	if ask.Snapshot == "" || ask.Snapshot == "latest" {
		snap = &ss[0]
	} else {
		for i := range ss {
			if ss[i].ID == ask.Snapshot || ss[i].ShortID == ask.Snapshot || (len(ask.Snapshot) >= 8 && strings.HasPrefix(ss[i].ID, ask.Snapshot)) {
				snap = &ss[i]
				break
			}
		}
		if snap == nil {
			return restic.Snapshot{}, "", fmt.Errorf("the repository holds no snapshot %s of %s (data snapshots lists them)", ask.Snapshot, set)
		}
	}
	var from string
	for _, p := range snap.Paths {
		if len(snap.Paths) == 1 || (ask.SnapshotPath != "" && strings.HasSuffix(p, ask.SnapshotPath)) {
			from = p
		}
	}
	if from == "" || !filepath.IsAbs(from) || filepath.Clean(from) != from {
		return restic.Snapshot{}, "", fmt.Errorf("snapshot %s holds no one path of %s (it holds %v)", snap.ShortID, set, snap.Paths)
	}
	return *snap, from, nil
}

// waitBackups waits for the backups and restores running to end (Run's
// context ended: restic is being stopped).
func (r *Runner) waitBackups() { r.bk.wg.Wait() }
