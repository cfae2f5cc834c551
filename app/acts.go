package app

import (
	"context"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"time"

	"mesh-controller/contexts/inventory"
	"mesh-controller/contexts/licences"
)

// An act (assign, unassign, pin, unpin, seat handover, upgrade, converge,
// node remove, cleanup delete, …) goes through one pipeline, in this order:
//
//  1. judged: a snapshot of the inventory is read (its act revision R with
//     it) and the act's rules are judged on it, in memory, writing nothing;
//  2. under way: the act is said to be under way (BeginAct), so that a
//     serving controller's catch-up leaves its nodes to it;
//  3. committed: the inventory's change is written in one transaction whose
//     first write moves the revision from R: if another act committed since
//     R the transaction is refused (inventory.ErrActConflict) and the act is
//     judged again from 1 (retryAct), so the outcome of acts run at once is
//     that of one after the other, from any number of processes, on SQLite
//     (the write lock) and PostgreSQL (the row lock) alike. This is the
//     commit point: before it nothing is done, after it the act is done;
//  4. the other stores: what follows from the act in the licences,
//     identity, secrets and health stores, each in one transaction of its
//     own (licences of unassigned modules forgotten, removed nodes' broker
//     users revoked, secrets the mesh makes made and sealed);
//  5. declared: the nodes whose plans the act moved are sent their
//     declarations, and the act ends (EndAct).
//
// A process killed between 3 and 5 (the fault points act:after-inventory,
// act:after-others, act:after-secrets) leaves the act done in the inventory:
// serve's catch-up finishes it, making what was not made (ensureMade),
// forgetting what the other stores still hold for what the inventory no
// longer has (finishActs) and declaring the nodes behind their plan. Killed
// before 3 (act:before-inventory) nothing is done.

// commitAct is commitActProgress with no one told the progress.
func (c uses) commitAct(ctx context.Context, st *Stores, after *inventory.Snapshot, ch inventory.Change, act string) ([]Pushed, error) {
	return c.commitActProgress(ctx, st, after, ch, act, nil)
}

// commitActProgress is commitActWith with no other store to write.
func (c uses) commitActProgress(ctx context.Context, st *Stores, after *inventory.Snapshot, ch inventory.Change, act string,
	progress func(stage string, done, total int)) ([]Pushed, error) {
	return c.commitActWith(ctx, st, after, ch, act, progress, nil)
}

// commitActWith runs steps 2 to 5 of an act judged on a snapshot (after is
// the mesh as it will be, ch.Based the revision it was judged on, or
// after's): the change committed in one inventory transaction, then others
// (the other stores; nil: none), then the secrets the mesh as it will be
// needs, then the declarations of the nodes the change moves, progress told
// how far they are (nil: nobody).
func (c uses) commitActWith(ctx context.Context, st *Stores, after *inventory.Snapshot, ch inventory.Change, act string,
	progress func(stage string, done, total int), others func(context.Context) error) ([]Pushed, error) {
	if actJudged != nil {
		actJudged(act)
	}
	fault(act + ":before-inventory")
	under, err := st.Inventory.BeginAct(ctx, act, c.Now().Add(actUnderWayFor))
	if err != nil {
		return nil, err
	}
	defer st.Inventory.EndAct(context.WithoutCancel(ctx), under, c.Now())
	if ch.Based == 0 {
		ch.Based = after.Revision // judged on it: refused if another act committed since
	}
	if err := st.Inventory.Apply(ctx, ch, c.Now()); err != nil {
		return nil, err
	}
	fault(act + ":after-inventory")
	if others != nil {
		if err := others(ctx); err != nil {
			return nil, fmt.Errorf("%s is done in the inventory, not yet in the other stores (serve finishes it): %w", act, err)
		}
		fault(act + ":after-others")
	}
	if _, err := c.ensureMade(ctx, st, after, ch.Bump); err != nil {
		return nil, err
	}
	fault(act + ":after-secrets")
	if len(ch.Bump) == 0 {
		return nil, nil
	}
	snap, err := st.Inventory.Snapshot(ctx)
	if err != nil {
		return nil, err
	}
	d, err := c.newDeclarer(ctx, st)
	if err != nil {
		return nil, err
	}
	d.progress = progress
	return d.declareVia(ctx, c, st, snap, ch.Bump), nil
}

// actJudged, when a test sets it, is called once an act is judged and
// before it commits: two acts held there are judged on one snapshot.
var actJudged func(act string)

// actTries bounds how often an act is judged again when another committed
// between its snapshot and its commit.
const actTries = 20

// retryAct runs an act (read a snapshot, judge, commit with Change.Based)
// again while another act committed in between (inventory.ErrActConflict):
// the acts' outcome is then one of them after the other, whatever their
// timing, on SQLite and PostgreSQL alike.
func retryAct[T any](ctx context.Context, act func() (T, error)) (T, error) {
	for try := 1; ; try++ {
		out, err := act()
		if !errors.Is(err, inventory.ErrActConflict) {
			return out, err
		}
		if try == actTries || ctx.Err() != nil {
			return out, fmt.Errorf("%w, %d times: run it again", err, try)
		}
		// A pause growing with the tries, jittered: acts that met once do
		// not meet again in step.
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(try) * time.Duration(1+mathrand.IntN(20)) * time.Millisecond):
		}
	}
}

// finishActs does what an act killed after its commit point left undone in
// the other stores (step 4): the licences held by modules no longer
// assigned are forgotten, and the broker users, host keys and join tokens
// of nodes the inventory no longer has are dropped. Serve asks it at start
// and once a minute (daemon.CatchUpAsk.Finish), not for each join: it reads
// every host and licence holder. It leaves alone an act under way, whose
// own step 4 may be running.
func (c uses) finishActs(ctx context.Context, st *Stores, snap *inventory.Snapshot) error {
	if busy, err := c.actUnderWay(ctx, st); err != nil || busy {
		return err
	}
	assigned := make(map[string]bool, len(snap.Assignments))
	for _, a := range snap.Assignments {
		assigned[a.Node+"/"+a.Module] = true
	}
	held, err := st.Licences.AllHolders(ctx)
	if err != nil {
		return err
	}
	var gone []licences.Holder
	for _, h := range held {
		if !assigned[h.String()] {
			gone = append(gone, h)
		}
	}
	if len(gone) > 0 {
		if _, err := st.Licences.Forget(ctx, gone, c.Now()); err != nil {
			return err
		}
	}
	known, err := st.Identity.KnownNodes(ctx)
	if err != nil {
		return err
	}
	var removed []string
	for _, n := range known {
		if _, ok := snap.Nodes[n]; !ok {
			removed = append(removed, n)
		}
	}
	if len(removed) == 0 {
		return nil
	}
	f, err := st.Identity.ForgetNodes(ctx, removed, c.Now())
	if err != nil {
		return err
	}
	if f.Revoked > 0 {
		c.announceRevoked(ctx, st)
	}
	return nil
}
