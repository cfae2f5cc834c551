package health

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"mesh-controller/embedded/sqlite"
)

// Severities, most urgent first.
const (
	Urgent  = "urgent"
	Warning = "warning"
	Notice  = "notice"
)

// ErrNoCondition means no open condition has that key.
var ErrNoCondition = sqlite.Refusal("no open condition has that key")

// Condition is something wrong now.
type Condition struct {
	Key           string         `json:"key"`
	Kind          string         `json:"kind"`
	Scope         string         `json:"scope"`
	Machine       string         `json:"machine"`
	Module        string         `json:"module"`
	Severity      string         `json:"severity"`
	Summary       string         `json:"summary"`
	Evidence      map[string]any `json:"evidence"`
	RaisedAt      time.Time      `json:"raised_at"`
	ChangedAt     time.Time      `json:"changed_at"`
	SilencedUntil *time.Time     `json:"silenced_until"`
	SilenceWhy    string         `json:"silence_why,omitempty"`
}

// Silenced says its messages are stopped at now.
func (c Condition) Silenced(now time.Time) bool {
	return c.SilencedUntil != nil && c.SilencedUntil.After(now)
}

// Rank orders severities: urgent 0, warning 1, notice 2.
func Rank(severity string) int {
	switch severity {
	case Urgent:
		return 0
	case Warning:
		return 1
	}
	return 2
}

// Change is one raising, change or clearing a reconcile made.
type Change struct {
	Event     string    `json:"event"` // raised, changed, cleared, silenced
	Condition Condition `json:"condition"`
	At        time.Time `json:"at"`
}

func evidenceJSON(e map[string]any) (string, error) {
	if e == nil {
		e = map[string]any{}
	}
	b, err := json.Marshal(e) // maps marshal with sorted keys: equal evidence, equal text
	return string(b), err
}

// HistoryPerSubject is how many history rows one subject keeps (a
// machine's conditions together, or one condition about no machine): past
// it, each write drops that subject's oldest. What a host reports raises
// and changes conditions about its machine; however often and however it
// alternates, it cannot grow the history by more than this, nor push out
// another machine's. The age window (90 days, the self-check's prune)
// applies as well.
const HistoryPerSubject = 500

// historySubject is what a history row of c counts against.
func historySubject(c Condition) string {
	if c.Machine != "" {
		return c.Machine
	}
	return c.Key
}

// addHistory keeps an event of c in the condition history, under summary
// (which may say more than c's own) at the formatted time at, and notes
// its subject in written, for capHistory to bound before the transaction
// ends.
func addHistory(ctx context.Context, tx *sql.Tx, c Condition, event, summary, at string, written map[string]bool) error {
	ev, err := evidenceJSON(c.Evidence)
	if err != nil {
		return err
	}
	subject := historySubject(c)
	written[subject] = true
	_, err = tx.ExecContext(ctx, `INSERT INTO condition_history (key, kind, event, severity, summary, evidence, at, subject) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
		c.Key, c.Kind, event, c.Severity, summary, ev, at, subject)
	return err
}

// capHistory drops, in the transaction that wrote them, each written
// subject's history rows past its newest HistoryPerSubject: one indexed
// delete a subject, whatever was written.
func capHistory(ctx context.Context, tx *sql.Tx, written map[string]bool) error {
	for subject := range written {
		if _, err := tx.ExecContext(ctx, `DELETE FROM condition_history WHERE subject = ? AND id <=
			(SELECT id FROM condition_history WHERE subject = ? ORDER BY id DESC LIMIT 1 OFFSET ?)`, subject, subject, HistoryPerSubject); err != nil {
			return fmt.Errorf("bound the history of %s: %w", subject, err)
		}
	}
	return nil
}

// Reconcile makes the open conditions what the self-check found: new
// findings are raised, open ones whose severity, summary or evidence moved
// are changed, and open ones of an evaluated kind not found again are
// cleared. A kind the check could not evaluate (its store was unreadable)
// keeps its conditions. Every change is kept in the history, which keeps
// HistoryPerSubject rows a subject.
func (s *Store) Reconcile(ctx context.Context, found []Condition, evaluated map[string]bool, now time.Time) (_ []Change, err error) {
	defer s.db.Failing(&err, "reconcile conditions")
	var changes []Change
	at := sqlite.FormatTime(now)
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		open, err := conditions(ctx, tx, "")
		if err != nil {
			return err
		}
		byKey := map[string]Condition{}
		for _, c := range open {
			byKey[c.Key] = c
		}
		seen, written := map[string]bool{}, map[string]bool{}
		history := func(event string, c Condition) error {
			err := addHistory(ctx, tx, c, event, c.Summary, at, written)
			changes = append(changes, Change{Event: event, Condition: c, At: now})
			return err
		}
		for _, f := range found {
			if seen[f.Key] {
				continue
			}
			seen[f.Key] = true
			ev, err := evidenceJSON(f.Evidence)
			if err != nil {
				return err
			}
			old, isOpen := byKey[f.Key]
			if !isOpen {
				f.RaisedAt, f.ChangedAt = now, now
				if _, err := tx.ExecContext(ctx, `INSERT INTO conditions (key, kind, scope, machine, module, severity, summary, evidence, raised_at, changed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
					f.Key, f.Kind, f.Scope, f.Machine, f.Module, f.Severity, f.Summary, ev, at, at); err != nil {
					return err
				}
				if err := history("raised", f); err != nil {
					return err
				}
				continue
			}
			oldEv, _ := evidenceJSON(old.Evidence)
			if old.Severity == f.Severity && old.Summary == f.Summary && oldEv == ev {
				continue
			}
			if _, err := tx.ExecContext(ctx, `UPDATE conditions SET severity = ?, summary = ?, evidence = ?, changed_at = ? WHERE key = ?`,
				f.Severity, f.Summary, ev, at, f.Key); err != nil {
				return err
			}
			f.RaisedAt, f.ChangedAt, f.SilencedUntil, f.SilenceWhy = old.RaisedAt, now, old.SilencedUntil, old.SilenceWhy
			if err := history("changed", f); err != nil {
				return err
			}
		}
		for _, c := range open {
			if seen[c.Key] || !evaluated[c.Kind] {
				continue
			}
			if _, err := tx.ExecContext(ctx, `DELETE FROM conditions WHERE key = ?`, c.Key); err != nil {
				return err
			}
			if err := history("cleared", c); err != nil {
				return err
			}
		}
		return capHistory(ctx, tx, written)
	})
	if err != nil {
		return nil, err
	}
	return changes, nil
}

