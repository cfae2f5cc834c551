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
	ErrLeaseHeld = errors.New("another controller holds the lease")
	// ErrLeaseLost means this controller's lease was taken over.
	ErrLeaseLost = errors.New("the lease was taken over")
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
}

// LeaseHeldError names the live holder of the lease.
type LeaseHeldError struct{ Lease Lease }

func (e *LeaseHeldError) Error() string {
	return fmt.Sprintf("%v: pid %d on %s, until %s", ErrLeaseHeld, e.Lease.PID, e.Lease.Host, e.Lease.ExpiresAt.Format(time.RFC3339))
}

// Unwrap is ErrLeaseHeld.
func (e *LeaseHeldError) Unwrap() error { return ErrLeaseHeld }

// TakeLease takes the lease for l.Holder unless another holder's lease is
// still live at now; an expired one is taken over.
func (s *Store) TakeLease(ctx context.Context, l Lease, now time.Time) error {
	return s.db.Write(ctx, func(tx *sql.Tx) error {
		cur, err := lease(ctx, tx)
		if err != nil {
			return err
		}
		if cur != nil && cur.Holder != l.Holder && cur.ExpiresAt.After(now) {
			return &LeaseHeldError{Lease: *cur}
		}
		_, err = tx.ExecContext(ctx, `INSERT OR REPLACE INTO lease (id, holder, pid, host, taken_at, expires_at, broker_url) VALUES (1, ?, ?, ?, ?, ?, ?)`,
			l.Holder, l.PID, l.Host, sqlite.FormatTime(now), sqlite.FormatTime(l.ExpiresAt), l.BrokerURL)
		return err
	})
}

// RenewLease moves the holder's expiry (and broker URL); ErrLeaseLost if
// another holder has it now.
func (s *Store) RenewLease(ctx context.Context, holder string, expires time.Time, brokerURL string) error {
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
func (s *Store) ReleaseLease(ctx context.Context, holder string) error {
	_, err := s.db.Writer.ExecContext(ctx, `DELETE FROM lease WHERE id = 1 AND holder = ?`, holder)
	return err
}

// Lease returns the lease as recorded (live or not), or nil.
func (s *Store) Lease(ctx context.Context) (*Lease, error) {
	return lease(ctx, s.db.Reader)
}

func lease(ctx context.Context, q querier) (*Lease, error) {
	var l Lease
	var taken, expires string
	err := q.QueryRowContext(ctx, `SELECT holder, pid, host, taken_at, expires_at, broker_url FROM lease WHERE id = 1`).
		Scan(&l.Holder, &l.PID, &l.Host, &taken, &expires, &l.BrokerURL)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read lease: %w", err)
	}
	if l.TakenAt, err = sqlite.ParseTime(taken); err != nil {
		return nil, err
	}
	if l.ExpiresAt, err = sqlite.ParseTime(expires); err != nil {
		return nil, err
	}
	return &l, nil
}
