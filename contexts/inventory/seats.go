package inventory

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"mesh-controller/embedded/sqlite"
)

// ErrSeatNotFound means no registered manifest defines that seat.
var ErrSeatNotFound = sqlite.Refusal("no registered module defines that seat")

// Holder is an assignment (node and module) holding a seat or providing a provision.
type Holder struct {
	Node   string `json:"node"`
	Module string `json:"module"`
}

func (h Holder) String() string { return h.Node + "/" + h.Module }

// Binding is which provider one consumer's need is bound to.
type Binding struct {
	Node, Module, Provision string
	Provider                Holder
	Since                   time.Time
}

// Pin is a person's choice of provider for a node's consumers of a provision.
type Pin struct {
	Node, Provision string
	Provider        Holder
}

// Consumer is one consumer of a provider, and where it stands.
type Consumer struct {
	Provider  Holder    `json:"provider"`
	Consumer  string    `json:"consumer"` // node/module
	Provision string    `json:"provision"`
	State     string    `json:"state"` // active, waiting, retired, rejected, deleted
	Since     time.Time `json:"since"`
	Why       string    `json:"why"`
}

// Deletion is a cleanup a person asked for, carried in the node's declaration until done.
type Deletion struct {
	ID      int64
	Node    string
	Module  string
	Target  string
	Kind    string // data or consumer
	Path    string
	AskedAt time.Time
	Why     string
	DoneAt  *time.Time
}

// deletionColumns are what scanDeletion reads, in its order.
const deletionColumns = `id, node, module, target, kind, path, asked_at, why`

// scanDeletion reads a row of deletionColumns.
func scanDeletion(r *sql.Rows) (Deletion, error) {
	var d Deletion
	var at string
	if err := r.Scan(&d.ID, &d.Node, &d.Module, &d.Target, &d.Kind, &d.Path, &at, &d.Why); err != nil {
		return Deletion{}, err
	}
	d.AskedAt, _ = sqlite.ParseTime(at)
	return d, nil
}

// Replacement is a seat or binding moved to a holder that starts without
// the data the old one kept.
type Replacement struct {
	ID                   int64
	What                 string
	NewHolder, OldHolder string
	Data                 string
	At                   time.Time
}

// SeatState is read into the snapshot: holders, aliases, bindings, pins,
// consumers, pending deletions and backups heard.
type SeatState struct {
	Holders      map[string][]Holder // seat -> holders
	Aliases      map[string]string   // former name -> seat
	Bindings     map[string]Binding  // node/module/provision -> binding
	Pins         map[string]Pin      // node/provision -> pin
	Consumers    []Consumer
	Deletions    []Deletion           // not done
	Backups      map[string]time.Time // node/module/name -> last backup reported by the backup seat
	Replacements []Replacement        // unresolved
	// BackupStates are what became of each data set's backups and drills,
	// by node/module/name; Access each node's repository access, sealed.
	BackupStates map[string]BackupState
	Access       map[string]BackupAccess
	// Retired are the data sets retired and waiting for a person (not
	// dropped, deleted or reactivated), of nodes still in the mesh: their
	// data is kept, so it is still backed up.
	Retired []Retirement
}

// SeatName resolves a former name to the seat's current one.
func (s *SeatState) SeatName(name string) string {
	if to, ok := s.Aliases[name]; ok {
		return to
	}
	return name
}

