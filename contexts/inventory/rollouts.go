package inventory

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"mesh-controller/embedded/sqlite"
)

// The phases of a roll-out: running (moving a batch and waiting for it),
// soaking (its batch ready, watched for the soak), rolling-back (returning
// every node it moved), and the ends: done, stopped (it could not go on and
// nothing was moved to return), rolled-back.
const (
	RollOutRunning     = "running"
	RollOutSoaking     = "soaking"
	RollOutRollingBack = "rolling-back"
	RollOutDone        = "done"
	RollOutStopped     = "stopped"
	RollOutRolledBack  = "rolled-back"
)

// The kinds of roll-out: of a module's nodes to one of its versions, or of
// hosts to a host release.
const (
	RollOutOfModule = "module"
	RollOutOfHost   = "host"
)

// HostRollOut is the key of the hosts' roll-out where the store's methods
// take a module: no module is named "", and one host roll-out is kept.
const HostRollOut = ""

// RollOut is a module's last roll-out (one a module is kept), or the
// hosts' last (Kind host, Module HostRollOut): its From and To are then
// host versions.
type RollOut struct {
	ID     string `json:"id"`
	Kind   string `json:"kind"`
	Module string `json:"module,omitempty"`
	To     string `json:"to"`
	// Canary is how many nodes batch 0 holds; Batch the batch size as asked
	// (N nodes or P%).
	Canary      int           `json:"canary"`
	Batch       string        `json:"batch"`
	Wait        time.Duration `json:"wait_ns"`
	Soak        time.Duration `json:"soak_ns"`
	MaxFailures int           `json:"max_failures"`
	// WithoutSnapshot says a person allowed its nodes to prepare the new
	// version without a snapshot of the module's irreplaceable data
	// (--without-snapshot; the why is the hand act's).
	WithoutSnapshot bool   `json:"without_snapshot,omitempty"`
	Phase           string `json:"phase"`
	// Why is why it stopped or was rolled back.
	Why       string        `json:"why,omitempty"`
	Who       string        `json:"who,omitempty"`
	StartedAt time.Time     `json:"started_at"`
	UpdatedAt time.Time     `json:"updated_at"`
	Nodes     []RollOutNode `json:"nodes"`
}

// Ended says the roll-out is no longer driven.
func (r RollOut) Ended() bool {
	return r.Phase == RollOutDone || r.Phase == RollOutStopped || r.Phase == RollOutRolledBack
}

// RollOutNode is one node of a roll-out.
type RollOutNode struct {
	Node  string `json:"node"`
	From  string `json:"from"`
	Batch int    `json:"batch"`
	// Moved says its assignment was moved to the roll-out's version,
	// Serial the declaration that carried it, Applied that its host
	// applied it.
	Moved   bool  `json:"moved"`
	Serial  int64 `json:"serial,omitempty"`
	Applied bool  `json:"applied"`
	// Result is waiting, moved, ready (and stayed so through the soak) or
	// failed (Error says why).
	Result string `json:"result"`
	Error  string `json:"error,omitempty"`
	// Prepared is the host's word on the module's data once ready at the
	// roll-out's version: its prepare ran, on which snapshot.
	Prepared string `json:"prepared,omitempty"`
	// Back is what became of its return to From in a rollback: returning,
	// returned (ready at From) or not-returned (BackError says why).
	Back       string `json:"back,omitempty"`
	BackSerial int64  `json:"back_serial,omitempty"`
	BackError  string `json:"back_error,omitempty"`
	// Detail is the host's word on the module once returned (the data
	// restored, or kept).
	Detail string `json:"detail,omitempty"`
}

// ErrRollOutUnderWay means a module's roll-out is being driven: one at a
// time a module.
var ErrRollOutUnderWay = errors.New("a roll-out of this module is under way")

// ErrNoRollOut means the module has no roll-out recorded.
var ErrNoRollOut = errors.New("no roll-out of this module is recorded")

