package builds

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"mesh-controller/embedded/sqlite"
)

// Every is the holder that stands for every holder of the build seat.
const Every = "*"

// Pause is a holder of the build seat that takes nothing new.
type Pause struct {
	// Holder is a node, or Every.
	Holder string    `json:"holder"`
	Since  time.Time `json:"since"`
	Why    string    `json:"why"`
}

// Pause pauses a holder (a node, or Every): it takes nothing new until
// resumed; what it has in flight goes on. A holder paused already stays
// paused as it was, since and why unchanged, and added is false.
func (s *Store) Pause(ctx context.Context, holder, why string, now time.Time) (p Pause, added bool, err error) {
	defer s.db.Failing(&err, "pause builds on %s", holder)
	if holder == "" {
		return Pause{}, false, ErrNoHolder
	}
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO paused_builders (holder, since, why) VALUES (?, ?, ?) ON CONFLICT (holder) DO NOTHING`,
			holder, sqlite.FormatTime(now), oneLine(why, MaxWhyBytes))
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		added = n == 1
		ps, err := paused(ctx, tx, `SELECT holder, since, why FROM paused_builders WHERE holder = ?`, holder)
		if err == nil {
			p = ps[0]
		}
		return err
	})
	if err != nil {
		return Pause{}, false, err
	}
	return p, added, nil
}

// Resume lets a paused holder take again and returns the pauses lifted.
// Every lifts every pause, each node's too; a node lifts its own. A node
// not paused by itself is ErrNotPaused, saying so when every holder is
// paused (only resuming every holder lifts that).
func (s *Store) Resume(ctx context.Context, holder string) (_ []Pause, err error) {
	defer s.db.Failing(&err, "resume builds")
	if holder == "" {
		return nil, ErrNoHolder
	}
	var lifted []Pause
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		all, err := paused(ctx, tx, `SELECT holder, since, why FROM paused_builders ORDER BY holder`)
		if err != nil {
			return err
		}
		lifted = nil
		for _, p := range all {
			if holder == Every || p.Holder == holder {
				lifted = append(lifted, p)
			}
		}
		if len(lifted) == 0 {
			if every, ok := PausedFor(all, holder); ok {
				return fmt.Errorf("%s %w by itself: every holder is paused, since %s", holder, ErrNotPaused, sqlite.FormatTime(every.Since))
			}
			return fmt.Errorf("%s %w", holder, ErrNotPaused)
		}
		if holder == Every {
			_, err = tx.ExecContext(ctx, `DELETE FROM paused_builders`)
		} else {
			_, err = tx.ExecContext(ctx, `DELETE FROM paused_builders WHERE holder = ?`, holder)
		}
		return err
	})
	if err != nil {
		return nil, s.said(err, "resume builds")
	}
	return lifted, nil
}

// Paused returns every pause in force, by holder (Every first).
func (s *Store) Paused(ctx context.Context) (_ []Pause, err error) {
	defer s.db.Failing(&err, "read paused builders")
	ps, err := paused(ctx, s.db.Reader, `SELECT holder, since, why FROM paused_builders ORDER BY holder`)
	if err != nil {
		return nil, err
	}
	return ps, nil
}

// PausedFor says whether a node takes nothing new under the pauses ps, and
// the pause that holds it: its own, else the one of every holder.
func PausedFor(ps []Pause, node string) (Pause, bool) {
	var every *Pause
	for i, p := range ps {
		if p.Holder == node {
			return p, true
		}
		if p.Holder == Every {
			every = &ps[i]
		}
	}
	if every != nil {
		return *every, true
	}
	return Pause{}, false
}

// paused runs a query of pauses.
func paused(ctx context.Context, q sqlite.Querier, query string, args ...any) ([]Pause, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []Pause{}
	for rows.Next() {
		var p Pause
		var since string
		if err := rows.Scan(&p.Holder, &since, &p.Why); err != nil {
			return nil, err
		}
		var err error
		if p.Since, err = sqlite.ParseTime(since); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}