func readSeatState(ctx context.Context, tx *sql.Tx) (SeatState, error) {
	st := SeatState{Holders: map[string][]Holder{}, Aliases: map[string]string{}, Bindings: map[string]Binding{}, Pins: map[string]Pin{}, Backups: map[string]time.Time{}}
	if err := each(ctx, tx, `SELECT seat, node, module FROM seat_holders ORDER BY seat, node, module`, func(r *sql.Rows) error {
		var seat string
		var h Holder
		if err := r.Scan(&seat, &h.Node, &h.Module); err != nil {
			return err
		}
		st.Holders[seat] = append(st.Holders[seat], h)
		return nil
	}); err != nil {
		return st, err
	}
	if err := each(ctx, tx, `SELECT alias, seat FROM seat_aliases`, func(r *sql.Rows) error {
		var a, s string
		if err := r.Scan(&a, &s); err != nil {
			return err
		}
		st.Aliases[a] = s
		return nil
	}); err != nil {
		return st, err
	}
	if err := each(ctx, tx, `SELECT node, module, provision, provider_node, provider_module, since FROM bindings`, func(r *sql.Rows) error {
		var b Binding
		var since string
		if err := r.Scan(&b.Node, &b.Module, &b.Provision, &b.Provider.Node, &b.Provider.Module, &since); err != nil {
			return err
		}
		b.Since, _ = sqlite.ParseTime(since)
		st.Bindings[b.Node+"/"+b.Module+"/"+b.Provision] = b
		return nil
	}); err != nil {
		return st, err
	}
	if err := each(ctx, tx, `SELECT node, provision, provider_node, provider_module FROM pins`, func(r *sql.Rows) error {
		var p Pin
		if err := r.Scan(&p.Node, &p.Provision, &p.Provider.Node, &p.Provider.Module); err != nil {
			return err
		}
		st.Pins[p.Node+"/"+p.Provision] = p
		return nil
	}); err != nil {
		return st, err
	}
	if err := each(ctx, tx, `SELECT provider_node, provider_module, consumer, provision, state, since, why FROM consumers ORDER BY provider_node, provider_module, consumer, provision`, func(r *sql.Rows) error {
		var c Consumer
		var since string
		if err := r.Scan(&c.Provider.Node, &c.Provider.Module, &c.Consumer, &c.Provision, &c.State, &since, &c.Why); err != nil {
			return err
		}
		c.Since, _ = sqlite.ParseTime(since)
		st.Consumers = append(st.Consumers, c)
		return nil
	}); err != nil {
		return st, err
	}
	if err := each(ctx, tx, `SELECT `+deletionColumns+` FROM deletions WHERE done_at IS NULL ORDER BY id`, func(r *sql.Rows) error {
		d, err := scanDeletion(r)
		if err == nil {
			st.Deletions = append(st.Deletions, d)
		}
		return err
	}); err != nil {
		return st, err
	}
	if err := readBackups(ctx, tx, &st); err != nil {
		return st, err
	}
	if err := each(ctx, tx, `SELECT `+retirementColumns+` FROM retirements WHERE state = 'retired' AND consumer = '' AND node_removed_at IS NULL ORDER BY id`, func(r *sql.Rows) error {
		rt, err := scanRetirement(r)
		if err == nil {
			st.Retired = append(st.Retired, rt)
		}
		return err
	}); err != nil {
		return st, err
	}
	if err := each(ctx, tx, `SELECT node, module, name, last_backup FROM backups`, func(r *sql.Rows) error {
		var n, m, name, at string
		if err := r.Scan(&n, &m, &name, &at); err != nil {
			return err
		}
		t, _ := sqlite.ParseTime(at)
		st.Backups[n+"/"+m+"/"+name] = t
		return nil
	}); err != nil {
		return st, err
	}
	err := each(ctx, tx, `SELECT id, what, new_holder, old_holder, data, at FROM replacements WHERE resolved_at IS NULL ORDER BY id`, func(r *sql.Rows) error {
		var rp Replacement
		var at string
		if err := r.Scan(&rp.ID, &rp.What, &rp.NewHolder, &rp.OldHolder, &rp.Data, &at); err != nil {
			return err
		}
		rp.At, _ = sqlite.ParseTime(at)
		st.Replacements = append(st.Replacements, rp)
		return nil
	})
	return st, err
}

// SeatChange is a change to seat holders: adds and removes, in one transaction.
type SeatChange struct {
	Seat   string
	Add    []Holder
	Remove []Holder
}

func changeSeats(ctx context.Context, tx *sql.Tx, changes []SeatChange, now time.Time) error {
	for _, c := range changes {
		for _, h := range c.Add {
			if _, err := tx.ExecContext(ctx, `INSERT INTO seat_holders (seat, node, module, since) VALUES (?, ?, ?, ?) ON CONFLICT (seat, node, module) DO NOTHING`,
				c.Seat, h.Node, h.Module, sqlite.FormatTime(now)); err != nil {
				return err
			}
		}
		for _, h := range c.Remove {
			if _, err := tx.ExecContext(ctx, `DELETE FROM seat_holders WHERE seat = ? AND node = ? AND module = ?`, c.Seat, h.Node, h.Module); err != nil {
				return err
			}
		}
	}
	return nil
}