// StartRollOut records a new roll-out of r.Module, replacing its ended
// one; refused (ErrRollOutUnderWay) while one is under way.
func (s *Store) StartRollOut(ctx context.Context, r RollOut, now time.Time) (err error) {
	defer s.db.Failing(&err, "record the roll-out")
	return s.db.Write(ctx, func(tx *sql.Tx) error {
		var phase string
		err := tx.QueryRowContext(ctx, `SELECT phase FROM rollouts WHERE module = ?`, r.Module).Scan(&phase)
		switch {
		case err == nil && !(RollOut{Phase: phase}).Ended():
			return ErrRollOutUnderWay
		case err != nil && !errors.Is(err, sql.ErrNoRows):
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM rollouts WHERE module = ?`, r.Module); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO rollouts (module, kind, id, to_version, canary, batch, wait_ms, soak_ms, max_failures, without_snapshot, phase, why, who, started_at, updated_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, r.Module, r.kind(), r.ID, r.To, r.Canary, r.Batch, r.Wait.Milliseconds(), r.Soak.Milliseconds(),
			r.MaxFailures, b2i(r.WithoutSnapshot), r.Phase, r.Why, r.Who, sqlite.FormatTime(now), sqlite.FormatTime(now)); err != nil {
			return err
		}
		return writeRollOutNodes(ctx, tx, r)
	})
}

// kind is r's kind, module unless said.
func (r RollOut) kind() string {
	if r.Kind == "" {
		return RollOutOfModule
	}
	return r.Kind
}

// writeRollOutNodes writes every node of r anew.
func writeRollOutNodes(ctx context.Context, tx *sql.Tx, r RollOut) error {
	if _, err := tx.ExecContext(ctx, `DELETE FROM rollout_nodes WHERE module = ?`, r.Module); err != nil {
		return err
	}
	// Prepared once: a roll-out --together has every node.
	stmts := sqlite.Prepared(tx)
	defer stmts.Close()
	for _, n := range r.Nodes {
		if _, err := stmts.ExecContext(ctx, `INSERT INTO rollout_nodes (module, node, from_version, batch, moved, serial, applied, result, error, prepared, back, back_serial, back_error, detail)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, r.Module, n.Node, n.From, n.Batch, b2i(n.Moved), n.Serial, b2i(n.Applied),
			n.Result, n.Error, n.Prepared, n.Back, n.BackSerial, n.BackError, n.Detail); err != nil {
			return err
		}
	}
	return nil
}

// SaveRollOut writes what became of a roll-out (its phase, why, and every
// node's results), if it is still the module's last (its ID): a roll-out
// replaced meanwhile is not written over.
func (s *Store) SaveRollOut(ctx context.Context, r RollOut, now time.Time) (err error) {
	defer s.db.Failing(&err, "record the roll-out's progress")
	return s.db.Write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE rollouts SET phase = ?, why = ?, updated_at = ? WHERE module = ? AND id = ?`,
			r.Phase, r.Why, sqlite.FormatTime(now), r.Module, r.ID)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return errors.Join(err, ErrNoRollOut)
		}
		return writeRollOutNodes(ctx, tx, r)
	})
}

// RollBackRollOut marks a module's ended roll-out rolling back, saying why,
// and returns it; refused while one is under way (ErrRollOutUnderWay) or
// when none is recorded (ErrNoRollOut).
func (s *Store) RollBackRollOut(ctx context.Context, module, why string, now time.Time) (_ RollOut, err error) {
	defer s.db.Failing(&err, "mark the roll-out rolling back")
	var r RollOut
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		var phase string
		err := tx.QueryRowContext(ctx, `SELECT phase FROM rollouts WHERE module = ?`, module).Scan(&phase)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return ErrNoRollOut
		case err != nil:
			return err
		case !(RollOut{Phase: phase}).Ended():
			return ErrRollOutUnderWay
		}
		_, err = tx.ExecContext(ctx, `UPDATE rollouts SET phase = ?, why = ?, updated_at = ? WHERE module = ?`,
			RollOutRollingBack, why, sqlite.FormatTime(now), module)
		return err
	})
	if err != nil {
		return RollOut{}, err
	}
	r, _, err = s.RollOut(ctx, module)
	return r, err
}

// RollOut reads a module's last roll-out; false if it has none.
func (s *Store) RollOut(ctx context.Context, module string) (_ RollOut, ok bool, err error) {
	defer s.db.Failing(&err, "read the roll-out")
	var r RollOut
	var wait, soak, without int64
	var started, updated string
	err = s.db.Reader.QueryRowContext(ctx, `SELECT module, kind, id, to_version, canary, batch, wait_ms, soak_ms, max_failures, without_snapshot, phase, why, who, started_at, updated_at
		FROM rollouts WHERE module = ?`, module).Scan(&r.Module, &r.Kind, &r.ID, &r.To, &r.Canary, &r.Batch, &wait, &soak, &r.MaxFailures, &without, &r.Phase, &r.Why, &r.Who, &started, &updated)
	if errors.Is(err, sql.ErrNoRows) {
		return RollOut{}, false, nil
	}
	if err != nil {
		return RollOut{}, false, err
	}
	r.Wait, r.Soak = time.Duration(wait)*time.Millisecond, time.Duration(soak)*time.Millisecond
	r.WithoutSnapshot = without != 0
	if r.StartedAt, err = sqlite.ParseTime(started); err != nil {
		return RollOut{}, false, err
	}
	if r.UpdatedAt, err = sqlite.ParseTime(updated); err != nil {
		return RollOut{}, false, err
	}
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT node, from_version, batch, moved, serial, applied, result, error, prepared, back, back_serial, back_error, detail
		FROM rollout_nodes WHERE module = ? ORDER BY batch, node`, module)
	if err != nil {
		return RollOut{}, false, err
	}
	defer rows.Close()
	r.Nodes = []RollOutNode{}
	for rows.Next() {
		var n RollOutNode
		if err := rows.Scan(&n.Node, &n.From, &n.Batch, &n.Moved, &n.Serial, &n.Applied, &n.Result, &n.Error, &n.Prepared, &n.Back, &n.BackSerial, &n.BackError, &n.Detail); err != nil {
			return RollOut{}, false, err
		}
		r.Nodes = append(r.Nodes, n)
	}
	return r, true, rows.Err()
}

