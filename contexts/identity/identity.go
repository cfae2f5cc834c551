// Package identity owns the controller's signing key, join tokens, the
// broker's keys, the broker users issued and revoked, the hosts that joined
// and their keys, the lease, and the identity store. (The operator's public
// key lives with the secrets.) It imports no other context.
package identity

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"strings"
	"sync/atomic"
	"time"

	"mesh-controller/embedded/sqlite"
)

// ErrNoSigningKey means the store has no signing key: it has not been migrated.
var ErrNoSigningKey = sqlite.Refusal("no signing key")

// SigningKey is the controller's ed25519 key. Its private half never leaves
// this package except as signatures.
type SigningKey struct {
	// Public is the key hosts verify declarations with.
	Public ed25519.PublicKey
	// CreatedAt is when the first migrate made it.
	CreatedAt time.Time
	private   ed25519.PrivateKey
}

// Sign signs msg.
func (k SigningKey) Sign(msg []byte) []byte { return ed25519.Sign(k.private, msg) }

// PublicBase64 is the public key as standard base64.
func (k SigningKey) PublicBase64() string { return base64.StdEncoding.EncodeToString(k.Public) }

// Fingerprint is a short, readable digest of the public key: the first 8
// bytes of its SHA-256 in four groups, e.g. 1a2b-3c4d-5e6f-7a8b.
func (k SigningKey) Fingerprint() string {
	sum := sha256.Sum256(k.Public)
	h := hex.EncodeToString(sum[:8])
	return h[0:4] + "-" + h[4:8] + "-" + h[8:12] + "-" + h[12:16]
}

// Store is the identity context's store.
type Store struct {
	db *sqlite.DB
	// knowsVersions is set once the store was seen to record controllers'
	// versions (migration 0008).
	knowsVersions atomic.Bool
}

// NewStore wraps an open, migrated identity store.
func NewStore(db *sqlite.DB) *Store { return &Store{db: db} }

// EnsureSigningKey makes the signing key if the store has none. made says
// whether this call made it.
func (s *Store) EnsureSigningKey(ctx context.Context, now time.Time) (key SigningKey, made bool, err error) {
	defer s.db.Failing(&err, "make signing key")
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		key, err = signingKey(ctx, tx)
		if err == nil || !errors.Is(err, ErrNoSigningKey) {
			return err
		}
		pub, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO signing_keys (public_key, private_key, created_at) VALUES (?, ?, ?)`,
			[]byte(pub), []byte(priv), sqlite.FormatTime(now)); err != nil {
			return err
		}
		made = true
		key, err = signingKey(ctx, tx)
		return err
	})
	if err != nil {
		return SigningKey{}, false, err
	}
	return key, made, nil
}

// SigningKey returns the controller's signing key, or ErrNoSigningKey.
func (s *Store) SigningKey(ctx context.Context) (_ SigningKey, err error) {
	defer s.db.Failing(&err, "read signing key")
	k, err := signingKey(ctx, s.db.Reader)
	if err != nil {
		return SigningKey{}, err
	}
	return k, nil
}

type querier interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}

func signingKey(ctx context.Context, q querier) (SigningKey, error) {
	var pub, priv []byte
	var created string
	err := q.QueryRowContext(ctx, `SELECT public_key, private_key, created_at FROM signing_keys ORDER BY id DESC LIMIT 1`).
		Scan(&pub, &priv, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return SigningKey{}, ErrNoSigningKey
	}
	if err != nil {
		return SigningKey{}, err
	}
	t, err := sqlite.ParseTime(created)
	if err != nil {
		return SigningKey{}, err
	}
	return SigningKey{Public: pub, private: priv, CreatedAt: t}, nil
}

// tokenPrefix makes a join token recognisable (to a person, and to secret scanners).
const tokenPrefix = "meshjoin_"

// Token is a one-time right to join, as the store keeps it: never the token itself.
type Token struct {
	Node      string
	IssuedAt  time.Time
	ExpiresAt time.Time
	// UsedAt is when a host joined with it; nil while unused.
	UsedAt *time.Time
	// RevokedAt is when a newer token for the same node replaced it unused.
	RevokedAt *time.Time
}

// State is how a token stands at now: used, revoked, expired or usable.
func (t Token) State(now time.Time) string {
	switch {
	case t.UsedAt != nil:
		return "used"
	case t.RevokedAt != nil:
		return "revoked"
	case !now.Before(t.ExpiresAt):
		return "expired"
	}
	return "usable"
}

func hashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// IssueToken makes a join token for node, valid for ttl. Earlier unused
// tokens of that node are revoked, so at most one is usable at a time;
// revoked counts them. The token is returned once and stored only as its hash.
func (s *Store) IssueToken(ctx context.Context, node string, ttl time.Duration, now time.Time) (token string, t Token, revoked int, err error) {
	defer s.db.Failing(&err, "issue token for %s", node)
	var raw [20]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", Token{}, 0, err
	}
	token = tokenPrefix + strings.ToLower(base32NoPad.EncodeToString(raw[:]))
	t = Token{Node: node, IssuedAt: now.UTC().Truncate(time.Millisecond), ExpiresAt: now.Add(ttl).UTC().Truncate(time.Millisecond)}
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE join_tokens SET revoked_at = ? WHERE node = ? AND used_at IS NULL AND revoked_at IS NULL AND expires_at > ?`,
			sqlite.FormatTime(now), node, sqlite.FormatTime(now))
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		revoked = int(n)
		_, err = tx.ExecContext(ctx, `INSERT INTO join_tokens (hash, node, issued_at, expires_at) VALUES (?, ?, ?, ?)`,
			hashToken(token), node, sqlite.FormatTime(t.IssuedAt), sqlite.FormatTime(t.ExpiresAt))
		return err
	})
	if err != nil {
		return "", Token{}, 0, err
	}
	return token, t, revoked, nil
}

