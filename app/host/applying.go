package host

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"mesh-controller/app/protocol"
)

// Declarations are applied by one worker, beside Run's loop, so that the
// host keeps beating while an apply fetches a 4 GiB archive for minutes
// (the controller calls a node silent after three missed beats). One
// applies at a time; those that arrive meanwhile wait, in order, except
// that a declaration supersedes every older one waiting: each declaration
// is the node's whole state, so one that a newer one overtook before it
// was begun is never applied (nor reported: the newer one's report says
// where the node stands). What would be refused (a replayed serial, a bad
// signature) waits its turn and is refused and reported as ever.

// maxWaiting bounds the deliveries waiting for the worker; past it the
// oldest is let go (a controller sends again what a host is behind on).
const maxWaiting = 16

// applyWork is what waits for the worker and what it applies.
type applyWork struct {
	mu sync.Mutex
	// waiting are the deliveries to apply next, in the order they came.
	waiting []delivery
	// now is the declaration being applied; nil between applies.
	now *protocol.Applying
	// wake tells the worker a delivery waits.
	wake chan struct{}
}

// offer has dl wait for the worker, after those waiting, and returns the
// serial it verifies as (0 if it does not): the ones it supersedes
// (verified, of a serial below its own) no longer wait, and are returned,
// as is the one let go past maxWaiting.
func (w *applyWork) offer(st *State, dl delivery) (serial int64, superseded []delivery, letGo *delivery) {
	dl.serial = 0
	if d, err := st.Verify(dl.env); err == nil && d.Node == st.Node {
		dl.serial = d.Serial
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	kept := w.waiting[:0]
	for _, old := range w.waiting {
		if old.serial > 0 && old.serial < dl.serial {
			superseded = append(superseded, old)
		} else {
			kept = append(kept, old)
		}
	}
	w.waiting = append(kept, dl)
	if len(w.waiting) > maxWaiting {
		first := w.waiting[0]
		letGo, w.waiting = &first, slices.Delete(w.waiting, 0, 1)
	}
	select {
	case w.wake <- struct{}{}:
	default:
	}
	return dl.serial, superseded, letGo
}

// next takes the first delivery waiting, if any.
func (w *applyWork) next() (delivery, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.waiting) == 0 {
		return delivery{}, false
	}
	dl := w.waiting[0]
	w.waiting = slices.Delete(w.waiting, 0, 1)
	return dl, true
}

// begin says declaration serial is being applied, from now.
func (w *applyWork) begin(serial int64) {
	w.mu.Lock()
	w.now = &protocol.Applying{Serial: serial, Since: time.Now().UTC()}
	w.mu.Unlock()
}

// in says the apply under way is in phase.
func (w *applyWork) in(phase string) {
	w.mu.Lock()
	if w.now != nil {
		w.now.Phase = phase
	}
	w.mu.Unlock()
}

// end says the apply under way ended.
func (w *applyWork) end() {
	w.mu.Lock()
	w.now = nil
	w.mu.Unlock()
}

// applying is what a beat says of the apply under way: nil if none.
func (w *applyWork) applying() *protocol.Applying {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.now == nil {
		return nil
	}
	a := *w.now
	return &a
}

// offer hands a delivery to the worker, saying which ones it let go.
func (r *Runner) offer(dl delivery) {
	serial, superseded, letGo := r.applies.offer(r.State, dl)
	if r.logger().Enabled(r.ctx, slog.LevelDebug) {
		r.logger().Debug("declaration received", "serial", serial, "asked", dl.asked, "verified", serial > 0)
	}
	for _, old := range superseded {
		r.logf("declaration %d superseded by %d before it was applied", old.serial, serial)
	}
	if letGo != nil {
		r.logf("declaration %d let go: %d wait to be applied already", letGo.serial, maxWaiting)
	}
}

// applyLoop is the worker: it applies what waits, one at a time, in
// order, until ctx ends.
func (r *Runner) applyLoop(ctx context.Context, nc *nats.Conn) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.applies.wake:
		}
		for ctx.Err() == nil {
			dl, ok := r.applies.next()
			if !ok {
				break
			}
			r.applyOne(nc, dl)
		}
	}
}

