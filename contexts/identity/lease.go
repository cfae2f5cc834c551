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
	// Version is the holder's build version, as it says it ("" from a
	// controller that predates recording it: v0.2.0 and older).
	Version string
}

// LeaseHeldError names the live holder of the lease.
type LeaseHeldError struct{ Lease Lease }

func (e *LeaseHeldError) Error() string {
	return fmt.Sprintf("%v: pid %d on %s (%s), until %s", ErrLeaseHeld, e.Lease.PID, e.Lease.Host, e.Lease.Shown(), e.Lease.ExpiresAt.Format(time.RFC3339))
}

// Shown says which mesh-controller holds the lease, by its version.
func (l Lease) Shown() string {
	if l.Version == "" {
		return "an older mesh-controller, which records no version"
	}
	return "mesh-controller " + l.Version
}

// Unwrap is ErrLeaseHeld.
func (e *LeaseHeldError) Unwrap() error { return ErrLeaseHeld }

// TakeLease takes the lease for l.Holder unless another holder's lease is
// still live at now; an expired one is taken over. Each take is a new
// generation, one above any issued before, and raises this store's fence
// to it in the same transaction, saying the taker's version (l.Version):
// the fence refuses a take by a controller that predates the store's
// schema (migration 0008). The lease taken is returned. Two controllers
// taking it at once are serialised by the write transaction: one takes
// it, the other is told who holds it.
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
		if _, err := tx.ExecContext(ctx, `UPDATE fence SET generation = ?, raised_to = ?, controller = ? WHERE id = 1`, l.Generation, l.Generation, l.Version); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO lease (id, holder, pid, host, taken_at, expires_at, broker_url, generation, version) VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (id) DO UPDATE SET holder = excluded.holder, pid = excluded.pid, host = excluded.host, taken_at = excluded.taken_at,
			expires_at = excluded.expires_at, broker_url = excluded.broker_url, generation = excluded.generation, version = excluded.version`,
			l.Holder, l.PID, l.Host, sqlite.FormatTime(now), sqlite.FormatTime(l.ExpiresAt), l.BrokerURL, l.Generation, l.Version); err != nil {
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

// Lease returns the lease as recorded (live or not), or nil. It reads a
// store this binary's migrations have not reached yet too (an older
// controller serves it): what a newer controller waiting to migrate it
// must know.
func (s *Store) Lease(ctx context.Context) (_ *Lease, err error) {
	defer s.db.Failing(&err, "read the lease")
	query, err := s.leaseQuery(ctx)
	if err != nil {
		return nil, err
	}
	return leaseAs(ctx, s.db.Reader, query)
}

// leaseQuery reads the lease as the store's schema keeps it: with the
// holder's version (migration 0008), with its generation alone (0006), or
// with neither.
func (s *Store) leaseQuery(ctx context.Context) (string, error) {
	if versioned, err := s.versioned(ctx); err != nil || versioned {
		return leaseWithVersion, err
	}
	if fenced, err := s.db.HasColumn(ctx, "lease", "generation"); err != nil || fenced {
		return leaseBeforeVersions, err
	}
	return leaseBeforeFences, nil
}

// versioned says the store records controllers' versions (migration
// 0008): once it does, it always will.
func (s *Store) versioned(ctx context.Context) (bool, error) {
	if s.knowsVersions.Load() {
		return true, nil
	}
	has, err := s.db.HasColumn(ctx, "lease", "version")
	if has {
		s.knowsVersions.Store(true)
	}
	return has, err
}

// The lease as read from a store that records controllers' versions, and
// from one whose schema predates it.
const (
	leaseWithVersion    = `SELECT holder, pid, host, taken_at, expires_at, broker_url, generation, version FROM lease WHERE id = 1`
	leaseBeforeVersions = `SELECT holder, pid, host, taken_at, expires_at, broker_url, generation, '' FROM lease WHERE id = 1`
	leaseBeforeFences   = `SELECT holder, pid, host, taken_at, expires_at, broker_url, 0, '' FROM lease WHERE id = 1`
)

func lease(ctx context.Context, q querier) (*Lease, error) { return leaseAs(ctx, q, leaseWithVersion) }

func leaseAs(ctx context.Context, q querier, query string) (*Lease, error) {
	var l Lease
	var taken, expires string
	err := q.QueryRowContext(ctx, query).
		Scan(&l.Holder, &l.PID, &l.Host, &taken, &expires, &l.BrokerURL, &l.Generation, &l.Version)
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
	// Version is its build version ("" for one recorded by a controller
	// that predates recording it).
	Version string
	// Aside says why it stands aside, never to take the lease ("" while it
	// stands by to take it).
	Aside string
}

// StandBy records (or renews) a controller standing by, or aside. On a
// store this binary's migrations have not reached yet (an older controller
// serves it), its version and why it stands aside are not kept.
func (s *Store) StandBy(ctx context.Context, sb Standby) (err error) {
	defer s.db.Failing(&err, "stand by")
	versioned, err := s.versioned(ctx)
	if err != nil {
		return err
	}
	return s.db.Write(ctx, func(tx *sql.Tx) error {
		if !versioned {
			_, err := tx.ExecContext(ctx, `INSERT INTO standbys (holder, pid, host, since, expires_at) VALUES (?, ?, ?, ?, ?)
				ON CONFLICT (holder) DO UPDATE SET expires_at = excluded.expires_at`,
				sb.Holder, sb.PID, sb.Host, sqlite.FormatTime(sb.Since), sqlite.FormatTime(sb.ExpiresAt))
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO standbys (holder, pid, host, since, expires_at, version, aside) VALUES (?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (holder) DO UPDATE SET expires_at = excluded.expires_at, version = excluded.version, aside = excluded.aside`,
			sb.Holder, sb.PID, sb.Host, sqlite.FormatTime(sb.Since), sqlite.FormatTime(sb.ExpiresAt), sb.Version, sb.Aside)
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
	query := `SELECT holder, pid, host, since, expires_at, coalesce(version, ''), aside FROM standbys WHERE expires_at > ? ORDER BY since, holder`
	if versioned, err := s.versioned(ctx); err != nil {
		return nil, err
	} else if !versioned {
		query = `SELECT holder, pid, host, since, expires_at, '', '' FROM standbys WHERE expires_at > ? ORDER BY since, holder`
	}
	rows, err := s.db.Reader.QueryContext(ctx, query, sqlite.FormatTime(now))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Standby
	for rows.Next() {
		var sb Standby
		var since, expires string
		if err := rows.Scan(&sb.Holder, &sb.PID, &sb.Host, &since, &expires, &sb.Version, &sb.Aside); err != nil {
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

// MigratedBy records that a controller of version migrated these stores:
// one older, refused by the fence, names it.
func (s *Store) MigratedBy(ctx context.Context, version string) (err error) {
	defer s.db.Failing(&err, "record who migrated the stores")
	_, err = s.db.Exec(ctx, `UPDATE fence SET controller = ? WHERE id = 1`, version)
	return err
}

// Controller is the version of the controller that last took the lease or
// migrated these stores, "" if none said.
func (s *Store) Controller(ctx context.Context) (_ string, err error) {
	defer s.db.Failing(&err, "read who last served")
	if versioned, err := s.versioned(ctx); err != nil || !versioned {
		return "", err
	}
	var v string
	err = s.db.Reader.QueryRowContext(ctx, `SELECT controller FROM fence WHERE id = 1`).Scan(&v)
	return v, err
}

// NoLiveLease is a migration guard (sqlite.MigrateGuarded) for this
// identity store: it refuses, with a *LeaseHeldError, while a controller
// holds a live lease at now, reading the lease as the store's schema
// keeps it. A controller must not change the stores under one
// that serves them.
func (s *Store) NoLiveLease(now time.Time) func(context.Context, *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error {
		// A store without a lease yet (its first migrations) was never
		// served.
		if has, err := s.db.HasTable(ctx, "lease"); err != nil || !has {
			return err
		}
		query, err := s.leaseQuery(ctx)
		if err != nil {
			return err
		}
		l, err := leaseAs(ctx, tx, query)
		if err != nil {
			return fmt.Errorf("read the lease: %w", err)
		}
		if l != nil && l.ExpiresAt.After(now) {
			return &LeaseHeldError{Lease: *l}
		}
		return nil
	}
}
