package inventory

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"mesh-controller/embedded/sqlite"
)

// BackupState is what became of a data set's backups and drills.
type BackupState struct {
	// AttemptAt is the last backup tried; AttemptOK whether it made a
	// snapshot (Snapshot, with what it did), AttemptWhy why not.
	AttemptAt  *time.Time
	AttemptOK  bool
	AttemptWhy string
	Snapshot   string
	Files      int64
	Bytes      int64
	BytesAdded int64
	DurationMS float64
	// DrillAt is the last restore drill, DrillOK whether it passed (of
	// DrillSnapshot), DrillWhy why not; VerifiedAt the last that passed.
	DrillAt       *time.Time
	DrillOK       bool
	DrillWhy      string
	DrillSnapshot string
	VerifiedAt    *time.Time
	// FirstBackup is when the first backup that made a snapshot was made.
	FirstBackup *time.Time
}

// BackupRun is one backup, restore or drill of a data set.
type BackupRun struct {
	ID         int64     `json:"id"`
	Ask        string    `json:"ask"`
	Node       string    `json:"node"`
	Module     string    `json:"module"`
	Name       string    `json:"name"`
	Kind       string    `json:"kind"` // backup, restore, drill
	At         time.Time `json:"at"`
	OK         bool      `json:"ok"`
	Why        string    `json:"why,omitempty"`
	Snapshot   string    `json:"snapshot,omitempty"`
	Files      int64     `json:"files"`
	Bytes      int64     `json:"bytes"`
	BytesAdded int64     `json:"bytes_added"`
	DurationMS float64   `json:"duration_ms"`
	// Aside is where a restore moved the data set's contents: kept as a
	// retired data set (AsideName) of the data set's Precious, listed by
	// data and deleted only by cleanup delete.
	Aside    string `json:"aside,omitempty"`
	Precious string `json:"precious,omitempty"`
}

// AsideName names the retired data set a restore moved a data set's
// contents aside to, from the data set's name and when.
func AsideName(name string, at time.Time) string {
	return name + "-before-restore-" + at.UTC().Format("20060102t150405")
}

// Kinds of a BackupRun.
const (
	RunBackup  = "backup"
	RunRestore = "restore"
	RunDrill   = "drill"
)

// RunsKept bounds the runs kept of each data set and kind.
const RunsKept = 50

// BackupAccess is a node's access to its repository, sealed to it by the
// holder of the backup seat.
type BackupAccess struct {
	Holder   string
	Sealed   string
	IssuedAt time.Time
}