// Tokens returns every token issued for node, newest first.
func (s *Store) Tokens(ctx context.Context, node string) (_ []Token, err error) {
	defer s.db.Failing(&err, "list tokens of %s", node)
	rows, err := s.db.Reader.QueryContext(ctx,
		`SELECT node, issued_at, expires_at, used_at, revoked_at FROM join_tokens WHERE node = ? ORDER BY issued_at DESC, hash DESC`, node)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ts []Token
	for rows.Next() {
		var t Token
		var issued, expires string
		var used, revoked sql.NullString
		if err := rows.Scan(&t.Node, &issued, &expires, &used, &revoked); err != nil {
			return nil, err
		}
		if t.IssuedAt, err = sqlite.ParseTime(issued); err != nil {
			return nil, err
		}
		if t.ExpiresAt, err = sqlite.ParseTime(expires); err != nil {
			return nil, err
		}
		if t.UsedAt, err = sqlite.ParseNullTime(used); err != nil {
			return nil, err
		}
		if t.RevokedAt, err = sqlite.ParseNullTime(revoked); err != nil {
			return nil, err
		}
		ts = append(ts, t)
	}
	return ts, rows.Err()
}

// TokenReuse counts how often a node's used tokens were presented again.
type TokenReuse struct {
	Node   string
	Count  int
	LastAt time.Time
}

// TokenReuses returns, per node, the reuses of its used tokens.
func (s *Store) TokenReuses(ctx context.Context) (_ []TokenReuse, err error) {
	defer s.db.Failing(&err, "read token reuses")
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT node, sum(reused_count), max(last_reused_at) FROM join_tokens
		WHERE reused_count > 0 GROUP BY node ORDER BY node`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []TokenReuse
	for rows.Next() {
		var r TokenReuse
		var last string
		if err := rows.Scan(&r.Node, &r.Count, &last); err != nil {
			return nil, err
		}
		if r.LastAt, err = sqlite.ParseTime(last); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// IssueTokens makes one join token per node in one transaction, for a
// person adding many machines at once.
func (s *Store) IssueTokens(ctx context.Context, nodes []string, ttl time.Duration, now time.Time) (_ []string, err error) {
	defer s.db.Failing(&err, "issue tokens")
	tokens := make([]string, len(nodes))
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		stmt, err := tx.PrepareContext(ctx, `INSERT INTO join_tokens (hash, node, issued_at, expires_at) VALUES (?, ?, ?, ?)`)
		if err != nil {
			return err
		}
		defer stmt.Close()
		for i, n := range nodes {
			var raw [20]byte
			if _, err := rand.Read(raw[:]); err != nil {
				return err
			}
			tokens[i] = tokenPrefix + strings.ToLower(base32NoPad.EncodeToString(raw[:]))
			if _, err := stmt.ExecContext(ctx, hashToken(tokens[i]), n, sqlite.FormatTime(now), sqlite.FormatTime(now.Add(ttl))); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return tokens, nil
}

// HasSigningKey says whether a store (migrated or not, even empty) holds a
// signing key; it reads only, so a store is judged before it is migrated.
func HasSigningKey(ctx context.Context, db *sqlite.DB) (bool, error) {
	has, err := db.HasTable(ctx, "signing_keys")
	if err != nil {
		return false, db.Failed(err, "look for the signing key")
	}
	if !has {
		return false, nil
	}
	var keys int
	if err := db.Reader.QueryRowContext(ctx, `SELECT count(*) FROM signing_keys`).Scan(&keys); err != nil {
		return false, db.Failed(err, "look for the signing key")
	}
	return keys > 0, nil
}
