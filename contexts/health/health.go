// Package health owns conditions and their history, silences, hand acts,
// dropped messages, healer acts and the brake, self-check verdicts, and
// measured durations (heartbeat intervals as hourly aggregates), and the
// health store. It imports no other context.
package health

import (
	"context"
	"database/sql"
	"time"

	"mesh-controller/embedded/sqlite"
)

// ErrNoWhy means a hand act was given no reason.
var ErrNoWhy = sqlite.Refusal("a hand act needs --why: say why it was done")

// HandAct is something a person did by hand outside the ordinary flow.
type HandAct struct {
	ID        int64     `json:"id"`
	At        time.Time `json:"at"`
	What      string    `json:"what"`
	Why       string    `json:"why"`
	Cause     string    `json:"cause"`
	Who       string    `json:"who"`
	Condition string    `json:"condition"`
}

// Drop counts messages dropped for one claimed sender and reason.
type Drop struct {
	Node    string    `json:"node"`
	Reason  string    `json:"reason"`
	Count   int64     `json:"count"`
	FirstAt time.Time `json:"first_at"`
	LastAt  time.Time `json:"last_at"`
}

// Store is the health context's store.
type Store struct {
	db *sqlite.DB
}

// NewStore wraps an open, migrated health store.
func NewStore(db *sqlite.DB) *Store { return &Store{db: db} }

// RecordHandAct keeps a hand act; its why may not be empty.
func (s *Store) RecordHandAct(ctx context.Context, a HandAct) (_ HandAct, err error) {
	defer s.db.Failing(&err, "record a hand act")
	out, err := s.recordHandActs(ctx, []HandAct{a})
	if err != nil {
		return HandAct{}, err
	}
	return out[0], nil
}

// RecordHandActs keeps the hand acts of one command in one transaction:
// all of them or none. Each why may not be empty.
func (s *Store) RecordHandActs(ctx context.Context, acts []HandAct) (_ []HandAct, err error) {
	defer s.db.Failing(&err, "record hand acts")
	return s.recordHandActs(ctx, acts)
}

// recordHandActs is RecordHandAct and RecordHandActs.
func (s *Store) recordHandActs(ctx context.Context, acts []HandAct) ([]HandAct, error) {
	if err := needWhy(acts); err != nil {
		return nil, err
	}
	var out []HandAct
	err := s.db.Write(ctx, func(tx *sql.Tx) error {
		var err error
		out, err = insertHandActs(ctx, tx, acts)
		return err
	})
	return out, err
}

// needWhy refuses hand acts any of which has no why. It is asked before the
// transaction begins: a refusal takes no writer, and ErrNoWhy comes back as
// it is, not wrapped in what failed to be written.
func needWhy(acts []HandAct) error {
	for _, a := range acts {
		if a.Why == "" {
			return ErrNoWhy
		}
	}
	return nil
}

// insertHandActs keeps acts in tx and returns them with their ids.
func insertHandActs(ctx context.Context, tx *sql.Tx, acts []HandAct) ([]HandAct, error) {
	out := make([]HandAct, len(acts))
	// Prepared once: a roll-out records an act for each node it moves.
	stmts := sqlite.Prepared(tx)
	defer stmts.Close()
	for i, a := range acts {
		// RETURNING, not LastInsertId: PostgreSQL's driver has no last id.
		if err := stmts.QueryRowContext(ctx, `INSERT INTO hand_acts (at, what, why, cause, who, condition) VALUES (?, ?, ?, ?, ?, ?) RETURNING id`,
			sqlite.FormatTime(a.At), a.What, a.Why, a.Cause, a.Who, a.Condition).Scan(&a.ID); err != nil {
			return nil, err
		}
		out[i] = a
	}
	return out, nil
}

// HandActs returns the hand acts since a time, newest first.
func (s *Store) HandActs(ctx context.Context, since time.Time) (_ []HandAct, err error) {
	defer s.db.Failing(&err, "read hand acts")
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT id, at, what, why, cause, who, condition FROM hand_acts WHERE at >= ? ORDER BY at DESC, id DESC`,
		sqlite.FormatTime(since))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	acts := []HandAct{}
	for rows.Next() {
		var a HandAct
		var at string
		if err := rows.Scan(&a.ID, &at, &a.What, &a.Why, &a.Cause, &a.Who, &a.Condition); err != nil {
			return nil, err
		}
		if a.At, err = sqlite.ParseTime(at); err != nil {
			return nil, err
		}
		acts = append(acts, a)
	}
	return acts, rows.Err()
}

// CountDrops adds n dropped messages for a claimed node and reason.
func (s *Store) CountDrops(ctx context.Context, node, reason string, n int64, now time.Time) (err error) {
	defer s.db.Failing(&err, "count dropped messages")
	_, err = s.db.Exec(ctx, `INSERT INTO dropped_messages (node, reason, count, first_at, last_at) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (node, reason) DO UPDATE SET count = dropped_messages.count + excluded.count, last_at = excluded.last_at`,
		node, reason, n, sqlite.FormatTime(now), sqlite.FormatTime(now))
	if err != nil {
		return err
	}
	return nil
}

// Drops returns the dropped-message counts claimed for a node ("" for all).
func (s *Store) Drops(ctx context.Context, node string) (_ []Drop, err error) {
	defer s.db.Failing(&err, "read dropped messages")
	query, args := dropsQuery(node)
	rows, err := s.db.Reader.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	drops := []Drop{}
	for rows.Next() {
		var d Drop
		var first, last string
		if err := rows.Scan(&d.Node, &d.Reason, &d.Count, &first, &last); err != nil {
			return nil, err
		}
		if d.FirstAt, err = sqlite.ParseTime(first); err != nil {
			return nil, err
		}
		if d.LastAt, err = sqlite.ParseTime(last); err != nil {
			return nil, err
		}
		drops = append(drops, d)
	}
	return drops, rows.Err()
}

// dropsQuery reads one node's counts, or every node's. The WHERE clause is
// written per case: one statement for both (the node compared to the
// empty string in SQL) has one plan for both, and it scans the table even
// for one node.
func dropsQuery(node string) (string, []any) {
	const columns = `SELECT node, reason, count, first_at, last_at FROM dropped_messages`
	if node == "" {
		return columns + ` ORDER BY node, reason`, nil
	}
	return columns + ` WHERE node = ? ORDER BY node, reason`, []any{node}
}
