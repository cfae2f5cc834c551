package inventory

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"mesh-controller/embedded/sqlite"
)

// Change is everything one act does to the inventory, written in one
// transaction (Store.Apply): a person's act is all or nothing within this
// store, and it is the commit point of the act — what follows in other
// stores (secrets made, declarations sent) is redone by the catch-up.
type Change struct {
	// Assign records assignments (refused if one is there already).
	Assign []Assignment
	// Unassign takes these node/module assignments off; Retirements record
	// what became of their data.
	Unassign    []Holder
	Retirements []Retirement
	// Versions moves assignments to another version (clearing any pending).
	Versions []Assignment
	// Pending records versions for assignments without sending them.
	Pending []Assignment
	// Seats adds and removes holders; Replacement records a holder that
	// starts without the data the old one kept.
	Seats       []SeatChange
	Replacement *Replacement
	// Replacements are more of them: a provider's removal may move several
	// consumers' bindings at once.
	Replacements []Replacement
	// Pins sets pins (a zero Provider removes the pin).
	Pins []Pin
	// Bindings and Consumers are the bindings chosen and consumer states.
	Bindings  []Binding
	Consumers []ConsumerChange
	// HostReleases declare nodes host releases (a host roll-out's step).
	HostReleases []NodeHostRelease
	// Bump moves these nodes' plans: their declarations are then behind.
	Bump []string
	// Based is the revision of the snapshot the change was judged on
	// (Snapshot.Revision): Apply refuses it with ErrActConflict once
	// another write moved the revision, and the act is judged again. 0:
	// not judged on a snapshot (applied whatever came before).
	Based int64
}

// ErrActConflict means another act committed after the snapshot a change
// was judged on was read: judge it again on a new snapshot (RetryActs).
var ErrActConflict = sqlite.Refusal("another act changed the mesh meanwhile")

// moveRevision moves the act revision, as the first write of a
// transaction, from based (0: whatever it is): it takes the store's write
// lock (SQLite) or the row's (PostgreSQL, which checks the row again once
// a concurrent mover commits), so of two acts judged on one revision only
// the first commits.
func moveRevision(ctx context.Context, tx *sql.Tx, based int64) error {
	q, args := `UPDATE act_revision SET rev = rev + 1 WHERE id = 1`, []any{}
	if based != 0 {
		q, args = q+` AND rev = ?`, []any{based}
	}
	res, err := tx.ExecContext(ctx, q, args...)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil {
		return err
	} else if n != 1 {
		return ErrActConflict
	}
	return nil
}

// Apply writes a change in one transaction.
func (s *Store) Apply(ctx context.Context, ch Change, now time.Time) (err error) {
	defer s.db.Failing(&err, "record the change")
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		if err := moveRevision(ctx, tx, ch.Based); err != nil {
			return err
		}
		return apply(ctx, tx, ch, now)
	})
	return err
}

