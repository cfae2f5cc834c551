// Package secrets owns every sealed copy of every secret, the operator's
// public keys, and their history, and the secrets store. It never holds a
// plaintext: what it keeps is age ciphertext and the ids of the keys it is
// sealed to. It imports no other context.
package secrets

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"mesh-controller/embedded/sqlite"
)

var (
	// ErrNoOperatorKey means no operator key is set: no secret can be made.
	ErrNoOperatorKey = sqlite.Refusal("no operator key is set")
	// ErrOperatorKeySet means a key is set already and --replace was not given.
	ErrOperatorKeySet = sqlite.Refusal("an operator key is set already")
	// ErrNoSecret means no sealed copy of that secret is kept.
	ErrNoSecret = sqlite.Refusal("no sealed copy of that secret")
)

// OperatorKey is an operator's age public key.
type OperatorKey struct {
	ID         int64
	Recipient  string
	SetAt      time.Time
	ReplacedAt *time.Time
}

// Copy is a secret's current sealed copy.
type Copy struct {
	Node, Module, Name string
	Version            int64
	MadeBy             string
	NodeRecipient      string
	// OperatorKey is the recipient of the operator key it is sealed to.
	OperatorKey string
	Sealed      string
	SealedAt    time.Time
}

// Store is the secrets context's store.
type Store struct {
	db *sqlite.DB
}

// NewStore wraps an open, migrated secrets store.
func NewStore(db *sqlite.DB) *Store { return &Store{db: db} }

// SetOperatorKey makes recipient the key the mesh seals to. A second key is
// refused unless replace; the replaced key stays known, for the copies
// sealed to it.
func (s *Store) SetOperatorKey(ctx context.Context, recipient string, replace bool, now time.Time) (previous *OperatorKey, err error) {
	defer s.db.Failing(&err, "set the operator key")
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		cur, err := current(ctx, tx)
		if err != nil && !errors.Is(err, ErrNoOperatorKey) {
			return err
		}
		if cur != nil && cur.Recipient == recipient {
			return fmt.Errorf("%w: it is this one", ErrOperatorKeySet)
		}
		if cur != nil && !replace {
			return ErrOperatorKeySet
		}
		if cur != nil {
			previous = cur
			if _, err := tx.ExecContext(ctx, `UPDATE operator_keys SET replaced_at = ? WHERE id = ?`, sqlite.FormatTime(now), cur.ID); err != nil {
				return err
			}
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO operator_keys (recipient, set_at) VALUES (?, ?)`, recipient, sqlite.FormatTime(now))
		return err
	})
	return previous, err
}

type rowQuerier interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}

func current(ctx context.Context, q rowQuerier) (*OperatorKey, error) {
	var k OperatorKey
	var set string
	err := q.QueryRowContext(ctx, `SELECT id, recipient, set_at FROM operator_keys WHERE replaced_at IS NULL ORDER BY id DESC LIMIT 1`).
		Scan(&k.ID, &k.Recipient, &set)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNoOperatorKey
	}
	if err != nil {
		return nil, err
	}
	if k.SetAt, err = sqlite.ParseTime(set); err != nil {
		return nil, err
	}
	return &k, nil
}

// OperatorKey returns the current operator key, or ErrNoOperatorKey.
func (s *Store) OperatorKey(ctx context.Context) (_ OperatorKey, err error) {
	defer s.db.Failing(&err, "read the operator key")
	k, err := current(ctx, s.db.Reader)
	if err != nil {
		return OperatorKey{}, err
	}
	return *k, nil
}

// Recoverable counts the copies the current key opens, and those only an
// older key opens.
func (s *Store) Recoverable(ctx context.Context) (current, onlyOlder int, err error) {
	defer s.db.Failing(&err, "count what the operator key can recover")
	err = s.db.Reader.QueryRowContext(ctx, `SELECT
		coalesce(sum(CASE WHEN k.replaced_at IS NULL THEN 1 ELSE 0 END), 0),
		coalesce(sum(CASE WHEN k.replaced_at IS NOT NULL THEN 1 ELSE 0 END), 0)
		FROM sealed s JOIN operator_keys k ON k.id = s.operator_key`).Scan(&current, &onlyOlder)
	return current, onlyOlder, err
}

// Keep stores a secret's new sealed copy (the next version) and its history,
// in one transaction. seal is given the version and must seal to the
// current operator key, whose recipient it is given.
func (s *Store) Keep(ctx context.Context, c Copy, event string, seal func(version int64, operatorKey string) (string, error), now time.Time) (_ Copy, err error) {
	defer s.db.Failing(&err, "keep secret %s/%s/%s", c.Node, c.Module, c.Name)
	kept, err := s.KeepAll(ctx, []Keeping{{Copy: c, Event: event, Seal: seal}}, now)
	if err != nil {
		return Copy{}, err
	}
	return kept[0], nil
}

// Keeping is one secret's next copy to keep.
type Keeping struct {
	Copy  Copy
	Event string
	// Seal is given the version and the current operator key's recipient,
	// and seals the value to it (and to the node).
	Seal func(version int64, operatorKey string) (string, error)
	// IfMissing keeps it only if the secret has no copy yet: a secret the
	// mesh makes is made once, however many acts and catch-ups ask for it.
	IfMissing bool
}

// KeepAll keeps many secrets' next copies in one transaction: an act that
// makes several secrets makes all or none. It returns the copies kept (one
// skipped as IfMissing is not returned).
func (s *Store) KeepAll(ctx context.Context, ks []Keeping, now time.Time) (_ []Copy, err error) {
	defer s.db.Failing(&err, "keep %d secrets", len(ks))
	var kept []Copy
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		kept = kept[:0]
		key, err := current(ctx, tx)
		if err != nil {
			return err
		}
		for _, k := range ks {
			c := k.Copy
			if k.IfMissing {
				var n int
				if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM sealed WHERE node = ? AND module = ? AND name = ?`, c.Node, c.Module, c.Name).Scan(&n); err != nil {
					return err
				}
				if n > 0 {
					continue
				}
			}
			var last int64
			if err := tx.QueryRowContext(ctx, `SELECT coalesce(max(version), 0) FROM secret_history WHERE node = ? AND module = ? AND name = ?`,
				c.Node, c.Module, c.Name).Scan(&last); err != nil {
				return err
			}
			c.Version, c.OperatorKey, c.SealedAt = last+1, key.Recipient, now.UTC().Truncate(time.Millisecond)
			if c.Sealed, err = k.Seal(c.Version, key.Recipient); err != nil {
				return fmt.Errorf("seal %s/%s/%s: %w", c.Node, c.Module, c.Name, err)
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO sealed (node, module, name, version, made_by, node_recipient, operator_key, sealed, sealed_at)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (node, module, name) DO UPDATE SET version = excluded.version, made_by = excluded.made_by, node_recipient = excluded.node_recipient, operator_key = excluded.operator_key, sealed = excluded.sealed, sealed_at = excluded.sealed_at`, c.Node, c.Module, c.Name, c.Version, c.MadeBy, c.NodeRecipient, key.ID, c.Sealed, sqlite.FormatTime(now)); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO secret_history (node, module, name, version, event, at) VALUES (?, ?, ?, ?, ?, ?)`,
				c.Node, c.Module, c.Name, c.Version, k.Event, sqlite.FormatTime(now)); err != nil {
				return err
			}
			kept = append(kept, c)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return kept, nil
}

