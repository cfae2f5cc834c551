package inventory

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"syscall"
	"time"

	"mesh-controller/embedded/sqlite"
)

// ActUnderWay is a person's command that has begun moving plans and has
// not yet declared them: the catch-up leaves the mesh to it until it ends
// or its time runs out.
type ActUnderWay struct {
	ID   string
	What string
	// PID and Host are the command's process and machine: one on the
	// controller's machine whose process is gone is under way no more.
	PID   int
	Host  string
	Until time.Time
}

// Gone says whether the act's command is known to have ended without
// saying so: its process is not running on this machine (host).
func (a ActUnderWay) Gone(host string) bool {
	if a.Host != host || a.PID <= 0 {
		return false
	}
	return syscall.Kill(a.PID, 0) == syscall.ESRCH
}

// BeginAct records an act under way until until; End it when the act has
// declared (or failed). A command that dies leaves it to expire.
func (s *Store) BeginAct(ctx context.Context, what string, until time.Time) (_ ActUnderWay, err error) {
	defer s.db.Failing(&err, "record the act under way")
	b := make([]byte, 8)
	rand.Read(b)
	host, _ := os.Hostname()
	a := ActUnderWay{ID: hex.EncodeToString(b), What: what, PID: os.Getpid(), Host: host, Until: until.UTC()}
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO acts_under_way (id, what, pid, host, until) VALUES (?, ?, ?, ?, ?)`,
			a.ID, what, a.PID, a.Host, sqlite.FormatTime(until))
		return err
	})
	if err != nil {
		return ActUnderWay{}, err
	}
	return a, nil
}

// EndAct forgets an act under way, and any whose time ran out.
func (s *Store) EndAct(ctx context.Context, a ActUnderWay, now time.Time) (err error) {
	defer s.db.Failing(&err, "end the act under way")
	return s.db.Write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `DELETE FROM acts_under_way WHERE id = ? OR until < ?`, a.ID, sqlite.FormatTime(now))
		return err
	})
}

// ActsUnderWay returns the acts under way at now, their time not run out.
func (s *Store) ActsUnderWay(ctx context.Context, now time.Time) (_ []ActUnderWay, err error) {
	defer s.db.Failing(&err, "read the acts under way")
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT id, what, pid, host, until FROM acts_under_way WHERE until >= ? ORDER BY until`, sqlite.FormatTime(now))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []ActUnderWay
	for rows.Next() {
		var a ActUnderWay
		var until string
		if err := rows.Scan(&a.ID, &a.What, &a.PID, &a.Host, &until); err != nil {
			return nil, err
		}
		if a.Until, err = sqlite.ParseTime(until); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, rows.Err()
}