func apply(ctx context.Context, tx *sql.Tx, ch Change, now time.Time) error {
	// A change to every node runs each statement ten thousand times.
	stmts := sqlite.Prepared(tx)
	defer stmts.Close()
	for _, a := range ch.Assign {
		var n int
		if err := stmts.QueryRowContext(ctx, `SELECT count(*) FROM assignments WHERE node = ? AND module = ?`, a.Node, a.Module).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return fmt.Errorf("%s on %s %w", a.Module, a.Node, ErrAssigned)
		}
		unverified, _ := json.Marshal(nonNil(a.Unverified))
		var taken any // NULL: assigned plainly
		if a.Taken != nil {
			b, err := json.Marshal(a.Taken)
			if err != nil {
				return err
			}
			taken = string(b)
		}
		if _, err := stmts.ExecContext(ctx, `INSERT INTO assignments (node, module, version, assigned_at, unverified, taken) VALUES (?, ?, ?, ?, ?, ?)`,
			a.Node, a.Module, a.Version, sqlite.FormatTime(a.AssignedAt), string(unverified), taken); err != nil {
			return err
		}
		// Its data, retired or dropped when it left, is its own again; data
		// left on a removed node of the same name is not.
		if _, err := stmts.ExecContext(ctx, `UPDATE retirements SET state = 'reactivated'
			WHERE node = ? AND module = ? AND consumer = '' AND state IN ('retired', 'dropped') AND node_removed_at IS NULL`,
			a.Node, a.Module); err != nil {
			return err
		}
	}
	for _, h := range ch.Unassign {
		if err := execAssigned(ctx, stmts, h.Node, h.Module, `DELETE FROM assignments WHERE node = ? AND module = ?`, h.Node, h.Module); err != nil {
			return err
		}
	}
	for _, r := range ch.Retirements {
		if _, err := stmts.ExecContext(ctx, `INSERT INTO retirements (node, module, data_set, path, precious, consumer, state, bytes, retired_at, why) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			r.Node, r.Module, r.DataSet, r.Path, r.Precious, r.Consumer, r.State, r.Bytes, sqlite.FormatTime(r.RetiredAt), r.Why); err != nil {
			return err
		}
	}
	for _, a := range ch.Versions {
		if err := execAssigned(ctx, stmts, a.Node, a.Module, `UPDATE assignments SET version = ?, pending_version = NULL WHERE node = ? AND module = ?`, a.Version, a.Node, a.Module); err != nil {
			return err
		}
	}
	for _, h := range ch.HostReleases {
		var version any // NULL: none declared
		if h.Version != "" {
			version = h.Version
		}
		res, err := stmts.ExecContext(ctx, `UPDATE nodes SET host_release = ? WHERE name = ?`, version, h.Node)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return fmt.Errorf("node %s %w", h.Node, ErrNodeNotFound)
		}
	}
	for _, a := range ch.Pending {
		if err := execAssigned(ctx, stmts, a.Node, a.Module, `UPDATE assignments SET pending_version = ? WHERE node = ? AND module = ?`, a.Version, a.Node, a.Module); err != nil {
			return err
		}
	}
	if err := changeSeats(ctx, tx, ch.Seats, now); err != nil {
		return err
	}
	for i := range ch.Replacements {
		if err := recordReplacement(ctx, tx, &ch.Replacements[i], now); err != nil {
			return err
		}
	}
	if err := recordReplacement(ctx, tx, ch.Replacement, now); err != nil {
		return err
	}
	for _, p := range ch.Pins {
		if err := setPin(ctx, tx, p, now); err != nil {
			return err
		}
	}
	if err := setBindings(ctx, tx, ch.Bindings, now); err != nil {
		return err
	}
	if err := setConsumers(ctx, tx, ch.Consumers, now); err != nil {
		return err
	}
	return bump(ctx, tx, ch.Bump)
}

// execAssigned runs a statement on one node's assignment of a module,
// which must be there: no row affected is ErrNotAssigned, and the whole
// change is rolled back.
func execAssigned(ctx context.Context, stmts *sqlite.Statements, node, module, query string, args ...any) error {
	res, err := stmts.ExecContext(ctx, query, args...)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%s on %s %w", module, node, ErrNotAssigned)
	}
	return nil
}

// Clone copies a snapshot deeply enough that an act can change the copy
// (assignments, seats, pins, bindings) to judge the mesh as it would be,
// and leave the snapshot as read.
func (s *Snapshot) Clone() *Snapshot {
	c := *s
	c.Assignments = slices.Clone(s.Assignments)
	c.Seats.Holders = map[string][]Holder{}
	for k, v := range s.Seats.Holders {
		c.Seats.Holders[k] = slices.Clone(v)
	}
	c.Seats.Pins = maps.Clone(s.Seats.Pins)
	c.Seats.Bindings = maps.Clone(s.Seats.Bindings)
	c.Seats.Consumers = slices.Clone(s.Seats.Consumers)
	c.versions, c.onNode, c.indexed = nil, nil, nil
	return &c
}

// Assign puts assignments into the snapshot (in memory), kept in node then
// module order.
func (s *Snapshot) Assign(as ...Assignment) {
	s.Assignments = append(s.Assignments, as...)
	slices.SortFunc(s.Assignments, func(a, b Assignment) int {
		return strings.Compare(a.Node+"\x00"+a.Module, b.Node+"\x00"+b.Module)
	})
	s.versions, s.onNode = nil, nil
}

// Unassign takes assignments out of the snapshot (in memory), with the
// seats they held and their bindings, as the store's foreign keys would.
func (s *Snapshot) Unassign(hs ...Holder) {
	// A set: an act may take a module off every node.
	leaving := make(map[Holder]bool, len(hs))
	for _, h := range hs {
		leaving[h] = true
	}
	gone := func(node, module string) bool { return leaving[Holder{Node: node, Module: module}] }
	s.Assignments = slices.DeleteFunc(s.Assignments, func(a Assignment) bool { return gone(a.Node, a.Module) })
	for seat, holders := range s.Seats.Holders {
		s.Seats.Holders[seat] = slices.DeleteFunc(holders, func(h Holder) bool { return gone(h.Node, h.Module) })
	}
	maps.DeleteFunc(s.Seats.Bindings, func(_ string, b Binding) bool { return gone(b.Node, b.Module) })
	s.versions, s.onNode = nil, nil
}

// SetVersion moves an assignment to another version (in memory).
func (s *Snapshot) SetVersion(node, module, version string) {
	for i, a := range s.Assignments {
		if a.Node == node && a.Module == module {
			s.Assignments[i].Version = version
		}
	}
	s.versions, s.onNode = nil, nil
}

// TakeUnheldSeats gives every seat no one holds to the first of these
// assignments that can fill it (in memory), and returns the changes.
func (s *Snapshot) TakeUnheldSeats(as []Assignment) []SeatChange {
	var out []SeatChange
	for _, a := range as {
		for _, seat := range s.Manifests[a.Module][a.Version].Seats {
			name := s.Seats.SeatName(seat.Seat)
			if len(s.Seats.Holders[name]) == 0 {
				h := Holder{Node: a.Node, Module: a.Module}
				out = append(out, SeatChange{Seat: name, Add: []Holder{h}})
				s.Seats.Holders[name] = []Holder{h}
			}
		}
	}
	return out
}

// BindingChanges are the bindings the mesh chooses now (ChooseBindings)
// against those kept: every binding to keep or move, every consumer whose
// state must change (active when bound, waiting for retirement when no
// longer asked for), and the nodes whose plans that moves. The snapshot is
// updated to match, so plans made from it carry the new bindings.
func (s *Snapshot) BindingChanges() (bindings []Binding, consumers []ConsumerChange, bumps []string) {
	chosen := s.ChooseBindings()
	moved := map[string]bool{}
	bound := map[string]Holder{} // consumer|provision -> provider
	for _, key := range slices.Sorted(maps.Keys(chosen)) {
		ch := chosen[key]
		node, module, provision := SplitBindingKey(key)
		b := Binding{Node: node, Module: module, Provision: provision, Provider: ch.Provider}
		if old, ok := s.Seats.Bindings[key]; !ok || old.Provider != ch.Provider {
			moved[node], moved[ch.Provider.Node] = true, true
			bindings = append(bindings, b)
			s.Seats.Bindings[key] = b
		}
		bound[node+"/"+module+"|"+provision] = ch.Provider
	}
	have := map[string]bool{}
	for i, cs := range s.Seats.Consumers {
		have[cs.Provider.String()+"|"+cs.Consumer+"|"+cs.Provision] = true
		p, stillBound := bound[cs.Consumer+"|"+cs.Provision]
		var c *ConsumerChange
		switch {
		case stillBound && p == cs.Provider && cs.State != "active":
			c = &ConsumerChange{Provider: cs.Provider, Consumer: cs.Consumer, Provision: cs.Provision, State: "active", Why: "bound again"}
		case (!stillBound || p != cs.Provider) && cs.State == "active":
			why := cs.Consumer + " was unassigned"
			if stillBound {
				why = cs.Consumer + "'s binding moved to " + p.String()
			}
			c = &ConsumerChange{Provider: cs.Provider, Consumer: cs.Consumer, Provision: cs.Provision, State: "waiting", Why: why}
		}
		if c != nil {
			consumers = append(consumers, *c)
			moved[cs.Provider.Node] = true
			s.Seats.Consumers[i].State, s.Seats.Consumers[i].Why = c.State, c.Why
		}
	}
	for _, k := range slices.Sorted(maps.Keys(bound)) {
		p := bound[k]
		consumer, provision, _ := strings.Cut(k, "|")
		if !have[p.String()+"|"+consumer+"|"+provision] {
			c := ConsumerChange{Provider: p, Consumer: consumer, Provision: provision, State: "active", Why: "bound"}
			consumers = append(consumers, c)
			s.Seats.Consumers = append(s.Seats.Consumers, Consumer{Provider: p, Consumer: consumer, Provision: provision, State: "active", Why: "bound"})
			moved[p.Node] = true
		}
	}
	return bindings, consumers, slices.Sorted(maps.Keys(moved))
}