const conditionColumns = `key, kind, scope, machine, module, severity, summary, evidence, raised_at, changed_at, silenced_until, silence_why`

func scanCondition(sc interface{ Scan(...any) error }) (Condition, error) {
	var c Condition
	var ev, raised, changed string
	var silenced sql.NullString
	if err := sc.Scan(&c.Key, &c.Kind, &c.Scope, &c.Machine, &c.Module, &c.Severity, &c.Summary, &ev, &raised, &changed, &silenced, &c.SilenceWhy); err != nil {
		return Condition{}, err
	}
	if err := json.Unmarshal([]byte(ev), &c.Evidence); err != nil {
		return Condition{}, err
	}
	var err error
	if c.RaisedAt, err = sqlite.ParseTime(raised); err != nil {
		return Condition{}, err
	}
	if c.ChangedAt, err = sqlite.ParseTime(changed); err != nil {
		return Condition{}, err
	}
	c.SilencedUntil, err = sqlite.ParseNullTime(silenced)
	return c, err
}

func conditions(ctx context.Context, q sqlite.Querier, key string) ([]Condition, error) {
	query, args := conditionsQuery(key)
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []Condition{}
	for rows.Next() {
		c, err := scanCondition(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// conditionsQuery reads one open condition, or all. The WHERE clause is
// written per case: one statement for both (the key compared to the
// empty string in SQL) has one plan for both, and it scans the table even
// for one key.
func conditionsQuery(key string) (string, []any) {
	if key == "" {
		return `SELECT ` + conditionColumns + ` FROM conditions`, nil
	}
	return `SELECT ` + conditionColumns + ` FROM conditions WHERE key = ?`, []any{key}
}

// Conditions returns every open condition, urgent first, then by key.
func (s *Store) Conditions(ctx context.Context) (_ []Condition, err error) {
	defer s.db.Failing(&err, "read the open conditions")
	cs, err := conditions(ctx, s.db.Reader, "")
	if err != nil {
		return nil, err
	}
	sort.Slice(cs, func(i, j int) bool {
		if Rank(cs[i].Severity) != Rank(cs[j].Severity) {
			return Rank(cs[i].Severity) < Rank(cs[j].Severity)
		}
		return cs[i].Key < cs[j].Key
	})
	return cs, nil
}

// Condition returns one open condition, or ErrNoCondition.
func (s *Store) Condition(ctx context.Context, key string) (_ Condition, err error) {
	defer s.db.Failing(&err, "read condition %s", key)
	cs, err := conditions(ctx, s.db.Reader, key)
	if err != nil {
		return Condition{}, err
	}
	if len(cs) == 0 {
		return Condition{}, fmt.Errorf("%s: %w", key, ErrNoCondition)
	}
	return cs[0], nil
}

// History returns the raisings, changes, clearings and silencings since a
// time, of one key or ("") of all, newest first.
func (s *Store) History(ctx context.Context, key string, since time.Time) (_ []Change, err error) {
	defer s.db.Failing(&err, "read the conditions' history")
	query, args := historyQuery(key, since)
	rows, err := s.db.Reader.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []Change{}
	for rows.Next() {
		var ch Change
		var ev, at string
		if err := rows.Scan(&ch.Condition.Key, &ch.Condition.Kind, &ch.Event, &ch.Condition.Severity, &ch.Condition.Summary, &ev, &at); err != nil {
			return nil, err
		}
		json.Unmarshal([]byte(ev), &ch.Condition.Evidence)
		if ch.At, err = sqlite.ParseTime(at); err != nil {
			return nil, err
		}
		out = append(out, ch)
	}
	return out, rows.Err()
}

// historyQuery reads one key's history since a time, or every key's: the
// first through the index on (key, at), the second through the one on at.
// One statement for both (the key compared to the empty string in SQL)
// has one plan for both, the second's: every key's rows since, read to
// keep one key's.
func historyQuery(key string, since time.Time) (string, []any) {
	const columns = `SELECT key, kind, event, severity, summary, evidence, at FROM condition_history`
	if key == "" {
		return columns + ` WHERE at >= ? ORDER BY at DESC, id DESC`, []any{sqlite.FormatTime(since)}
	}
	return columns + ` WHERE key = ? AND at >= ? ORDER BY at DESC, id DESC`, []any{key, sqlite.FormatTime(since)}
}

// Silence stops a condition's messages until a time; it stays open and listed.
func (s *Store) Silence(ctx context.Context, key string, until time.Time, why string, now time.Time) (_ Condition, err error) {
	defer s.db.Failing(&err, "silence condition %s", key)
	var c Condition
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		cs, err := conditions(ctx, tx, key)
		if err != nil {
			return err
		}
		if len(cs) == 0 {
			return fmt.Errorf("%s: %w", key, ErrNoCondition)
		}
		c = cs[0]
		if _, err := tx.ExecContext(ctx, `UPDATE conditions SET silenced_until = ?, silence_why = ? WHERE key = ?`, sqlite.FormatTime(until), why, key); err != nil {
			return err
		}
		c.SilencedUntil, c.SilenceWhy = &until, why
		written := map[string]bool{}
		if err := addHistory(ctx, tx, c, "silenced", fmt.Sprintf("silenced until %s: %s", until.UTC().Format(time.RFC3339), why), sqlite.FormatTime(now), written); err != nil {
			return err
		}
		return capHistory(ctx, tx, written)
	})
	return c, err
}

// OpenCount is how many conditions of one kind and severity are open.
type OpenCount struct {
	Kind, Severity string
	N              int
}

// CountSilentBehind counts the machines an open node.silent condition
// names, and those an open node.behind one names that are not silent: a
// machine both silent and behind is counted silent only, so that the two
// and the rest of the nodes add up to the mesh. A few rows are read
// whatever the mesh's size.
func (s *Store) CountSilentBehind(ctx context.Context) (silent, behind int, err error) {
	defer s.db.Failing(&err, "count the silent and behind nodes")
	err = s.db.Reader.QueryRowContext(ctx, `SELECT
		(SELECT count(DISTINCT machine) FROM conditions WHERE kind = 'node.silent'),
		(SELECT count(DISTINCT machine) FROM conditions WHERE kind = 'node.behind'
			AND machine NOT IN (SELECT machine FROM conditions WHERE kind = 'node.silent'))`).Scan(&silent, &behind)
	return silent, behind, err
}

// CountOpen counts the open conditions by kind and severity, without
// reading each one: a scrape at 10,000 silent nodes reads a few rows.
func (s *Store) CountOpen(ctx context.Context) (_ []OpenCount, err error) {
	defer s.db.Failing(&err, "count the open conditions")
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT kind, severity, count(*) FROM conditions GROUP BY kind, severity ORDER BY kind, severity`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []OpenCount
	for rows.Next() {
		var c OpenCount
		if err := rows.Scan(&c.Kind, &c.Severity, &c.N); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}
