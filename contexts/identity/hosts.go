package identity

import (
	"context"
	"crypto/ed25519"
	"database/sql"
	"errors"
	"time"

	"mesh-controller/embedded/sqlite"
)

// Why a join token is refused.
var (
	ErrTokenUnknown   = sqlite.Refusal("this token is not known")
	ErrTokenOtherNode = sqlite.Refusal("this token is for another node")
	ErrTokenUsed      = sqlite.Refusal("this token was used already")
	ErrTokenRevoked   = sqlite.Refusal("this token was replaced by a newer one")
	ErrTokenExpired   = sqlite.Refusal("this token has expired")
	// ErrNKeyUsed means a host presented a broker nkey a user was issued
	// for before: a host makes a new one for every join.
	ErrNKeyUsed = sqlite.Refusal("this nkey was issued a broker user before")
)

// Host is the keys a node's host presented when it joined.
type Host struct {
	Node         string
	HostKey      ed25519.PublicKey
	AgeRecipient string
	NKey         string
	HostVersion  string
	// Protocol is the protocol its host speaks, as last heard ("" until a
	// controller that records it heard the host).
	Protocol string
	JoinedAt time.Time
}

// Join checks a presented token (known, for this node, unused, not replaced,
// unexpired), marks it used, keeps the host's keys and records its broker
// user (its nkey), in one transaction. The node's earlier host users are
// revoked by the same act: a machine that joins as a node replaces the one
// before it. revoked counts them; the caller disconnects them.
//
// A token presented again after its use is refused and remembered
// (reused_count), so that a condition can be raised for it; unless it is
// the same host asking again (Joined.Again).
func (s *Store) Join(ctx context.Context, token string, h Host, now time.Time) (revoked int, err error) {
	out := s.JoinMany(ctx, []HostJoin{{Token: token, Host: h}}, now)
	return out[0].Revoked, out[0].Err
}

// HostJoin is one host presenting a token for its node.
type HostJoin struct {
	Token string
	Host  Host
	// Expires is when the broker user it is given stops admitting it
	// (zero: never).
	Expires time.Time
}

// Joined is what became of one HostJoin: the earlier host users of its node
// it revoked, or why it was refused (an Err… value) or failed.
type Joined struct {
	Revoked int
	// Again means the host that used the token asked again, with the same
	// keys, within AskedAgainWithin of its use: the answer to its first ask
	// did not reach it (it came after the host stopped waiting, as under a
	// flood of joins). Nothing is recorded anew; it is to be answered
	// again. Whoever else presented that request could not use the answer:
	// it is sealed to the host's age key, for the host's nkey.
	Again bool
	Err   error
}

// AskedAgainWithin is how long after a token's use the host that used it
// may ask again for its answer: a host asks again for a minute at most
// (mesh-host join).
const AskedAgainWithin = 2 * time.Minute