func recordReplacement(ctx context.Context, tx *sql.Tx, r *Replacement, now time.Time) error {
	if r == nil {
		return nil
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO replacements (what, new_holder, old_holder, data, at) VALUES (?, ?, ?, ?, ?)`,
		r.What, r.NewHolder, r.OldHolder, r.Data, sqlite.FormatTime(now))
	return err
}

// RenameSeat renames a seat: its holders move to the new name, and the
// former name resolves to it from now on; the plans of the bump nodes move
// in the same transaction.
func (s *Store) RenameSeat(ctx context.Context, from, to string, bumpNodes []string) (err error) {
	defer s.db.Failing(&err, "rename seat %s", from)
	return s.db.Write(ctx, func(tx *sql.Tx) error {
		// An act: judged acts committing after it are judged again.
		if err := moveRevision(ctx, tx, 0); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE seat_holders SET seat = ? WHERE seat = ?`, to, from); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE seat_aliases SET seat = ? WHERE seat = ?`, to, from); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM seat_aliases WHERE alias = ?`, to); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO seat_aliases (alias, seat) VALUES (?, ?) ON CONFLICT (alias) DO UPDATE SET seat = excluded.seat`, from, to); err != nil {
			return err
		}
		return bump(ctx, tx, bumpNodes)
	})
}

// ConsumerChange sets one consumer's state at a provider.
type ConsumerChange struct {
	Provider  Holder
	Consumer  string
	Provision string
	State     string
	Why       string
}

func setBindings(ctx context.Context, tx *sql.Tx, bindings []Binding, now time.Time) error {
	for _, b := range bindings {
		if _, err := tx.ExecContext(ctx, `INSERT INTO bindings (node, module, provision, provider_node, provider_module, since) VALUES (?, ?, ?, ?, ?, ?)
			ON CONFLICT (node, module, provision) DO UPDATE SET provider_node = excluded.provider_node, provider_module = excluded.provider_module, since = excluded.since
			WHERE bindings.provider_node <> excluded.provider_node OR bindings.provider_module <> excluded.provider_module`,
			b.Node, b.Module, b.Provision, b.Provider.Node, b.Provider.Module, sqlite.FormatTime(now)); err != nil {
			return err
		}
	}
	return nil
}

func setConsumers(ctx context.Context, tx *sql.Tx, consumers []ConsumerChange, now time.Time) error {
	for _, c := range consumers {
		if _, err := tx.ExecContext(ctx, `INSERT INTO consumers (provider_node, provider_module, consumer, provision, state, since, why) VALUES (?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (provider_node, provider_module, consumer, provision) DO UPDATE SET state = excluded.state, since = excluded.since, why = excluded.why
			WHERE consumers.state <> excluded.state`,
			c.Provider.Node, c.Provider.Module, c.Consumer, c.Provision, c.State, sqlite.FormatTime(now), c.Why); err != nil {
			return err
		}
	}
	return nil
}

func setPin(ctx context.Context, tx *sql.Tx, p Pin, now time.Time) error {
	if p.Provider == (Holder{}) {
		_, err := tx.ExecContext(ctx, `DELETE FROM pins WHERE node = ? AND provision = ?`, p.Node, p.Provision)
		return err
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO pins (node, provision, provider_node, provider_module, since) VALUES (?, ?, ?, ?, ?) ON CONFLICT (node, provision) DO UPDATE SET provider_node = excluded.provider_node, provider_module = excluded.provider_module, since = excluded.since`,
		p.Node, p.Provision, p.Provider.Node, p.Provider.Module, sqlite.FormatTime(now))
	return err
}

// ErrNotCleanable means a retirement to be recorded deleted is no longer
// retired or dropped on a removed node: something changed it meanwhile.
var ErrNotCleanable = sqlite.Refusal("is no longer retired data on a removed node")