// applyOne applies one delivery and reports the outcome: unless it is
// stale (stale) or carries the runs an older host did not keep
// (adoptRuns), it is applied (apply, its phases said by the beats),
// committed (commit) and reported (report).
func (r *Runner) applyOne(nc *nats.Conn, dl delivery) {
	// Signed by a key the host does not know: it follows the controller's
	// chain to it first, or refuses the declaration and says why.
	if why, later := r.followKeys(r.ctx, nc, dl.env); why != "" || later {
		if why != "" {
			r.report(nc, protocol.AppliedBody{Error: why})
		}
		return
	}
	r.mu.Lock()
	if r.adoptRuns(dl) {
		r.mu.Unlock()
		return
	}
	if why := stale(r.State, r.last, dl); why != "" {
		r.mu.Unlock()
		r.logf("%s", why)
		// The controller hears the applied serial with the next beat, sent
		// soon: whoever re-sent it thought this host behind.
		r.beatAgain()
		return
	}
	// Only this worker changes r.last: what it starts from stays what it
	// is while the lock is let go for the apply itself.
	last := r.last
	filter, serial, refused := declaredFilter(r.State, last.Serial, dl.env)
	r.mu.Unlock()

	var report protocol.AppliedBody
	next := last
	if refused != "" {
		report = protocol.AppliedBody{Serial: serial, Error: refused}
	} else {
		// Heard at once, and in every beat until it ends.
		r.applies.begin(dl.serial)
		r.beatAgain()
		job := &applyJob{st: r.State, r: root{dir: r.Root}, last: last, env: dl.env, ids: r.userIDs(), fetch: r.fetcher(nc), phase: r.applies.in,
			up: r.upgrading(nc)}
		job.upgrade = func(h protocol.DeclaredHost) error {
			if why := r.refusedRelease(h); why != "" {
				return errors.New(why)
			}
			return r.upgradeSelf(nc, dl.serial, h, job.fetch)
		}
		report, next = job.run()
		if report.OK {
			// A module going back has its data swapped in last.
			if err := job.up.commit(); err != nil {
				report.OK, report.Error = false, err.Error()
			}
		}
		remembered := report.OK && r.commit(nc, filter, next, &report)
		// The modules held start again: at their new version, or at
		// their old one on their data as it was.
		if said := job.up.finish(remembered); !report.OK {
			report.Error += said
		}
	}
	if report.OK {
		if d, err := dl.env.Verify(r.State.ControllerKey); err == nil {
			r.upgraded(d)
		}
	}
	r.applies.end()
	r.beatAgain()
	if r.ctx.Err() != nil {
		// The host stops: the controller is asked for the latest again
		// when it is back.
		r.logf("stopped while applying declaration %d: %s", report.Serial, orOK(report))
		return
	}
	r.report(nc, report)
}

// commit makes an applied declaration the host's: remembered, its modules
// started, its overlay and filter set. What fails of it makes report a
// failed apply; remembered says the declaration is the host's all the
// same (its modules given to the supervisor).
func (r *Runner) commit(nc *nats.Conn, filter *protocol.DeclaredFilter, next applied, report *protocol.AppliedBody) (remembered bool) {
	r.mu.Lock()
	filterWas := r.filter
	ovWas := r.ov.fact
	if err := saveApplied(r.State.Dir, next); err != nil {
		report.OK, report.Error = false, "remember what was applied: "+err.Error()
	} else {
		remembered = true
		r.last = next
		// The files are applied: the modules follow. One that cannot
		// start is reported in its state, not as a failed apply.
		r.sup.Apply(specs(r.State, r.Root, next.Runs))
		// Then the overlay: a peer's module may need it, not the
		// other way round. Last, the filter: the declaration's files
		// and modules are in place whatever becomes of it.
		if err := r.setOverlay(next.Overlay, next.Serial); err != nil {
			report.OK, report.Error = false, err.Error()
		}
		if err := r.setFilter(nc, filter, next.Serial); err != nil && report.OK {
			report.OK, report.Error = false, err.Error()
		}
	}
	filterMoved := r.filter != filterWas || r.ov.fact != ovWas
	r.mu.Unlock()
	if filterMoved {
		r.reportFacts(nc, true)
	}
	return remembered
}

// report logs an apply's outcome, sends it with the modules' states, and
// after a good apply the data sets it leaves.
func (r *Runner) report(nc *nats.Conn, report protocol.AppliedBody) {
	report.Modules, report.StatesAt = r.states(), time.Now().UTC()
	r.metrics.applied(report)
	r.mu.Lock()
	switch {
	case report.OK:
		r.failed = 0
	case report.Serial > r.last.Serial:
		r.failed = report.Serial
	}
	r.mu.Unlock()
	if report.OK {
		r.logger().Info("applied declaration", "serial", report.Serial, "duration_ms", report.TotalMS, "modules", len(report.Modules))
		for _, w := range report.Waiting {
			r.logf("not started: %s", w)
		}
	} else {
		r.logger().Warn("did not apply: "+report.Error, "serial", report.Serial)
	}
	b, err := protocol.Sign(r.State.HostKey, report)
	if err != nil {
		return
	}
	var reply protocol.OKReply
	if m, err := nc.Request(protocol.NodeSubject(r.State.Node, protocol.Applied), b, protocol.AnswerTimeout); err != nil {
		r.warnf("report the outcome: %v", err)
	} else if json.Unmarshal(m.Data, &reply) == nil && reply.Error != "" {
		r.warnf("report the outcome: not recorded: %s", reply.Error)
	}
	if report.OK {
		r.mu.Lock()
		last := r.last
		r.mu.Unlock()
		r.publish(nc, protocol.DataReport, dataReport(r.Root, last))
	}
}

// orOK is a report's error, or "applied".
func orOK(report protocol.AppliedBody) string {
	if report.OK {
		return "applied"
	}
	return report.Error
}
