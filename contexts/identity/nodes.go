package identity

import (
	"context"
	"database/sql"
	"time"

	"mesh-controller/embedded/sqlite"
)

// RevokeNodeUsers revokes every live broker user issued for a node: its
// host's and its modules'. The host's user is first recorded among the
// issued users, from the nkey it joined with, if no issued user records it
// yet, so that it is revoked like the others. It returns how many were
// revoked now; revoking again revokes nothing more.
func (s *Store) RevokeNodeUsers(ctx context.Context, node string, now time.Time) (_ int, err error) {
	defer s.db.Failing(&err, "revoke the users of %s", node)
	var n int
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		var err error
		n, err = revokeNodeUsers(ctx, tx, []string{node}, "", now)
		return err
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// revokeNodeUsers revokes every live user of the nodes of kind, or of every
// kind if kind is "". A host that joined before host users were recorded is
// known by the nkey its hosts row keeps: it is recorded first, so that it is
// revoked too.
func revokeNodeUsers(ctx context.Context, tx sqlite.Runner, nodes []string, kind string, now time.Time) (int, error) {
	only := ""
	if kind != "" {
		only = " AND kind = ?"
	}
	revoked := 0
	err := sqlite.InChunks(nodes, func(marks string, args []any) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO issued_users (pub, kind, node, module, issued_at)
			SELECT nkey, 'host', node, '', joined_at FROM hosts WHERE node IN (`+marks+`)
			ON CONFLICT (pub) DO NOTHING`, args...); err != nil {
			return err
		}
		update := append([]any{sqlite.FormatTime(now)}, args...)
		if kind != "" {
			update = append(update, kind)
		}
		res, err := tx.ExecContext(ctx, `UPDATE issued_users SET revoked_at = ? WHERE revoked_at IS NULL AND node IN (`+marks+`)`+only, update...)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		revoked += int(n)
		return nil
	})
	return revoked, err
}

// NodesForgotten is what the identity store let go of for removed nodes.
type NodesForgotten struct {
	// Revoked counts the broker users revoked now.
	Revoked int
	// Hosts counts the joined hosts whose keys were dropped.
	Hosts int
	// Tokens counts the join tokens dropped, used or not.
	Tokens int
}

// ForgetNodes takes removed nodes out of the identity store in one
// transaction: every broker user of theirs revoked (as RevokeNodeUsers),
// the keys their hosts joined with and their join tokens dropped. The
// revocations stay: they are what the broker is told, and a node added
// later under the same name joins with new keys.
func (s *Store) ForgetNodes(ctx context.Context, nodes []string, now time.Time) (_ NodesForgotten, err error) {
	defer s.db.Failing(&err, "forget nodes")
	var f NodesForgotten
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		f = NodesForgotten{}
		var err error
		if f.Revoked, err = revokeNodeUsers(ctx, tx, nodes, "", now); err != nil {
			return err
		}
		return sqlite.InChunks(nodes, func(marks string, args []any) error {
			res, err := tx.ExecContext(ctx, `DELETE FROM hosts WHERE node IN (`+marks+`)`, args...)
			if err != nil {
				return err
			}
			n, _ := res.RowsAffected()
			f.Hosts += int(n)
			if res, err = tx.ExecContext(ctx, `DELETE FROM join_tokens WHERE node IN (`+marks+`)`, args...); err != nil {
				return err
			}
			n, _ = res.RowsAffected()
			f.Tokens += int(n)
			_, err = tx.ExecContext(ctx, `DELETE FROM key_acks WHERE node IN (`+marks+`)`, args...)
			return err
		})
	})
	if err != nil {
		return NodesForgotten{}, err
	}
	return f, nil
}

// KnownNodes returns every node the identity store still knows: a joined
// host's keys, a join token, or a broker user not revoked; by name. Serve's
// catch-up forgets those the inventory no longer has (a node remove killed
// between its two stores).
func (s *Store) KnownNodes(ctx context.Context) (_ []string, err error) {
	defer s.db.Failing(&err, "list known nodes")
	return sqlite.Strings(ctx, s.db.Reader, `SELECT node FROM hosts
		UNION SELECT node FROM join_tokens
		UNION SELECT node FROM issued_users WHERE revoked_at IS NULL AND node <> ''
		ORDER BY 1`)
}