// AskDeletions records a cleanup in one transaction: deletions its hosts are
// asked to carry out (their nodes' plans move), and retirements on removed
// nodes recorded deleted by hand, since no host is left to act on them.
func (s *Store) AskDeletions(ctx context.Context, asks []Deletion, deletedByHand []int64, based int64, now time.Time) (err error) {
	defer s.db.Failing(&err, "ask deletions")
	return s.db.Write(ctx, func(tx *sql.Tx) error {
		// An act: judged acts committing after it are judged again.
		if err := moveRevision(ctx, tx, based); err != nil {
			return err
		}
		nodes := map[string]bool{}
		for _, d := range asks {
			if _, err := tx.ExecContext(ctx, `INSERT INTO deletions (node, module, target, kind, path, asked_at, why) VALUES (?, ?, ?, ?, ?, ?, ?)`,
				d.Node, d.Module, d.Target, d.Kind, d.Path, sqlite.FormatTime(now), d.Why); err != nil {
				return err
			}
			nodes[d.Node] = true
		}
		for _, id := range deletedByHand {
			res, err := tx.ExecContext(ctx, `UPDATE retirements SET state = 'deleted'
				WHERE id = ? AND state IN ('retired', 'dropped') AND node_removed_at IS NOT NULL`, id)
			if err != nil {
				return err
			}
			if n, _ := res.RowsAffected(); n == 0 {
				return fmt.Errorf("retirement %d %w", id, ErrNotCleanable)
			}
		}
		var bumps []string
		for n := range nodes {
			bumps = append(bumps, n)
		}
		return bump(ctx, tx, bumps)
	})
}

// DeletionsDone marks a node's deletions done as its host reported them,
// and their targets deleted.
func (s *Store) DeletionsDone(ctx context.Context, node string, done []Deletion, now time.Time) (err error) {
	defer s.db.Failing(&err, "record the deletions done on %s", node)
	return s.db.Write(ctx, func(tx *sql.Tx) error {
		for _, d := range done {
			res, err := tx.ExecContext(ctx, `UPDATE deletions SET done_at = ? WHERE node = ? AND module = ? AND target = ? AND kind = ? AND done_at IS NULL`,
				sqlite.FormatTime(now), node, d.Module, d.Target, d.Kind)
			if err != nil {
				return err
			}
			if n, _ := res.RowsAffected(); n == 0 {
				continue
			}
			if d.Kind == "data" {
				// Dropped (rebuildable) data is deleted the same way as retired data.
				_, err = tx.ExecContext(ctx, `UPDATE retirements SET state = 'deleted'
					WHERE node = ? AND module = ? AND data_set = ? AND consumer = '' AND state IN ('retired', 'dropped') AND node_removed_at IS NULL`, node, d.Module, d.Target)
			} else {
				_, err = tx.ExecContext(ctx, `UPDATE consumers SET state = 'deleted', since = ? WHERE provider_node = ? AND provider_module = ? AND consumer = ? AND state = 'retired'`,
					sqlite.FormatTime(now), node, d.Module, d.Target)
			}
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `DELETE FROM node_data_sets WHERE node = ? AND module = ? AND name = ?`, node, d.Module, d.Target); err != nil {
				return err
			}
		}
		return bump(ctx, tx, []string{node})
	})
}

// RecordBackup keeps that the backup seat's holder backed up a data set.
func (s *Store) RecordBackup(ctx context.Context, node, module, name string, at time.Time) (err error) {
	defer s.db.Failing(&err, "record a backup of %s/%s/%s", node, module, name)
	_, err = s.db.Exec(ctx, `INSERT INTO backups (node, module, name, last_backup) VALUES (?, ?, ?, ?)
		ON CONFLICT (node, module, name) DO UPDATE SET last_backup = CASE WHEN backups.last_backup > excluded.last_backup THEN backups.last_backup ELSE excluded.last_backup END`, node, module, name, sqlite.FormatTime(at))
	return err
}

// ResolveReplacements marks replacements resolved.
func (s *Store) ResolveReplacements(ctx context.Context, ids []int64, now time.Time) (err error) {
	defer s.db.Failing(&err, "resolve replacements")
	return s.db.Write(ctx, func(tx *sql.Tx) error {
		for _, id := range ids {
			if _, err := tx.ExecContext(ctx, `UPDATE replacements SET resolved_at = ? WHERE id = ?`, sqlite.FormatTime(now), id); err != nil {
				return err
			}
		}
		return nil
	})
}

// HoldsSeat says whether any of a node's assignments holds a seat (by its
// name or a former one).
func (s *Store) HoldsSeat(ctx context.Context, node, seat string) (_ bool, err error) {
	defer s.db.Failing(&err, "read who holds seat %s", seat)
	var n int
	err = s.db.Reader.QueryRowContext(ctx, `SELECT count(*) FROM seat_holders WHERE node = ?
		AND seat = coalesce((SELECT seat FROM seat_aliases WHERE alias = ?), ?)`, node, seat, seat).Scan(&n)
	if err != nil {
		return false, err
	}
	return n > 0, nil
}
