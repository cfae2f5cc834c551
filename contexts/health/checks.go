package health

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"mesh-controller/embedded/sqlite"
)

// Probe is one thing the self-check tried, and what came of it.
type Probe struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

// Verdict is one run of the self-check.
type Verdict struct {
	At      time.Time `json:"at"`
	OK      bool      `json:"ok"`
	Probes  []Probe   `json:"probes"`
	Raised  int       `json:"raised"`
	Changed int       `json:"changed"`
	Cleared int       `json:"cleared"`
	Open    int       `json:"open"`
	TookMS  float64   `json:"took_ms"`
}

// ErrNoVerdict means the self-check has not run yet.
var ErrNoVerdict = sqlite.Refusal("the self-check has not run yet")

// RecordVerdict keeps a verdict, and only the latest hundred.
func (s *Store) RecordVerdict(ctx context.Context, v Verdict) (err error) {
	defer s.db.Failing(&err, "record the self-check's verdict")
	probes, err := json.Marshal(v.Probes)
	if err != nil {
		return err
	}
	return s.db.Write(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO verdicts (at, ok, probes, raised, changed, cleared, open, took_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
			sqlite.FormatTime(v.At), v.OK, string(probes), v.Raised, v.Changed, v.Cleared, v.Open, v.TookMS); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `DELETE FROM verdicts WHERE id <= (SELECT max(id) - 100 FROM verdicts)`)
		return err
	})
}

// LastVerdict returns the latest verdict, or ErrNoVerdict.
func (s *Store) LastVerdict(ctx context.Context) (_ Verdict, err error) {
	defer s.db.Failing(&err, "read the self-check's last verdict")
	var v Verdict
	var at, probes string
	err = s.db.Reader.QueryRowContext(ctx, `SELECT at, ok, probes, raised, changed, cleared, open, took_ms FROM verdicts ORDER BY id DESC LIMIT 1`).
		Scan(&at, &v.OK, &probes, &v.Raised, &v.Changed, &v.Cleared, &v.Open, &v.TookMS)
	if errors.Is(err, sql.ErrNoRows) {
		return Verdict{}, ErrNoVerdict
	}
	if err != nil {
		return Verdict{}, err
	}
	if v.At, err = sqlite.ParseTime(at); err != nil {
		return Verdict{}, err
	}
	return v, json.Unmarshal([]byte(probes), &v.Probes)
}

// Duration is one measured duration.
type Duration struct {
	Kind    string // apply, heartbeat, tier, build
	Subject string // a machine or a module
	Name    string // a tier's name
	MS      float64
	At      time.Time
}

// RecordDurations keeps measured durations in one transaction.
func (s *Store) RecordDurations(ctx context.Context, ds []Duration) (err error) {
	defer s.db.Failing(&err, "record durations")
	if len(ds) == 0 {
		return nil
	}
	return s.db.Write(ctx, func(tx *sql.Tx) error {
		stmt, err := tx.PrepareContext(ctx, `INSERT INTO durations (kind, subject, name, ms, at) VALUES (?, ?, ?, ?, ?)`)
		if err != nil {
			return err
		}
		defer stmt.Close()
		for _, d := range ds {
			if _, err := stmt.ExecContext(ctx, d.Kind, d.Subject, d.Name, d.MS, sqlite.FormatTime(d.At)); err != nil {
				return err
			}
		}
		return nil
	})
}

