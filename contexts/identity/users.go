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
func (s *Store) RecordIssuedUser(ctx context.Context, u IssuedUser, now time.Time) error {
	_, err := s.db.Writer.ExecContext(ctx, `INSERT INTO issued_users (pub, kind, node, module, issued_at) VALUES (?, ?, ?, ?, ?)`,
		u.Pub, u.Kind, u.Node, u.Module, sqlite.FormatTime(now))
	if err != nil {
		return fmt.Errorf("record issued user: %w", err)
	}
	return nil
}

// RevokeModuleUsers revokes every live user issued for a module, returning
// how many.
func (s *Store) RevokeModuleUsers(ctx context.Context, module string, now time.Time) (int, error) {
	res, err := s.db.Writer.ExecContext(ctx, `UPDATE issued_users SET revoked_at = ? WHERE module = ? AND revoked_at IS NULL`,
		sqlite.FormatTime(now), module)
	if err != nil {
		return 0, fmt.Errorf("revoke users of %s: %w", module, err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

// Revoked returns every revoked user and when it was revoked.
func (s *Store) Revoked(ctx context.Context) (map[string]time.Time, error) {
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
