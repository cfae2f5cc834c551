package identity

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"mesh-controller/embedded/sqlite"
)

// IssuedUser is a broker user the controller signed for a module, a host
// (recorded by Join) or a builder.
type IssuedUser struct {
	Pub    string
	Kind   string
	Node   string
	Module string
}

// RecordIssuedUser keeps a user issued, so it can be revoked later.
func (s *Store) RecordIssuedUser(ctx context.Context, u IssuedUser, now time.Time) (err error) {
	defer s.db.Failing(&err, "record an issued user")
	_, err = s.db.Exec(ctx, `INSERT INTO issued_users (pub, kind, node, module, issued_at) VALUES (?, ?, ?, ?, ?)`,
		u.Pub, u.Kind, u.Node, u.Module, sqlite.FormatTime(now))
	if err != nil {
		return err
	}
	return nil
}

// RevokeModuleUsers revokes every live user issued for a module, returning
// how many.
func (s *Store) RevokeModuleUsers(ctx context.Context, module string, now time.Time) (_ int, err error) {
	defer s.db.Failing(&err, "revoke the users of %s", module)
	res, err := s.db.Exec(ctx, `UPDATE issued_users SET revoked_at = ? WHERE module = ? AND revoked_at IS NULL`,
		sqlite.FormatTime(now), module)
	if err != nil {
		return 0, err
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

// Revoked returns every revoked user and when it was revoked.
func (s *Store) Revoked(ctx context.Context) (_ map[string]time.Time, err error) {
	defer s.db.Failing(&err, "read revoked users")
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT pub, revoked_at FROM issued_users WHERE revoked_at IS NOT NULL`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]time.Time{}
	for rows.Next() {
		var pub string
		var at sql.NullString
		if err := rows.Scan(&pub, &at); err != nil {
			return nil, err
		}
		t, err := sqlite.ParseTime(at.String)
		if err != nil {
			return nil, err
		}
		out[pub] = t
	}
	return out, rows.Err()
}

// HandIssuedModuleUsers returns the live module users issued by hand
// (module issue), which end with their module's assignment as those the
// mesh made do.
func (s *Store) HandIssuedModuleUsers(ctx context.Context) (_ []IssuedUser, err error) {
	defer s.db.Failing(&err, "read the module users issued by hand")
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT pub, kind, node, module FROM issued_users
		WHERE kind = 'module' AND sealed = '' AND revoked_at IS NULL`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []IssuedUser
	for rows.Next() {
		var u IssuedUser
		if err := rows.Scan(&u.Pub, &u.Kind, &u.Node, &u.Module); err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, rows.Err()
}

// ModuleUser is a module's own broker user on a node, as the mesh made it:
// its .creds sealed to the node alone.
type ModuleUser struct {
	Pub     string
	Node    string
	Module  string
	Version string
	Sealed  string
}

// ModuleUsers returns the live module users the mesh made (not those
// issued by hand), by node/module, each with its sealed .creds.
func (s *Store) ModuleUsers(ctx context.Context) (_ map[string]ModuleUser, err error) {
	defer s.db.Failing(&err, "read module users")
	return s.moduleUsers(ctx, true)
}

// ModuleUsersUnsealed is ModuleUsers without the sealed .creds: what
// judging which users to make, keep or revoke needs. The sealed copies are
// most of the bytes (about 2 KB a user).
func (s *Store) ModuleUsersUnsealed(ctx context.Context) (_ map[string]ModuleUser, err error) {
	defer s.db.Failing(&err, "read module users")
	return s.moduleUsers(ctx, false)
}

// moduleUsers reads the live module users, the latest of a node/module
// should two be live, in one read transaction: first which they are (in
// the order they were issued), then, if asked, their sealed copies, by key
// and unsorted (sorted, the sealed copies were carried through the sort).
func (s *Store) moduleUsers(ctx context.Context, sealed bool) (map[string]ModuleUser, error) {
	tx, err := s.db.Reader.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	const live = `FROM issued_users WHERE kind = 'module' AND sealed != '' AND revoked_at IS NULL`
	rows, err := tx.QueryContext(ctx, `SELECT pub, node, module, version `+live+` ORDER BY issued_at`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]ModuleUser{}
	for rows.Next() {
		var u ModuleUser
		if err := rows.Scan(&u.Pub, &u.Node, &u.Module, &u.Version); err != nil {
			return nil, err
		}
		out[u.Node+"/"+u.Module] = u // the latest, should two be live
	}
	if err := rows.Err(); err != nil || !sealed {
		return out, err
	}
	rows.Close()
	keyOf := make(map[string]string, len(out))
	for k, u := range out {
		keyOf[u.Pub] = k
	}
	rows, err = tx.QueryContext(ctx, `SELECT pub, sealed `+live)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var pub, sealedCopy string
		if err := rows.Scan(&pub, &sealedCopy); err != nil {
			return nil, err
		}
		if k, ok := keyOf[pub]; ok {
			u := out[k]
			u.Sealed = sealedCopy
			out[k] = u
		}
	}
	return out, rows.Err()
}

// KeepModuleUsers records the module users made, revokes those they
// replace or that are no longer wanted, and moves those kept across a
// version (moved) to their new one, in one transaction. One made for a
// node/module/version that has a live user already is not kept: an act and
// a catch-up making one at once keep one.
func (s *Store) KeepModuleUsers(ctx context.Context, made []ModuleUser, revoke []string, moved []ModuleUser, now time.Time) (err error) {
	defer s.db.Failing(&err, "keep module users")
	at := sqlite.FormatTime(now)
	return s.db.Write(ctx, func(tx *sql.Tx) error {
		// An upgrade moves every node's user of the module.
		stmts := sqlite.Prepared(tx)
		defer stmts.Close()
		for _, u := range moved {
			if _, err := stmts.ExecContext(ctx, `UPDATE issued_users SET version = ? WHERE pub = ? AND revoked_at IS NULL`, u.Version, u.Pub); err != nil {
				return fmt.Errorf("keep module user: %w", err)
			}
		}
		for _, pub := range revoke {
			if _, err := stmts.ExecContext(ctx, `UPDATE issued_users SET revoked_at = ? WHERE pub = ? AND revoked_at IS NULL`, at, pub); err != nil {
				return fmt.Errorf("revoke module user: %w", err)
			}
		}
		for _, u := range made {
			var n int
			if err := stmts.QueryRowContext(ctx, `SELECT count(*) FROM issued_users WHERE kind = 'module' AND node = ? AND module = ? AND version = ?
				AND sealed != '' AND revoked_at IS NULL`, u.Node, u.Module, u.Version).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				continue
			}
			if _, err := stmts.ExecContext(ctx, `INSERT INTO issued_users (pub, kind, node, module, version, sealed, issued_at) VALUES (?, 'module', ?, ?, ?, ?, ?)`,
				u.Pub, u.Node, u.Module, u.Version, u.Sealed, at); err != nil {
				return fmt.Errorf("record module user: %w", err)
			}
		}
		return nil
	})
}