// RollOutMark is what says a module's last roll-out changed, read alone:
// its id, phase and when it was last written ("" with none).
func (s *Store) RollOutMark(ctx context.Context, module string) (_ string, err error) {
	defer s.db.Failing(&err, "read the roll-out")
	var id, phase, updated string
	err = s.db.Reader.QueryRowContext(ctx, `SELECT id, phase, updated_at FROM rollouts WHERE module = ?`, module).Scan(&id, &phase, &updated)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	return id + " " + phase + " " + updated, err
}

// RollOutsUnderWay names the modules whose roll-out is not ended (and
// HostRollOut for the hosts'): serve drives them.
func (s *Store) RollOutsUnderWay(ctx context.Context) (_ []string, err error) {
	defer s.db.Failing(&err, "read the roll-outs under way")
	return sqlite.Strings(ctx, s.db.Reader, `SELECT module FROM rollouts WHERE phase IN (?, ?, ?) ORDER BY module`,
		RollOutRunning, RollOutSoaking, RollOutRollingBack)
}

// RollOutFromVersions are, per module (HostRollOut for the hosts), the
// versions its last roll-out's nodes ran before it: what a rollback may
// return to.
func (s *Store) RollOutFromVersions(ctx context.Context) (_ map[string][]string, err error) {
	defer s.db.Failing(&err, "read the roll-outs' from versions")
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT DISTINCT module, from_version FROM rollout_nodes ORDER BY module, from_version`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string][]string{}
	for rows.Next() {
		var m, v string
		if err := rows.Scan(&m, &v); err != nil {
			return nil, err
		}
		out[m] = append(out[m], v)
	}
	return out, rows.Err()
}

// withoutSnapshot reads, per node/module, the version a roll-out allows
// to be prepared without a snapshot: its to version, on each of its nodes
// (the planner marks the module there once it is at that version).
func withoutSnapshot(ctx context.Context, tx *sql.Tx) (map[Holder]string, error) {
	out := map[Holder]string{}
	err := each(ctx, tx, `SELECT n.node, r.module, r.to_version FROM rollouts r JOIN rollout_nodes n ON n.module = r.module
		WHERE r.without_snapshot = 1`, func(rows *sql.Rows) error {
		var h Holder
		var to string
		if err := rows.Scan(&h.Node, &h.Module, &to); err != nil {
			return err
		}
		out[h] = to
		return nil
	})
	return out, err
}