// RecordBackupRun keeps a backup's, restore's or drill's outcome: the run,
// the data set's state, for a backup that made a snapshot its last backup,
// for a drill that passed its last verification, for a restore that moved
// the data set's contents aside a retired data set (its node's plan moved:
// it declares that set's backup); and moves the plans of the backup seat's
// holders, whose lines carry those. One transaction.
func (s *Store) RecordBackupRun(ctx context.Context, r BackupRun) (err error) {
	defer s.db.Failing(&err, "record a backup run")
	if r.Kind != RunBackup && r.Kind != RunRestore && r.Kind != RunDrill {
		return fmt.Errorf("kind %q is not a backup, a restore or a drill", r.Kind)
	}
	at, ok := sqlite.FormatTime(r.At), b2i(r.OK)
	return s.db.Write(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO backup_runs (ask, node, module, name, kind, at, ok, why, snapshot, files, bytes, bytes_added, duration_ms, aside)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, r.Ask, r.Node, r.Module, r.Name, r.Kind, at, b2i(r.OK), r.Why, r.Snapshot,
			r.Files, r.Bytes, r.BytesAdded, r.DurationMS, r.Aside); err != nil {
			return err
		}
		// Bounded: the oldest beyond RunsKept of this set and kind go.
		if _, err := tx.ExecContext(ctx, `DELETE FROM backup_runs WHERE node = ? AND module = ? AND name = ? AND kind = ? AND id <= (
			SELECT id FROM backup_runs WHERE node = ? AND module = ? AND name = ? AND kind = ? ORDER BY id DESC LIMIT 1 OFFSET ?)`,
			r.Node, r.Module, r.Name, r.Kind, r.Node, r.Module, r.Name, r.Kind, RunsKept); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO backup_states (node, module, name) VALUES (?, ?, ?) ON CONFLICT (node, module, name) DO NOTHING`,
			r.Node, r.Module, r.Name); err != nil {
			return err
		}
		var err error
		switch r.Kind {
		case RunBackup:
			_, err = tx.ExecContext(ctx, `UPDATE backup_states SET attempt_at = ?, attempt_ok = ?, attempt_why = ?,
				snapshot = CASE WHEN ? = 1 THEN ? ELSE snapshot END, files = CASE WHEN ? = 1 THEN ? ELSE files END, bytes = CASE WHEN ? = 1 THEN ? ELSE bytes END,
				bytes_added = CASE WHEN ? = 1 THEN ? ELSE bytes_added END, duration_ms = ?
				WHERE node = ? AND module = ? AND name = ?`, at, b2i(r.OK), r.Why,
				ok, r.Snapshot, ok, r.Files, ok, r.Bytes, ok, r.BytesAdded, r.DurationMS, r.Node, r.Module, r.Name)
			if err == nil && r.OK {
				_, err = tx.ExecContext(ctx, `UPDATE backup_states SET first_backup = coalesce(first_backup, ?) WHERE node = ? AND module = ? AND name = ?`,
					at, r.Node, r.Module, r.Name)
			}
			if err == nil && r.OK {
				_, err = tx.ExecContext(ctx, `INSERT INTO backups (node, module, name, last_backup) VALUES (?, ?, ?, ?)
					ON CONFLICT (node, module, name) DO UPDATE SET last_backup = CASE WHEN backups.last_backup > excluded.last_backup THEN backups.last_backup ELSE excluded.last_backup END`,
					r.Node, r.Module, r.Name, at)
			}
		case RunRestore:
			if r.OK && r.Aside != "" {
				_, err = tx.ExecContext(ctx, `INSERT INTO retirements (node, module, data_set, path, precious, consumer, state, retired_at, why) VALUES (?, ?, ?, ?, ?, '', 'retired', ?, ?)`,
					r.Node, r.Module, AsideName(r.Name, r.At), r.Aside, r.Precious, at,
					fmt.Sprintf("moved aside by a restore of %s from snapshot %s", r.Name, r.Snapshot))
				if err == nil {
					// Its node declares the backup of what was moved aside, as
					// of any retired data: its plan moves with the holders'.
					err = bump(ctx, tx, []string{r.Node})
				}
			}
		case RunDrill:
			_, err = tx.ExecContext(ctx, `UPDATE backup_states SET drill_at = ?, drill_ok = ?, drill_why = ?, drill_snapshot = ?,
				verified_at = CASE WHEN ? = 1 THEN ? ELSE verified_at END WHERE node = ? AND module = ? AND name = ?`,
				at, ok, r.Why, r.Snapshot, ok, at, r.Node, r.Module, r.Name)
		}
		if err != nil {
			return err
		}
		return bumpBackupHolders(ctx, tx)
	})
}

// bumpBackupHolders moves the plans of the backup seat's holders.
func bumpBackupHolders(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `UPDATE nodes SET plan_version = plan_version + 1 WHERE name IN (
		SELECT node FROM seat_holders WHERE seat = 'backup' OR seat IN (SELECT seat FROM seat_aliases WHERE alias = 'backup'))`)
	return err
}

// BackupRunOf returns the run recorded for an ask, nil if none yet.
func (s *Store) BackupRunOf(ctx context.Context, ask string) (_ *BackupRun, err error) {
	defer s.db.Failing(&err, "read the backup run of %s", ask)
	runs, err := s.queryRuns(ctx, `WHERE ask = ? ORDER BY id DESC LIMIT 1`, ask)
	if err != nil || len(runs) == 0 {
		return nil, err
	}
	return &runs[0], nil
}

// BackupRuns returns a data set's latest runs, newest first (at most limit).
func (s *Store) BackupRuns(ctx context.Context, node, module, name string, limit int) (_ []BackupRun, err error) {
	defer s.db.Failing(&err, "read backup runs")
	return s.queryRuns(ctx, `WHERE node = ? AND module = ? AND name = ? ORDER BY id DESC LIMIT ?`, node, module, name, limit)
}

func (s *Store) queryRuns(ctx context.Context, where string, args ...any) ([]BackupRun, error) {
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT id, ask, node, module, name, kind, at, ok, why, snapshot, files, bytes, bytes_added, duration_ms, aside
		FROM backup_runs `+where, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []BackupRun
	for rows.Next() {
		var r BackupRun
		var at string
		var ok int64
		if err := rows.Scan(&r.ID, &r.Ask, &r.Node, &r.Module, &r.Name, &r.Kind, &at, &ok, &r.Why, &r.Snapshot, &r.Files, &r.Bytes, &r.BytesAdded, &r.DurationMS, &r.Aside); err != nil {
			return nil, err
		}
		r.OK = ok != 0
		if r.At, err = sqlite.ParseTime(at); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// KeepBackupAccess keeps a node's access as the holder sealed it, and
// moves the node's plan, which declares it. One from a node not in the
// mesh is refused (ErrNodeNotFound).
func (s *Store) KeepBackupAccess(ctx context.Context, node string, a BackupAccess) (err error) {
	defer s.db.Failing(&err, "keep the backup access of %s", node)
	return s.db.Write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE nodes SET plan_version = plan_version + 1 WHERE name = ?`, node)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("node %s %w", node, ErrNodeNotFound)
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO backup_access (node, holder, sealed, issued_at) VALUES (?, ?, ?, ?)
			ON CONFLICT (node) DO UPDATE SET holder = excluded.holder, sealed = excluded.sealed, issued_at = excluded.issued_at`,
			node, a.Holder, a.Sealed, sqlite.FormatTime(a.IssuedAt))
		return err
	})
}

