package identity

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"mesh-controller/embedded/sqlite"
)

// ErrOverlapRunning means a rotation was asked while hosts still accept the
// key before the current one: at most two keys are accepted at once.
var ErrOverlapRunning = sqlite.Refusal("the previous rotation's overlap has not ended")

// KeyLink is one rotation of the signing key as kept: a link of the chain
// hosts follow, the announcement signed by the old key and the new one.
// The public halves stay here for good; the old private half is deleted
// when the link is retired.
type KeyLink struct {
	Sequence     int64
	OldKey       ed25519.PublicKey
	NewKey       ed25519.PublicKey
	MadeAt       time.Time
	OverlapUntil time.Time
	// Announcement is the canonical announcement both keys signed.
	Announcement string
	OldSignature string
	NewSignature string
	Why          string
	// RetiredAt is when the old key was let go; nil while it overlaps.
	RetiredAt *time.Time
}

// Announce makes a rotation's announcement: its canonical bytes, signed by
// the old key and by the new (protocol's, which this context does not
// import).
type Announce func(sequence int64, old, next SigningKey, at, overlapUntil time.Time) (announcement, oldSignature, newSignature string, err error)

// Rotate makes a new signing key and the link announcing it, in one
// transaction: from then on SigningKey is the new key, and hosts accept
// the old one until now+overlap. A rotation while the previous one's
// overlap runs is refused (ErrOverlapRunning); a link whose overlap ended
// is retired first.
func (s *Store) Rotate(ctx context.Context, overlap time.Duration, why string, announce Announce, now time.Time) (link KeyLink, err error) {
	defer s.db.Failing(&err, "rotate the signing key")
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		if _, err := retireKeys(ctx, tx, now); err != nil {
			return err
		}
		links, err := keyLinks(ctx, tx, "WHERE retired_at IS NULL")
		if err != nil {
			return err
		}
		if len(links) > 0 {
			return fmt.Errorf("%w: hosts accept the key before the current one until %s", ErrOverlapRunning,
				links[len(links)-1].OverlapUntil.UTC().Format(time.RFC3339))
		}
		old, err := signingKey(ctx, tx)
		if err != nil {
			return err
		}
		var seq int64
		if err := tx.QueryRowContext(ctx, `SELECT coalesce(max(sequence), 0) + 1 FROM key_links`).Scan(&seq); err != nil {
			return err
		}
		pub, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return err
		}
		next := SigningKey{Public: pub, CreatedAt: now, private: priv}
		until := now.Add(overlap)
		ann, oldSig, newSig, err := announce(seq, old, next, now, until)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO signing_keys (public_key, private_key, created_at) VALUES (?, ?, ?)`,
			[]byte(pub), []byte(priv), sqlite.FormatTime(now)); err != nil {
			return err
		}
		link = KeyLink{Sequence: seq, OldKey: old.Public, NewKey: pub, MadeAt: now, OverlapUntil: until,
			Announcement: ann, OldSignature: oldSig, NewSignature: newSig, Why: why}
		_, err = tx.ExecContext(ctx, `INSERT INTO key_links (sequence, old_key, new_key, made_at, overlap_until, announcement, old_signature, new_signature, why)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`, seq, []byte(link.OldKey), []byte(link.NewKey), sqlite.FormatTime(now), sqlite.FormatTime(until),
			ann, oldSig, newSig, why)
		return err
	})
	if err != nil {
		return KeyLink{}, err
	}
	return link, nil
}

// RetireKeys retires every link whose overlap ended by now: the old key's
// private half is deleted (only the current key signs), its public half
// stays in the chain. It returns the links it retired.
func (s *Store) RetireKeys(ctx context.Context, now time.Time) (retired []KeyLink, err error) {
	defer s.db.Failing(&err, "retire signing keys")
	// Most calls find nothing to retire: a read, not the writer.
	due, err := keyLinks(ctx, s.db.Reader, "WHERE retired_at IS NULL AND overlap_until <= ?", sqlite.FormatTime(now))
	if err != nil || len(due) == 0 {
		return nil, err
	}
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		retired, err = retireKeys(ctx, tx, now)
		return err
	})
	return retired, err
}

func retireKeys(ctx context.Context, tx *sql.Tx, now time.Time) ([]KeyLink, error) {
	at := sqlite.FormatTime(now)
	due, err := keyLinks(ctx, tx, "WHERE retired_at IS NULL AND overlap_until <= ?", at)
	if err != nil || len(due) == 0 {
		return nil, err
	}
	if _, err := tx.ExecContext(ctx, `UPDATE key_links SET retired_at = ? WHERE retired_at IS NULL AND overlap_until <= ?`, at, at); err != nil {
		return nil, err
	}
	// Only the newest key signs; the keys before it that still overlap are
	// those of links not retired, whose old keys stay.
	if _, err := tx.ExecContext(ctx, `DELETE FROM signing_keys WHERE id < (SELECT max(id) FROM signing_keys)
		AND public_key NOT IN (SELECT old_key FROM key_links WHERE retired_at IS NULL)`); err != nil {
		return nil, err
	}
	for i := range due {
		due[i].RetiredAt = &now
	}
	return due, nil
}

// KeyChain returns every link, oldest first.
func (s *Store) KeyChain(ctx context.Context) (_ []KeyLink, err error) {
	defer s.db.Failing(&err, "read the chain of signing keys")
	return keyLinks(ctx, s.db.Reader, "")
}

type rowsQuerier interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}

func keyLinks(ctx context.Context, q rowsQuerier, where string, args ...any) ([]KeyLink, error) {
	rows, err := q.QueryContext(ctx, `SELECT sequence, old_key, new_key, made_at, overlap_until, announcement, old_signature, new_signature, why, retired_at
		FROM key_links `+where+` ORDER BY sequence`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []KeyLink
	for rows.Next() {
		var l KeyLink
		var oldKey, newKey []byte
		var made, until string
		var retired sql.NullString
		if err := rows.Scan(&l.Sequence, &oldKey, &newKey, &made, &until, &l.Announcement, &l.OldSignature, &l.NewSignature, &l.Why, &retired); err != nil {
			return nil, err
		}
		l.OldKey, l.NewKey = oldKey, newKey
		if l.MadeAt, err = sqlite.ParseTime(made); err != nil {
			return nil, err
		}
		if l.OverlapUntil, err = sqlite.ParseTime(until); err != nil {
			return nil, err
		}
		if l.RetiredAt, err = sqlite.ParseNullTime(retired); err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, rows.Err()
}

// KeyAck is the controller key a node's host says it verifies with, and
// the last chain it refused.
type KeyAck struct {
	Node string
	// Key is the key's id (its fingerprint).
	Key     string
	AckedAt time.Time
	// Refused is why the host last refused a chain; RefusedAt when (nil: never).
	Refused   string
	RefusedAt *time.Time
}

// RecordKeyAcks keeps, per node, the key its host said it verifies with
// (those that changed since the last: the daemon writes only those).
func (s *Store) RecordKeyAcks(ctx context.Context, acks map[string]string, now time.Time) (err error) {
	defer s.db.Failing(&err, "record the keys hosts verify with")
	at := sqlite.FormatTime(now)
	return s.db.Write(ctx, func(tx *sql.Tx) error {
		stmt, err := tx.PrepareContext(ctx, `INSERT INTO key_acks (node, key, acked_at) VALUES (?, ?, ?)
			ON CONFLICT (node) DO UPDATE SET key = excluded.key, acked_at = excluded.acked_at`)
		if err != nil {
			return err
		}
		defer stmt.Close()
		for node, key := range acks {
			if _, err := stmt.ExecContext(ctx, node, key, at); err != nil {
				return err
			}
		}
		return nil
	})
}

// maxRefusedLen bounds why a host says it refused a chain.
const maxRefusedLen = 1024

// RecordKeyRefusal keeps that node's host refused a chain, and why; key is
// the key it goes on verifying with.
func (s *Store) RecordKeyRefusal(ctx context.Context, node, key, refused string, now time.Time) (err error) {
	defer s.db.Failing(&err, "record a chain refused by %s", node)
	if len(refused) > maxRefusedLen {
		refused = refused[:maxRefusedLen]
	}
	at := sqlite.FormatTime(now)
	_, err = s.db.Exec(ctx, `INSERT INTO key_acks (node, key, acked_at, refused, refused_at) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (node) DO UPDATE SET refused = excluded.refused, refused_at = excluded.refused_at`, node, key, at, refused, at)
	return err
}

// KeyAcks returns every node's acknowledgement, by node.
func (s *Store) KeyAcks(ctx context.Context) (_ []KeyAck, err error) {
	defer s.db.Failing(&err, "read the keys hosts verify with")
	return keyAcks(ctx, s.db.Reader, "")
}

// KeyAcksOtherThan returns the acknowledgements of nodes whose host
// verifies with a key other than key (the current one), by node: a read of
// the few behind, not of every node.
func (s *Store) KeyAcksOtherThan(ctx context.Context, key string) (_ []KeyAck, err error) {
	defer s.db.Failing(&err, "read the hosts behind the current key")
	return keyAcks(ctx, s.db.Reader, "WHERE key != ?", key)
}

func keyAcks(ctx context.Context, q rowsQuerier, where string, args ...any) ([]KeyAck, error) {
	rows, err := q.QueryContext(ctx, `SELECT node, key, acked_at, refused, refused_at FROM key_acks `+where+` ORDER BY node`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []KeyAck
	for rows.Next() {
		var a KeyAck
		var acked string
		var refusedAt sql.NullString
		if err := rows.Scan(&a.Node, &a.Key, &acked, &a.Refused, &refusedAt); err != nil {
			return nil, err
		}
		if a.AckedAt, err = sqlite.ParseTime(acked); err != nil {
			return nil, err
		}
		if a.RefusedAt, err = sqlite.ParseNullTime(refusedAt); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

// ErrHostUnknown means a renewal named a node no host joined as (or one
// forgotten since).
var ErrHostUnknown = sqlite.Refusal("no host joined as this node")

// RenewHost records the broker user a node's host renewed its credential
// for (nkey, expiring at expires) as the node's current one, in one
// transaction: the user it replaces stays recorded until it expires (a
// node forgotten meanwhile revokes it), and the node's superseded users
// that expired are forgotten, so the store keeps at most a few per node.
// A nkey issued a user before is refused (ErrNKeyUsed), and a node with
// no host (ErrHostUnknown).
//
// A user issued before credentials expired never expires by itself: once
// superseded twice (its host connects as the one after it since the first
// renewal) it is revoked, and revoked counts it; the caller has the broker
// told.
func (s *Store) RenewHost(ctx context.Context, node, nkey string, expires, now time.Time) (h Host, revoked int, err error) {
	defer s.db.Failing(&err, "renew the credential of %s", node)
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		var key []byte
		var joined string
		err := tx.QueryRowContext(ctx, `SELECT node, host_key, age_recipient, nkey, host_version, joined_at FROM hosts WHERE node = ?`, node).
			Scan(&h.Node, &key, &h.AgeRecipient, &h.NKey, &h.HostVersion, &joined)
		if errors.Is(err, sql.ErrNoRows) {
			return ErrHostUnknown
		}
		if err != nil {
			return err
		}
		h.HostKey = key
		if h.JoinedAt, err = sqlite.ParseTime(joined); err != nil {
			return err
		}
		var issued int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM issued_users WHERE pub = ?`, nkey).Scan(&issued); err != nil {
			return err
		}
		if issued > 0 {
			return ErrNKeyUsed
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM issued_users WHERE node = ? AND kind = 'host' AND pub != ? AND revoked_at IS NULL
			AND expires_at IS NOT NULL AND expires_at <= ?`, node, h.NKey, sqlite.FormatTime(now)); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `UPDATE issued_users SET revoked_at = ? WHERE node = ? AND kind = 'host' AND pub != ? AND revoked_at IS NULL
			AND expires_at IS NULL`, sqlite.FormatTime(now), node, h.NKey)
		if err != nil {
			return err
		}
		n, _ := res.RowsAffected()
		revoked = int(n)
		if _, err := tx.ExecContext(ctx, `INSERT INTO issued_users (pub, kind, node, issued_at, expires_at) VALUES (?, 'host', ?, ?, ?)`,
			nkey, node, sqlite.FormatTime(now), sqlite.FormatTime(expires)); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `UPDATE hosts SET nkey = ? WHERE node = ?`, nkey, node)
		h.NKey = nkey
		return err
	})
	if err != nil {
		return Host{}, 0, err
	}
	return h, revoked, nil
}

// HostUsers returns the live broker users issued to node's hosts (their
// public nkeys), oldest first.
func (s *Store) HostUsers(ctx context.Context, node string) (_ []string, err error) {
	defer s.db.Failing(&err, "list the host users of %s", node)
	return sqlite.Strings(ctx, s.db.Reader, `SELECT pub FROM issued_users WHERE node = ? AND kind = 'host' AND revoked_at IS NULL ORDER BY issued_at, pub`, node)
}