// JoinMany admits many hosts as Join admits one, each judged alone and
// exactly as Join judges it, in one transaction: a rack of machines joining
// at once is a write per batch, not one per machine. Each join stands or
// falls alone (a savepoint each); two in one batch presenting one token are
// judged in order, and the second is refused as used. out[i] is joins[i]'s.
func (s *Store) JoinMany(ctx context.Context, joins []HostJoin, now time.Time) []Joined {
	out := make([]Joined, len(joins))
	// A refusal that changes nothing is decided by a read, without the
	// writer: a flood of wrong tokens does not hold up this store's writes.
	var pending []int
	read := sqlite.Prepared(s.db.Reader)
	defer read.Close()
	for i, j := range joins {
		if refusal, err := checkToken(ctx, read, j.Token, j.Host.Node, now); err != nil {
			out[i].Err = s.db.Failed(err, "join %s", j.Host.Node)
		} else if refusal != nil && !errors.Is(refusal, ErrTokenUsed) {
			out[i].Err = refusal
		} else {
			pending = append(pending, i)
		}
	}
	if len(pending) == 0 {
		return out
	}
	err := s.db.Write(ctx, func(wtx *sql.Tx) error {
		// Each join runs the same statements: parsed once for the batch.
		tx := sqlite.Prepared(wtx)
		defer tx.Close()
		for _, i := range pending {
			if _, err := tx.ExecContext(ctx, `SAVEPOINT host_join`); err != nil {
				return err
			}
			revoked, again, refusal, err := joinOne(ctx, tx, joins[i], now)
			if err != nil {
				// This join alone is undone; the others stand.
				if _, rerr := tx.ExecContext(ctx, `ROLLBACK TO host_join`); rerr != nil {
					return rerr
				}
				out[i].Err = s.db.Failed(err, "join %s", joins[i].Host.Node)
			} else if refusal != nil {
				out[i].Err = refusal
			} else {
				out[i].Revoked, out[i].Again = revoked, again
			}
			if _, err := tx.ExecContext(ctx, `RELEASE host_join`); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		for _, i := range pending {
			out[i] = Joined{Err: s.db.Failed(err, "join %s", joins[i].Host.Node)}
		}
	}
	return out
}

// joinOne is one join within tx: refused (and a used token's reuse
// remembered), or the token marked used, the host's keys kept, its broker
// user recorded and its node's earlier host users revoked; or, for the host
// that used the token asking again, nothing (again).
func joinOne(ctx context.Context, tx sqlite.Runner, j HostJoin, now time.Time) (revoked int, again bool, refusal, err error) {
	token, h := j.Token, j.Host
	if refusal, err = checkToken(ctx, tx, token, h.Node, now); err != nil || refusal != nil {
		if errors.Is(refusal, ErrTokenUsed) {
			if again, err = askedAgain(ctx, tx, j, now); err != nil || again {
				return 0, again, nil, err
			}
			_, err = tx.ExecContext(ctx, `UPDATE join_tokens SET reused_count = reused_count + 1, last_reused_at = ? WHERE hash = ?`,
				sqlite.FormatTime(now), hashToken(token))
		}
		return 0, false, refusal, err
	}
	var issued int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM issued_users WHERE pub = ?`, h.NKey).Scan(&issued); err != nil {
		return 0, false, nil, err
	}
	if issued > 0 {
		return 0, false, ErrNKeyUsed, nil
	}
	if revoked, err = revokeNodeUsers(ctx, tx, []string{h.Node}, "host", now); err != nil {
		return 0, false, nil, err
	}
	if _, err := tx.ExecContext(ctx, `UPDATE join_tokens SET used_at = ? WHERE hash = ?`, sqlite.FormatTime(now), hashToken(token)); err != nil {
		return 0, false, nil, err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO hosts (node, host_key, age_recipient, nkey, host_version, protocol, joined_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (node) DO UPDATE SET host_key = excluded.host_key, age_recipient = excluded.age_recipient, nkey = excluded.nkey, host_version = excluded.host_version, protocol = excluded.protocol, joined_at = excluded.joined_at`,
		h.Node, []byte(h.HostKey), h.AgeRecipient, h.NKey, h.HostVersion, h.Protocol, sqlite.FormatTime(now)); err != nil {
		return 0, false, nil, err
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO issued_users (pub, kind, node, issued_at, expires_at) VALUES (?, 'host', ?, ?, ?)`,
		h.NKey, h.Node, sqlite.FormatTime(now), nullTime(j.Expires))
	return revoked, false, nil, err
}

// askedAgain says whether j, presenting a used token, is the host that used
// it asking again within AskedAgainWithin: its node's host has the keys it
// presents, and that host's broker user is not revoked (no machine joined as
// the node since, no one removed it). Its user's expiry becomes the one
// the answer made again gives it.
func askedAgain(ctx context.Context, tx sqlite.Runner, j HostJoin, now time.Time) (bool, error) {
	h := j.Host
	var n int
	err := tx.QueryRowContext(ctx, `SELECT count(*) FROM join_tokens t
		JOIN hosts h ON h.node = t.node
		JOIN issued_users u ON u.pub = h.nkey AND u.node = h.node
		WHERE t.hash = ? AND t.node = ? AND t.used_at >= ? AND h.host_key = ? AND h.age_recipient = ? AND h.nkey = ? AND u.revoked_at IS NULL`,
		hashToken(j.Token), h.Node, sqlite.FormatTime(now.Add(-AskedAgainWithin)), []byte(h.HostKey), h.AgeRecipient, h.NKey).Scan(&n)
	if err != nil || n == 0 {
		return false, err
	}
	_, err = tx.ExecContext(ctx, `UPDATE issued_users SET expires_at = ? WHERE pub = ?`, nullTime(j.Expires), h.NKey)
	return err == nil, err
}

// nullTime is t as the store keeps a time that may be none: NULL for zero.
func nullTime(t time.Time) sql.NullString {
	if t.IsZero() {
		return sql.NullString{}
	}
	return sql.NullString{String: sqlite.FormatTime(t), Valid: true}
}

// checkToken says why a token does not admit node now (an Err… value), or
// nil if it does.
func checkToken(ctx context.Context, q querier, token, node string, now time.Time) (refusal, err error) {
	var tokenNode, expires string
	var used, revoked sql.NullString
	err = q.QueryRowContext(ctx, `SELECT node, expires_at, used_at, revoked_at FROM join_tokens WHERE hash = ?`, hashToken(token)).
		Scan(&tokenNode, &expires, &used, &revoked)
	if errors.Is(err, sql.ErrNoRows) {
		return ErrTokenUnknown, nil
	}
	if err != nil {
		return nil, err
	}
	exp, err := sqlite.ParseTime(expires)
	if err != nil {
		return nil, err
	}
	switch {
	case tokenNode != node:
		return ErrTokenOtherNode, nil
	case used.Valid:
		return ErrTokenUsed, nil
	case revoked.Valid:
		return ErrTokenRevoked, nil
	case !now.Before(exp):
		return ErrTokenExpired, nil
	}
	return nil, nil
}

// Hosts returns every joined host's keys.
func (s *Store) Hosts(ctx context.Context) (_ []Host, err error) {
	defer s.db.Failing(&err, "list hosts")
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT node, host_key, age_recipient, nkey, host_version, protocol, joined_at FROM hosts ORDER BY node`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var hs []Host
	for rows.Next() {
		var h Host
		var key []byte
		var joined string
		if err := rows.Scan(&h.Node, &key, &h.AgeRecipient, &h.NKey, &h.HostVersion, &h.Protocol, &joined); err != nil {
			return nil, err
		}
		h.HostKey = key
		if h.JoinedAt, err = sqlite.ParseTime(joined); err != nil {
			return nil, err
		}
		hs = append(hs, h)
	}
	return hs, rows.Err()
}

// HostVersion is what a joined node's host runs: its build and the
// protocol it speaks.
type HostVersion struct {
	Node string
	// Version is the build version its host said at join.
	Version string
	// Protocol is the protocol its host was last heard speaking ("" until
	// a controller that records it heard it).
	Protocol string
}

// HostVersions lists every joined host's build and protocol, by node.
func (s *Store) HostVersions(ctx context.Context) (_ []HostVersion, err error) {
	defer s.db.Failing(&err, "list the hosts' versions")
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT node, host_version, protocol FROM hosts ORDER BY node`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []HostVersion
	for rows.Next() {
		var h HostVersion
		if err := rows.Scan(&h.Node, &h.Version, &h.Protocol); err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, rows.Err()
}

// HeardProtocol records the protocol a node's host was last heard
// speaking: the daemon writes it only when it changed.
func (s *Store) HeardProtocol(ctx context.Context, node, protocol string) (err error) {
	defer s.db.Failing(&err, "record the protocol of %s", node)
	_, err = s.db.Exec(ctx, `UPDATE hosts SET protocol = ? WHERE node = ?`, protocol, node)
	return err
}

// NodeTokenReuses counts how often a node's used tokens were presented again.
func (s *Store) NodeTokenReuses(ctx context.Context, node string) (_ int, err error) {
	defer s.db.Failing(&err, "count the token reuses of %s", node)
	var n int
	err = s.db.Reader.QueryRowContext(ctx, `SELECT coalesce(sum(reused_count), 0) FROM join_tokens WHERE node = ?`, node).Scan(&n)
	return n, err
}