// readBackups reads the data sets' backup states and the nodes' accesses
// into the seat state.
func readBackups(ctx context.Context, tx *sql.Tx, st *SeatState) error {
	st.BackupStates, st.Access = map[string]BackupState{}, map[string]BackupAccess{}
	if err := each(ctx, tx, `SELECT node, module, name, attempt_at, attempt_ok, attempt_why, snapshot, files, bytes, bytes_added, duration_ms,
		drill_at, drill_ok, drill_why, drill_snapshot, verified_at, first_backup FROM backup_states`, func(r *sql.Rows) error {
		var n, m, name string
		var b BackupState
		var attempt, drill, verified, first sql.NullString
		var aok, dok int64
		if err := r.Scan(&n, &m, &name, &attempt, &aok, &b.AttemptWhy, &b.Snapshot, &b.Files, &b.Bytes, &b.BytesAdded, &b.DurationMS,
			&drill, &dok, &b.DrillWhy, &b.DrillSnapshot, &verified, &first); err != nil {
			return err
		}
		b.AttemptOK, b.DrillOK = aok != 0, dok != 0
		b.AttemptAt, b.DrillAt, b.VerifiedAt, b.FirstBackup = nullTime(attempt), nullTime(drill), nullTime(verified), nullTime(first)
		st.BackupStates[n+"/"+m+"/"+name] = b
		return nil
	}); err != nil {
		return err
	}
	return each(ctx, tx, `SELECT node, holder, sealed, issued_at FROM backup_access`, func(r *sql.Rows) error {
		var n, at string
		var a BackupAccess
		if err := r.Scan(&n, &a.Holder, &a.Sealed, &at); err != nil {
			return err
		}
		a.IssuedAt, _ = sqlite.ParseTime(at)
		st.Access[n] = a
		return nil
	})
}

func nullTime(s sql.NullString) *time.Time {
	if !s.Valid {
		return nil
	}
	t, err := sqlite.ParseTime(s.String)
	if err != nil {
		return nil
	}
	return &t
}

// b2i is a boolean as the stores keep one.
func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