// Names lists every secret that has a copy, as node/module/name: what the
// mesh holds, without reading a ciphertext.
func (s *Store) Names(ctx context.Context) (_ map[string]bool, err error) {
	defer s.db.Failing(&err, "list secrets")
	names, err := sqlite.Strings(ctx, s.db.Reader, `SELECT node || '/' || module || '/' || name FROM sealed`)
	if err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(names))
	for _, n := range names {
		out[n] = true
	}
	return out, nil
}

const copyColumns = `s.node, s.module, s.name, s.version, s.made_by, s.node_recipient, k.recipient, s.sealed, s.sealed_at`

func scanCopy(sc interface{ Scan(...any) error }) (Copy, error) {
	var c Copy
	var at string
	if err := sc.Scan(&c.Node, &c.Module, &c.Name, &c.Version, &c.MadeBy, &c.NodeRecipient, &c.OperatorKey, &c.Sealed, &at); err != nil {
		return Copy{}, err
	}
	t, err := sqlite.ParseTime(at)
	c.SealedAt = t
	return c, err
}

// Copy returns one secret's sealed copy, or ErrNoSecret.
func (s *Store) Copy(ctx context.Context, node, module, name string) (_ Copy, err error) {
	defer s.db.Failing(&err, "read secret %s/%s/%s", node, module, name)
	c, err := scanCopy(s.db.Reader.QueryRowContext(ctx, `SELECT `+copyColumns+` FROM sealed s JOIN operator_keys k ON k.id = s.operator_key
		WHERE s.node = ? AND s.module = ? AND s.name = ?`, node, module, name))
	if errors.Is(err, sql.ErrNoRows) {
		return Copy{}, fmt.Errorf("%s/%s/%s: %w", node, module, name, ErrNoSecret)
	}
	return c, err
}

// Copies returns every sealed copy, by node, module and name.
func (s *Store) Copies(ctx context.Context) (_ []Copy, err error) {
	defer s.db.Failing(&err, "read the operator-sealed copies")
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT `+copyColumns+` FROM sealed s JOIN operator_keys k ON k.id = s.operator_key
		ORDER BY s.node, s.module, s.name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []Copy{}
	for rows.Next() {
		c, err := scanCopy(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// Forget drops a node's module's sealed copies (unassigned or forgotten), keeping the history.
func (s *Store) Forget(ctx context.Context, node, module string, now time.Time) (err error) {
	defer s.db.Failing(&err, "forget the secrets of %s/%s", node, module)
	return s.db.Write(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO secret_history (node, module, name, version, event, at)
			SELECT node, module, name, version, 'forgotten', ? FROM sealed WHERE node = ? AND module = ?`, sqlite.FormatTime(now), node, module); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `DELETE FROM sealed WHERE node = ? AND module = ?`, node, module)
		return err
	})
}

// Holding is the names of the secrets one node holds for a module.
type Holding struct {
	Node  string   `json:"node"`
	Names []string `json:"names"`
}

// Held lists, per node, the names of the secrets held for a module, by
// node: no ciphertext is read, and no other module's copies.
func (s *Store) Held(ctx context.Context, module string) (_ []Holding, err error) {
	defer s.db.Failing(&err, "read the secrets held for %s", module)
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT node, name FROM sealed WHERE module = ? ORDER BY node, name`, module)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Holding
	for rows.Next() {
		var node, name string
		if err := rows.Scan(&node, &name); err != nil {
			return nil, err
		}
		if len(out) == 0 || out[len(out)-1].Node != node {
			out = append(out, Holding{Node: node})
		}
		out[len(out)-1].Names = append(out[len(out)-1].Names, name)
	}
	return out, rows.Err()
}
