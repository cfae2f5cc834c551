package identity

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"mesh-controller/embedded/sqlite"
)

var (
	// ErrLeaseHeld means another live controller holds the lease.
	ErrLeaseHeld = sqlite.Refusal("another controller holds the lease")
	// ErrLeaseLost means this controller's lease was taken over: its
	// writes are refused by every store's fence.
	ErrLeaseLost = sqlite.ErrLeaseLost
)

// Lease is the right to be the serving controller.
type Lease struct {
	Holder    string
	PID       int
	Host      string
	TakenAt   time.Time
	ExpiresAt time.Time
	// BrokerURL is where the serving controller's broker listens.
	BrokerURL string
	// Generation is bumped at each takeover: the serving controller's
	// writes carry it, and each store's fence refuses an older one.
	Generation int64
}

// LeaseHeldError names the live holder of the lease.
type LeaseHeldError struct{ Lease Lease }

func (e *LeaseHeldError) Error() string {
	return fmt.Sprintf("%v: pid %d on %s, until %s", ErrLeaseHeld, e.Lease.PID, e.Lease.Host, e.Lease.ExpiresAt.Format(time.RFC3339))
}

// Unwrap is ErrLeaseHeld.
func (e *LeaseHeldError) Unwrap() error { return ErrLeaseHeld }

// TakeLease takes the lease for l.Holder unless another holder's lease is
// still live at now; an expired one is taken over. Each take is a new
// generation, one above any issued before, and raises this store's fence
// to it in the same transaction; the lease taken is returned. Two
// controllers taking it at once are serialised by the write transaction:
// one takes it, the other is told who holds it.
func (s *Store) TakeLease(ctx context.Context, l Lease, now time.Time) (_ Lease, err error) {
	defer s.db.Failing(&err, "take the lease")
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		cur, err := lease(ctx, tx)
		if err != nil {
			return err
		}
		if cur != nil && cur.Holder != l.Holder && cur.ExpiresAt.After(now) {
			return &LeaseHeldError{Lease: *cur}
		}
		var fence int64
		if err := tx.QueryRowContext(ctx, `SELECT generation FROM fence WHERE id = 1`).Scan(&fence); err != nil {
			return fmt.Errorf("read the fence: %w", err)
		}
		l.Generation, l.TakenAt = fence+1, now
		if _, err := tx.ExecContext(ctx, `UPDATE fence SET generation = ? WHERE id = 1`, l.Generation); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO lease (id, holder, pid, host, taken_at, expires_at, broker_url, generation) VALUES (1, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (id) DO UPDATE SET holder = excluded.holder, pid = excluded.pid, host = excluded.host, taken_at = excluded.taken_at,
			expires_at = excluded.expires_at, broker_url = excluded.broker_url, generation = excluded.generation`,
			l.Holder, l.PID, l.Host, sqlite.FormatTime(now), sqlite.FormatTime(l.ExpiresAt), l.BrokerURL, l.Generation); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM standbys WHERE holder = ?`, l.Holder)
		return err
	})
	if err != nil {
		return Lease{}, err
	}
	return l, nil
}

// RenewLease moves the holder's expiry (and broker URL); ErrLeaseLost if
// another holder has it now. Made with the holder's fenced ctx
// (sqlite.WithFence), it is refused by the fence once a newer generation
// took over, even if the lease row were to say otherwise.
func (s *Store) RenewLease(ctx context.Context, holder string, expires time.Time, brokerURL string) (err error) {
	defer s.db.Failing(&err, "renew the lease")
	return s.db.Write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE lease SET expires_at = ?, broker_url = ? WHERE id = 1 AND holder = ?`,
			sqlite.FormatTime(expires), brokerURL, holder)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return ErrLeaseLost
		}
		return nil
	})
}

// ReleaseLease gives the lease back, if holder still has it.
func (s *Store) ReleaseLease(ctx context.Context, holder string) (err error) {
	defer s.db.Failing(&err, "release the lease")
	_, err = s.db.Exec(ctx, `DELETE FROM lease WHERE id = 1 AND holder = ?`, holder)
	return err
}

// Lease returns the lease as recorded (live or not), or nil.
func (s *Store) Lease(ctx context.Context) (_ *Lease, err error) {
	defer s.db.Failing(&err, "read the lease")
	return lease(ctx, s.db.Reader)
}

func lease(ctx context.Context, q querier) (*Lease, error) {
	var l Lease
	var taken, expires string
	err := q.QueryRowContext(ctx, `SELECT holder, pid, host, taken_at, expires_at, broker_url, generation FROM lease WHERE id = 1`).
		Scan(&l.Holder, &l.PID, &l.Host, &taken, &expires, &l.BrokerURL, &l.Generation)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if l.TakenAt, err = sqlite.ParseTime(taken); err != nil {
		return nil, err
	}
	if l.ExpiresAt, err = sqlite.ParseTime(expires); err != nil {
		return nil, err
	}
	return &l, nil
}

// Standby is a controller waiting for the lease.
type Standby struct {
	Holder string
	PID    int
	Host   string
	Since  time.Time
	// ExpiresAt is when it is no longer counted as standing by unless
	// heard again.
	ExpiresAt time.Time
}

// StandBy records (or renews) a controller standing by.
func (s *Store) StandBy(ctx context.Context, sb Standby) (err error) {
	defer s.db.Failing(&err, "stand by")
	return s.db.Write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO standbys (holder, pid, host, since, expires_at) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (holder) DO UPDATE SET expires_at = excluded.expires_at`,
			sb.Holder, sb.PID, sb.Host, sqlite.FormatTime(sb.Since), sqlite.FormatTime(sb.ExpiresAt))
		return err
	})
}

// LeaveStandby forgets a controller that no longer stands by, and any
// standby not heard since before now.
func (s *Store) LeaveStandby(ctx context.Context, holder string, now time.Time) (err error) {
	defer s.db.Failing(&err, "leave the standbys")
	return s.db.Write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `DELETE FROM standbys WHERE holder = ? OR expires_at < ?`, holder, sqlite.FormatTime(now))
		return err
	})
}

// Standbys lists the controllers standing by at now, longest waiting first.
func (s *Store) Standbys(ctx context.Context, now time.Time) (_ []Standby, err error) {
	defer s.db.Failing(&err, "read the standbys")
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT holder, pid, host, since, expires_at FROM standbys WHERE expires_at > ? ORDER BY since, holder`,
		sqlite.FormatTime(now))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Standby
	for rows.Next() {
		var sb Standby
		var since, expires string
		if err := rows.Scan(&sb.Holder, &sb.PID, &sb.Host, &since, &expires); err != nil {
			return nil, err
		}
		if sb.Since, err = sqlite.ParseTime(since); err != nil {
			return nil, err
		}
		if sb.ExpiresAt, err = sqlite.ParseTime(expires); err != nil {
			return nil, err
		}
		out = append(out, sb)
	}
	return out, rows.Err()
}