// Durations returns the durations of a kind ("" for every kind) since a time.
func (s *Store) Durations(ctx context.Context, kind string, since time.Time) (_ []Duration, err error) {
	defer s.db.Failing(&err, "read durations")
	query, args := durationsQuery(kind, since)
	rows, err := s.db.Reader.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Duration
	for rows.Next() {
		var d Duration
		var at string
		if err := rows.Scan(&d.Kind, &d.Subject, &d.Name, &d.MS, &at); err != nil {
			return nil, err
		}
		if d.At, err = sqlite.ParseTime(at); err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// durationKinds are the kinds of duration the durations table holds: the
// kinds its CHECK allows (migration 0007).
var durationKinds = []string{"apply", "heartbeat", "tier", "build", "start", "declare"}

// durationsQuery reads one kind's durations since a time, or every kind's.
// Every kind is named, not left out, so that both find their rows through
// the index on (kind, at): without a kind, the table has no index on at
// alone to search, and would be scanned whole.
func durationsQuery(kind string, since time.Time) (string, []any) {
	kinds := []string{kind}
	if kind == "" {
		kinds = durationKinds
	}
	args := make([]any, 0, len(kinds)+1)
	for _, k := range kinds {
		args = append(args, k)
	}
	args = append(args, sqlite.FormatTime(since))
	return `SELECT kind, subject, name, ms, at FROM durations WHERE kind IN (?` + strings.Repeat(", ?", len(kinds)-1) + `) AND at >= ?`, args
}

// HealerAct is one automatic act a healer took.
type HealerAct struct {
	Healer    string    `json:"healer"`
	Subject   string    `json:"subject"`
	Condition string    `json:"condition"`
	Detail    string    `json:"detail"`
	Outcome   string    `json:"outcome"`
	At        time.Time `json:"at"`
}

// RecordHealerAct keeps a healer's act, in a write the serving
// controller's fence guards: a deposed controller's healer does not act twice.
func (s *Store) RecordHealerAct(ctx context.Context, a HealerAct) (err error) {
	defer s.db.Failing(&err, "record a healer's act")
	return s.db.Write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO healer_acts (healer, subject, condition, detail, outcome, at) VALUES (?, ?, ?, ?, ?, ?)`,
			a.Healer, a.Subject, a.Condition, a.Detail, a.Outcome, sqlite.FormatTime(a.At))
		return err
	})
}

// HealerActs returns the acts since a time, newest first.
func (s *Store) HealerActs(ctx context.Context, since time.Time) (_ []HealerAct, err error) {
	defer s.db.Failing(&err, "read the healers' acts")
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT healer, subject, condition, detail, outcome, at FROM healer_acts WHERE at >= ? ORDER BY at DESC, id DESC`,
		sqlite.FormatTime(since))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []HealerAct{}
	for rows.Next() {
		var a HealerAct
		var at string
		if err := rows.Scan(&a.Healer, &a.Subject, &a.Condition, &a.Detail, &a.Outcome, &at); err != nil {
			return nil, err
		}
		if a.At, err = sqlite.ParseTime(at); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

// Brake is the healers' brake.
type Brake struct {
	Engaged    bool       `json:"engaged"`
	EngagedAt  *time.Time `json:"engaged_at"`
	Why        string     `json:"why"`
	ReleasedAt *time.Time `json:"released_at"`
	ReleasedBy string     `json:"released_by,omitempty"`
	ReleaseWhy string     `json:"release_why,omitempty"`
}

// Brake returns the brake's state.
func (s *Store) Brake(ctx context.Context) (_ Brake, err error) {
	defer s.db.Failing(&err, "read the healers' brake")
	var b Brake
	var engaged string
	var released sql.NullString
	err = s.db.Reader.QueryRowContext(ctx, `SELECT engaged_at, why, released_at, released_by, release_why FROM brake WHERE id = 1`).
		Scan(&engaged, &b.Why, &released, &b.ReleasedBy, &b.ReleaseWhy)
	if errors.Is(err, sql.ErrNoRows) {
		return b, nil
	}
	if err != nil {
		return b, err
	}
	t, err := sqlite.ParseTime(engaged)
	if err != nil {
		return b, err
	}
	b.EngagedAt = &t
	if b.ReleasedAt, err = sqlite.ParseNullTime(released); err != nil {
		return b, err
	}
	b.Engaged = b.ReleasedAt == nil
	return b, nil
}

// EngageBrake stops every healer until a person releases the brake.
func (s *Store) EngageBrake(ctx context.Context, why string, now time.Time) (err error) {
	defer s.db.Failing(&err, "engage the healers' brake")
	_, err = s.db.Exec(ctx, `INSERT INTO brake (id, engaged_at, why) VALUES (1, ?, ?) ON CONFLICT (id) DO UPDATE SET engaged_at = excluded.engaged_at, why = excluded.why, released_at = NULL, released_by = NULL, release_why = NULL`, sqlite.FormatTime(now), why)
	return err
}

// ErrBrakeNotEngaged means there is no engaged brake to release.
var ErrBrakeNotEngaged = sqlite.Refusal("the healers' brake is not engaged")

// ReleaseBrake lets the healers act again.
func (s *Store) ReleaseBrake(ctx context.Context, who, why string, now time.Time) (err error) {
	defer s.db.Failing(&err, "release the healers' brake")
	res, err := s.db.Exec(ctx, `UPDATE brake SET released_at = ?, released_by = ?, release_why = ? WHERE id = 1 AND released_at IS NULL`,
		sqlite.FormatTime(now), who, why)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrBrakeNotEngaged
	}
	return nil
}
