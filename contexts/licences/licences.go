// Package licences owns model-access licences under the names people call
// them: each version of their tokens, their holders and managers, every
// sealed copy, their history, and the licences store. Like the secrets
// store it never holds a plaintext: only age armor and the keys each copy
// is sealed to. It imports no other context.
package licences

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"mesh-controller/embedded/sqlite"
)

var (
	// ErrExists means a licence of that name is kept already.
	ErrExists = sqlite.Refusal("is a licence already")
	// ErrNoLicence means no licence of that name is kept.
	ErrNoLicence = sqlite.Refusal("is not a licence")
	// ErrHeld means the module holds the licence already.
	ErrHeld = sqlite.Refusal("holds it already")
	// ErrNotHeld means the module does not hold the licence.
	ErrNotHeld = sqlite.Refusal("does not hold it")
	// ErrVersionMoved means the licence's current version changed while a
	// copy of the one read was being sealed.
	ErrVersionMoved = sqlite.Refusal("its version changed meanwhile")
	// ErrNotArmor means a copy is not age armor: the store keeps nothing else.
	ErrNotArmor = sqlite.Refusal("a copy is not age armor")
)

// Kinds of sealed copy.
const (
	// KindOperator is the token sealed to the operator key alone.
	KindOperator = "operator"
	// KindHolder is the token sealed to a holder's node and the operator.
	KindHolder = "holder"
	// KindRefresh is the refresh token, sealed to the operator and the
	// manager's node (none until a manager is named).
	KindRefresh = "refresh"
)

// armorPrefix is how every age armor begins; the schema checks it too.
const armorPrefix = "-----BEGIN AGE ENCRYPTED FILE-----"

// Licence is one licence as a person named it.
type Licence struct {
	Name        string
	Provider    string
	Refreshable bool
	// Version is the current version of its token.
	Version int64
	// Expires is when the current version runs out, nil if it does not say.
	Expires *time.Time
	Made    time.Time
	// ManagerNode and ManagerModule hold the refresh token, "" until named.
	ManagerNode, ManagerModule string
	Holders                    []Holder
}

// Holder is a module on a node that holds a licence.
type Holder struct {
	Node, Module string
	Since        time.Time
}

func (h Holder) String() string { return h.Node + "/" + h.Module }

// Copy is one sealed copy of one version of a licence.
type Copy struct {
	Licence string
	Version int64
	Kind    string
	// Node and Module are a holder's or the manager's, "" for the
	// operator's own copy.
	Node, Module string
	// NodeRecipient is the node's age recipient it is sealed to, "" if none.
	NodeRecipient string
	// OperatorKey is the operator key's recipient it is sealed to.
	OperatorKey string
	Sealed      string
	SealedAt    time.Time
}

// Store is the licences context's store.
type Store struct {
	db *sqlite.DB
}

// NewStore wraps an open, migrated licences store.
func NewStore(db *sqlite.DB) *Store { return &Store{db: db} }

func checkArmor(cs []Copy) error {
	for _, c := range cs {
		if !strings.HasPrefix(c.Sealed, armorPrefix) {
			return fmt.Errorf("%s version %d %s copy: %w", c.Licence, c.Version, c.Kind, ErrNotArmor)
		}
	}
	return nil
}

func optTime(t *time.Time) any {
	if t == nil {
		return nil
	}
	return sqlite.FormatTime(*t)
}

func scanOptTime(s sql.NullString) (*time.Time, error) {
	if !s.Valid {
		return nil, nil
	}
	t, err := sqlite.ParseTime(s.String)
	return &t, err
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// Add keeps a new licence at version 1 with its first copies (the
// operator's own, and a refreshable licence's refresh token), in one
// transaction.
func (s *Store) Add(ctx context.Context, l Licence, copies []Copy, now time.Time) (err error) {
	defer s.db.Failing(&err, "add licence %s", l.Name)
	if err := checkArmor(copies); err != nil {
		return err
	}
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM licences WHERE name = ?`, l.Name).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return fmt.Errorf("%s %w", l.Name, ErrExists)
		}
		refreshable := 0
		if l.Refreshable {
			refreshable = 1
		}
		at := sqlite.FormatTime(now)
		if _, err := tx.ExecContext(ctx, `INSERT INTO licences (name, provider, refreshable, version, expires, made) VALUES (?, ?, ?, 1, ?, ?)`,
			l.Name, l.Provider, refreshable, optTime(l.Expires), at); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO licence_versions (licence, version, made_by, made, expires) VALUES (?, 1, 'person', ?, ?)`,
			l.Name, at, optTime(l.Expires)); err != nil {
			return err
		}
		for _, c := range copies {
			c.Licence, c.Version = l.Name, 1
			if err := insertCopy(ctx, tx, c, now); err != nil {
				return err
			}
		}
		return history(ctx, tx, l.Name, 1, "added", "", "", now)
	})
	return err
}

func insertCopy(ctx context.Context, tx *sql.Tx, c Copy, now time.Time) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO licence_copies (licence, version, kind, node, module, node_recipient, operator_key, sealed, sealed_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`, c.Licence, c.Version, c.Kind, c.Node, c.Module, nullable(c.NodeRecipient), c.OperatorKey, c.Sealed, sqlite.FormatTime(now))
	return err
}

// currentVersion is a licence's current version, or ErrNoLicence.
func currentVersion(ctx context.Context, tx *sql.Tx, name string) (int64, error) {
	var version int64
	err := tx.QueryRowContext(ctx, `SELECT version FROM licences WHERE name = ?`, name).Scan(&version)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("%s %w", name, ErrNoLicence)
	}
	return version, err
}

func history(ctx context.Context, tx *sql.Tx, licence string, version int64, event, node, module string, now time.Time) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO licence_history (licence, version, event, node, module, at) VALUES (?, ?, ?, ?, ?, ?)`,
		licence, version, event, node, module, sqlite.FormatTime(now))
	return err
}

// Use makes the module on the node a holder of the licence, with its copy
// of version (the version the caller opened and sealed): refused if the
// licence moved on meanwhile, or the module holds it already.
func (s *Store) Use(ctx context.Context, c Copy, now time.Time) (err error) {
	defer s.db.Failing(&err, "use licence %s on %s/%s", c.Licence, c.Node, c.Module)
	c.Kind = KindHolder
	if err := checkArmor([]Copy{c}); err != nil {
		return err
	}
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		version, err := currentVersion(ctx, tx, c.Licence)
		if err != nil {
			return err
		}
		if version != c.Version {
			return fmt.Errorf("%s: %w (version %d, not %d)", c.Licence, ErrVersionMoved, version, c.Version)
		}
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM licence_holders WHERE licence = ? AND node = ? AND module = ?`,
			c.Licence, c.Node, c.Module).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return fmt.Errorf("%s/%s %w", c.Node, c.Module, ErrHeld)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO licence_holders (licence, node, module, since) VALUES (?, ?, ?, ?)`,
			c.Licence, c.Node, c.Module, sqlite.FormatTime(now)); err != nil {
			return err
		}
		if err := insertCopy(ctx, tx, c, now); err != nil {
			return err
		}
		return history(ctx, tx, c.Licence, version, "used", c.Node, c.Module, now)
	})
	return err
}

// Stop takes the licence away from the module on the node: it is no longer
// a holder, and every copy sealed to it for that module is dropped.
func (s *Store) Stop(ctx context.Context, licence, node, module string, now time.Time) (err error) {
	defer s.db.Failing(&err, "stop licence %s on %s/%s", licence, node, module)
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		version, err := currentVersion(ctx, tx, licence)
		if err != nil {
			return err
		}
		held, err := dropHolder(ctx, tx, licence, version, node, module, now)
		if err == nil && !held {
			err = fmt.Errorf("%s/%s %w", node, module, ErrNotHeld)
		}
		return err
	})
	return err
}

// dropHolder takes the licence away from the module on the node, with
// every copy sealed to it, and says whether it held it.
func dropHolder(ctx context.Context, tx *sql.Tx, licence string, version int64, node, module string, now time.Time) (bool, error) {
	res, err := tx.ExecContext(ctx, `DELETE FROM licence_holders WHERE licence = ? AND node = ? AND module = ?`, licence, node, module)
	if err != nil {
		return false, err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return false, err
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM licence_copies WHERE licence = ? AND kind = 'holder' AND node = ? AND module = ?`,
		licence, node, module); err != nil {
		return false, err
	}
	return true, history(ctx, tx, licence, version, "stopped", node, module, now)
}

// Forget takes every licence away from modules on nodes (unassigned,
// forgotten or their node removed), in one transaction, and returns the
// licences each held, by node/module. A licence one of them managed is
// left without a manager (its refresh copy for it dropped): a refresh
// then refuses rather than ask a module that is gone.
func (s *Store) Forget(ctx context.Context, holders []Holder, now time.Time) (_ map[string][]string, err error) {
	defer s.db.Failing(&err, "forget the licences of %d modules", len(holders))
	out := map[string][]string{}
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		clear(out)
		for _, h := range holders {
			names, versions, err := namesVersions(ctx, tx, `SELECT h.licence, l.version FROM licence_holders h JOIN licences l ON l.name = h.licence
				WHERE h.node = ? AND h.module = ? ORDER BY h.licence`, h.Node, h.Module)
			if err != nil {
				return err
			}
			for i, name := range names {
				if _, err := dropHolder(ctx, tx, name, versions[i], h.Node, h.Module, now); err != nil {
					return err
				}
			}
			if len(names) > 0 {
				out[h.String()] = names
			}
			if err := dropManager(ctx, tx, h, now); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// namesVersions reads the (licence, version) pairs a query selects.
func namesVersions(ctx context.Context, tx *sql.Tx, q string, args ...any) ([]string, []int64, error) {
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	var names []string
	var versions []int64
	for rows.Next() {
		var name string
		var v int64
		if err := rows.Scan(&name, &v); err != nil {
			return nil, nil, err
		}
		names, versions = append(names, name), append(versions, v)
	}
	return names, versions, rows.Err()
}

// dropManager leaves the licences a module on a node manages without a
// manager, with a manager event naming none.
func dropManager(ctx context.Context, tx *sql.Tx, h Holder, now time.Time) error {
	names, versions, err := namesVersions(ctx, tx, `SELECT name, version FROM licences WHERE manager_node = ? AND manager_module = ? ORDER BY name`,
		h.Node, h.Module)
	if err != nil {
		return err
	}
	for i, name := range names {
		if _, err := tx.ExecContext(ctx, `UPDATE licences SET manager_node = NULL, manager_module = NULL WHERE name = ?`, name); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM licence_copies WHERE licence = ? AND kind = 'refresh' AND node = ? AND module = ?`,
			name, h.Node, h.Module); err != nil {
			return err
		}
		if err := history(ctx, tx, name, versions[i], "manager", "", "", now); err != nil {
			return err
		}
	}
	return nil
}

const licenceColumns = `name, provider, refreshable, version, expires, made, coalesce(manager_node, ''), coalesce(manager_module, '')`

func scanLicence(sc interface{ Scan(...any) error }) (Licence, error) {
	var l Licence
	var refreshable int
	var expires sql.NullString
	var made string
	if err := sc.Scan(&l.Name, &l.Provider, &refreshable, &l.Version, &expires, &made, &l.ManagerNode, &l.ManagerModule); err != nil {
		return Licence{}, err
	}
	l.Refreshable = refreshable == 1
	var err error
	if l.Expires, err = sqlite.ParseNullTime(expires); err != nil {
		return Licence{}, err
	}
	l.Made, err = sqlite.ParseTime(made)
	return l, err
}

// Licence returns one licence with its holders, or ErrNoLicence.
func (s *Store) Licence(ctx context.Context, name string) (_ Licence, err error) {
	defer s.db.Failing(&err, "read licence %s", name)
	l, err := scanLicence(s.db.Reader.QueryRowContext(ctx, `SELECT `+licenceColumns+` FROM licences WHERE name = ?`, name))
	if errors.Is(err, sql.ErrNoRows) {
		return Licence{}, fmt.Errorf("%s %w", name, ErrNoLicence)
	}
	if err != nil {
		return Licence{}, err
	}
	hs, err := s.holders(ctx, name)
	if err != nil {
		return Licence{}, err
	}
	l.Holders = hs[name]
	return l, nil
}

// holders are the holders of one licence (name) or of all (""), by licence.
func (s *Store) holders(ctx context.Context, name string) (map[string][]Holder, error) {
	q, args := `SELECT licence, node, module, since FROM licence_holders`, []any{}
	if name != "" {
		q, args = q+` WHERE licence = ?`, append(args, name)
	}
	rows, err := s.db.Reader.QueryContext(ctx, q+` ORDER BY licence, node, module`, args...)
	if err != nil {
		return nil, fmt.Errorf("read licence holders: %w", err)
	}
	defer rows.Close()
	out := map[string][]Holder{}
	for rows.Next() {
		var l, since string
		var h Holder
		if err := rows.Scan(&l, &h.Node, &h.Module, &since); err != nil {
			return nil, err
		}
		if h.Since, err = sqlite.ParseTime(since); err != nil {
			return nil, err
		}
		out[l] = append(out[l], h)
	}
	return out, rows.Err()
}

// List returns every licence with its holders, by name.
func (s *Store) List(ctx context.Context) (_ []Licence, err error) {
	defer s.db.Failing(&err, "list licences")
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT `+licenceColumns+` FROM licences ORDER BY name`)
	if err != nil {
		return nil, err
	}
	out := []Licence{}
	for rows.Next() {
		l, err := scanLicence(rows)
		if err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, l)
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	hs, err := s.holders(ctx, "")
	if err != nil {
		return nil, err
	}
	for i := range out {
		out[i].Holders = hs[out[i].Name]
	}
	return out, nil
}

const copyColumns = `licence, version, kind, node, module, coalesce(node_recipient, ''), operator_key, sealed, sealed_at`

// copies reads copies matching a WHERE clause built from its filters.
func (s *Store) copies(ctx context.Context, where string, args ...any) ([]Copy, error) {
	q := `SELECT ` + copyColumns + ` FROM licence_copies`
	if where != "" {
		q += ` WHERE ` + where
	}
	rows, err := s.db.Reader.QueryContext(ctx, q+` ORDER BY licence, version, kind, node, module`, args...)
	if err != nil {
		return nil, fmt.Errorf("read licence copies: %w", err)
	}
	defer rows.Close()
	out := []Copy{}
	for rows.Next() {
		var c Copy
		var at string
		if err := rows.Scan(&c.Licence, &c.Version, &c.Kind, &c.Node, &c.Module, &c.NodeRecipient, &c.OperatorKey, &c.Sealed, &at); err != nil {
			return nil, err
		}
		if c.SealedAt, err = sqlite.ParseTime(at); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// Copies returns every sealed copy of every version of a licence, or of
// every licence when name is "".
func (s *Store) Copies(ctx context.Context, name string) (_ []Copy, err error) {
	defer s.db.Failing(&err, "read the copies of licence %s", name)
	if name == "" {
		return s.copies(ctx, "")
	}
	return s.copies(ctx, `licence = ?`, name)
}

// OperatorCopy returns the operator's own copy of a licence's version (0:
// the current one), or ErrNoLicence.
func (s *Store) OperatorCopy(ctx context.Context, name string, version int64) (_ Copy, err error) {
	defer s.db.Failing(&err, "read the operator's copy of licence %s", name)
	where, args := `kind = 'operator' AND licence = ? AND version = `, []any{name}
	if version == 0 {
		where += `(SELECT version FROM licences WHERE name = ?)`
		args = append(args, name)
	} else {
		where += `?`
		args = append(args, version)
	}
	cs, err := s.copies(ctx, where, args...)
	if err != nil {
		return Copy{}, err
	}
	if len(cs) == 0 {
		if version == 0 {
			return Copy{}, fmt.Errorf("%s %w", name, ErrNoLicence)
		}
		return Copy{}, fmt.Errorf("%s version %d: %w", name, version, ErrNoCopy)
	}
	return cs[0], nil
}

// ErrNoCopy means no copy of that version is kept (never made, or
// discarded after its grace period).
var ErrNoCopy = sqlite.Refusal("no copy of that version is kept")

// Held returns the copies of the current version each holder holds: what
// the planner declares, by node/module.
func (s *Store) Held(ctx context.Context) (_ map[string][]Copy, err error) {
	defer s.db.Failing(&err, "read the licences held")
	return byHolder(s.copies(ctx, `kind = 'holder' AND version = (SELECT version FROM licences WHERE name = licence_copies.licence)`))
}

// byHolder keys copies by node/module.
func byHolder(cs []Copy, err error) (map[string][]Copy, error) {
	if err != nil {
		return nil, err
	}
	out := map[string][]Copy{}
	for _, c := range cs {
		k := c.Node + "/" + c.Module
		out[k] = append(out[k], c)
	}
	return out, nil
}

// SealedTo counts the copies of every licence by the operator key each is
// sealed to: what each key can recover, without reading a ciphertext.
func (s *Store) SealedTo(ctx context.Context) (_ map[string]int, err error) {
	defer s.db.Failing(&err, "count licence copies")
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT operator_key, count(*) FROM licence_copies GROUP BY operator_key`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var key string
		var n int
		if err := rows.Scan(&key, &n); err != nil {
			return nil, err
		}
		out[key] = n
	}
	return out, rows.Err()
}

// More refusals of the second half: managers and refreshes.
var (
	// ErrNotRefreshable means the licence has no refresh token: it is
	// replaced by a person, never refreshed.
	ErrNotRefreshable = sqlite.Refusal("is not refreshable")
	// ErrNoManager means no manager is named for the licence yet.
	ErrNoManager = sqlite.Refusal("has no manager")
)

// GracePeriod is how long a superseded version's copies stay recoverable
// by the operator after a refresh replaced it; then they are discarded.
const GracePeriod = 7 * 24 * time.Hour

// SetManager names the module on the node that holds a refreshable
// licence's refresh token, with its copy of it (sealed to that node and
// the operator): the copy of a manager named before is dropped. It
// returns the node of the manager it replaced, "" if none.
func (s *Store) SetManager(ctx context.Context, c Copy, now time.Time) (_ string, err error) {
	defer s.db.Failing(&err, "set the manager of licence %s", c.Licence)
	c.Kind = KindRefresh
	if err := checkArmor([]Copy{c}); err != nil {
		return "", err
	}
	var before string
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		var refreshable int
		var version int64
		var node sql.NullString
		err := tx.QueryRowContext(ctx, `SELECT refreshable, version, manager_node FROM licences WHERE name = ?`, c.Licence).Scan(&refreshable, &version, &node)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("%s %w", c.Licence, ErrNoLicence)
		}
		if err != nil {
			return err
		}
		if refreshable != 1 {
			return fmt.Errorf("%s %w", c.Licence, ErrNotRefreshable)
		}
		before = node.String
		if _, err := tx.ExecContext(ctx, `DELETE FROM licence_copies WHERE licence = ? AND kind = 'refresh' AND node <> ''`, c.Licence); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE licences SET manager_node = ?, manager_module = ? WHERE name = ?`, c.Node, c.Module, c.Licence); err != nil {
			return err
		}
		if err := insertCopy(ctx, tx, c, now); err != nil {
			return err
		}
		return history(ctx, tx, c.Licence, version, "manager", c.Node, c.Module, now)
	})
	if err != nil {
		return "", err
	}
	return before, err
}

// RefreshCopy returns the operator's own copy of a licence's refresh
// token, or ErrNotRefreshable.
func (s *Store) RefreshCopy(ctx context.Context, name string) (_ Copy, err error) {
	defer s.db.Failing(&err, "read the refresh copy of licence %s", name)
	cs, err := s.copies(ctx, `kind = 'refresh' AND node = '' AND licence = ?`, name)
	if err != nil {
		return Copy{}, err
	}
	if len(cs) == 0 {
		return Copy{}, fmt.Errorf("%s %w", name, ErrNotRefreshable)
	}
	return cs[len(cs)-1], nil
}

// Managed returns the refresh-token copies each manager holds, by
// node/module: what the planner declares beside its licences.
func (s *Store) Managed(ctx context.Context) (_ map[string][]Copy, err error) {
	defer s.db.Failing(&err, "read the managed licences")
	return byHolder(s.copies(ctx, `kind = 'refresh' AND node <> ''`))
}

// Refreshed is a new version of a licence's token, made by its manager:
// the operator's copy and one copy per holder, each sealed already.
type Refreshed struct {
	Licence string
	// From is the version refreshed: refused if the licence moved on.
	From    int64
	Expires *time.Time
	// Operator is the new version's copy sealed to the operator key alone.
	Operator Copy
	// Holders are the new version's copies, one per holder of From.
	Holders []Copy
}

// Refresh keeps a new version of a licence in one transaction: its row,
// the licence's version and expiry, the operator's copy and each holder's,
// the old version kept recoverable by the operator until GracePeriod from
// now (its holder copies dropped at once, so holders move to the new one
// with their next declaration), and a refreshed event. Refused if the
// licence's version moved, or its holders changed, since From was read.
func (s *Store) Refresh(ctx context.Context, r Refreshed, now time.Time) (_ int64, err error) {
	defer s.db.Failing(&err, "refresh licence %s", r.Licence)
	all := append([]Copy{r.Operator}, r.Holders...)
	if err := checkArmor(all); err != nil {
		return 0, err
	}
	next := r.From + 1
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		version, err := currentVersion(ctx, tx, r.Licence)
		if err != nil {
			return err
		}
		held := map[string]bool{}
		rows, err := tx.QueryContext(ctx, `SELECT node, module FROM licence_holders WHERE licence = ?`, r.Licence)
		if err != nil {
			return err
		}
		for rows.Next() {
			var node, module string
			if err := rows.Scan(&node, &module); err != nil {
				rows.Close()
				return err
			}
			held[node+"/"+module] = true
		}
		if err := rows.Close(); err != nil {
			return err
		}
		same := len(held) == len(r.Holders)
		for _, c := range r.Holders {
			same = same && held[c.Node+"/"+c.Module]
		}
		if version != r.From || !same {
			return fmt.Errorf("%s: %w (version %d, %d holders)", r.Licence, ErrVersionMoved, version, len(held))
		}
		at := sqlite.FormatTime(now)
		if _, err := tx.ExecContext(ctx, `INSERT INTO licence_versions (licence, version, made_by, made, expires) VALUES (?, ?, 'refresh', ?, ?)`,
			r.Licence, next, at, optTime(r.Expires)); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE licences SET version = ?, expires = ? WHERE name = ?`, next, optTime(r.Expires), r.Licence); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE licence_versions SET discard_after = ? WHERE licence = ? AND version = ?`,
			sqlite.FormatTime(now.Add(GracePeriod)), r.Licence, r.From); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM licence_copies WHERE licence = ? AND version = ? AND kind = 'holder'`, r.Licence, r.From); err != nil {
			return err
		}
		for _, c := range all {
			c.Licence, c.Version = r.Licence, next
			if err := insertCopy(ctx, tx, c, now); err != nil {
				return err
			}
		}
		return history(ctx, tx, r.Licence, next, "refreshed", "", "", now)
	})
	if err != nil {
		return 0, err
	}
	return next, err
}

// RefreshFailed records that refreshing a licence failed: its holders
// keep the current version. The self-check reads it (Failing).
func (s *Store) RefreshFailed(ctx context.Context, name string, now time.Time) (err error) {
	defer s.db.Failing(&err, "record a failed refresh of licence %s", name)
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		var version int64
		var node, module string
		err := tx.QueryRowContext(ctx, `SELECT version, coalesce(manager_node, ''), coalesce(manager_module, '') FROM licences WHERE name = ?`, name).
			Scan(&version, &node, &module)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("%s %w", name, ErrNoLicence)
		}
		if err != nil {
			return err
		}
		return history(ctx, tx, name, version, "refresh-failed", node, module, now)
	})
	return err
}

// Failing returns, by licence, when its last refresh failed: those whose
// last refresh-failed event comes after their last refreshed one.
func (s *Store) Failing(ctx context.Context) (_ map[string]time.Time, err error) {
	defer s.db.Failing(&err, "read failed refreshes")
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT licence, event, at FROM licence_history WHERE event IN ('refreshed', 'refresh-failed') ORDER BY id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]time.Time{}
	for rows.Next() {
		var l, event, at string
		if err := rows.Scan(&l, &event, &at); err != nil {
			return nil, err
		}
		if event == "refreshed" {
			delete(out, l)
			continue
		}
		if out[l], err = sqlite.ParseTime(at); err != nil {
			return nil, err
		}
	}
	return out, rows.Err()
}

// Discard drops the copies of superseded versions whose grace period
// ended by now (the refresh token's copies are kept: a refresh does not
// replace it), at most limit versions, each with a discarded event, and
// returns how many versions it discarded.
func (s *Store) Discard(ctx context.Context, now time.Time, limit int) (_ int, err error) {
	defer s.db.Failing(&err, "discard superseded licence versions")
	n := 0
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		n = 0
		names, versions, err := namesVersions(ctx, tx, `SELECT v.licence, v.version FROM licence_versions v WHERE v.discard_after IS NOT NULL AND v.discard_after <= ?
			AND EXISTS (SELECT 1 FROM licence_copies c WHERE c.licence = v.licence AND c.version = v.version AND c.kind <> 'refresh')
			ORDER BY v.discard_after LIMIT ?`, sqlite.FormatTime(now), limit)
		if err != nil {
			return err
		}
		for i, name := range names {
			if _, err := tx.ExecContext(ctx, `DELETE FROM licence_copies WHERE licence = ? AND version = ? AND kind <> 'refresh'`, name, versions[i]); err != nil {
				return err
			}
			if err := history(ctx, tx, name, versions[i], "discarded", "", "", now); err != nil {
				return err
			}
		}
		n = len(names)
		return nil
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// Due returns the refreshable licences with a manager whose current
// version has lived past part of its life (made to expires) by now: those
// serve refreshes by itself.
func (s *Store) Due(ctx context.Context, part float64, now time.Time) (_ []Licence, err error) {
	defer s.db.Failing(&err, "read licences due a refresh")
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT l.name, l.version, l.expires, v.made FROM licences l
		JOIN licence_versions v ON v.licence = l.name AND v.version = l.version
		WHERE l.refreshable = 1 AND l.manager_node IS NOT NULL AND l.expires IS NOT NULL ORDER BY l.name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Licence
	for rows.Next() {
		var l Licence
		var expires, made string
		if err := rows.Scan(&l.Name, &l.Version, &expires, &made); err != nil {
			return nil, err
		}
		e, err := sqlite.ParseTime(expires)
		if err != nil {
			return nil, err
		}
		m, err := sqlite.ParseTime(made)
		if err != nil {
			return nil, err
		}
		if due := m.Add(time.Duration(float64(e.Sub(m)) * part)); !now.Before(due) {
			l.Expires, l.Made = &e, m
			out = append(out, l)
		}
	}
	return out, rows.Err()
}

// AllHolders returns every module on a node that holds or manages a
// licence, each once, by node then module: what serve's catch-up compares
// with what is assigned, to forget what an act stopped half-way left held.
func (s *Store) AllHolders(ctx context.Context) (_ []Holder, err error) {
	defer s.db.Failing(&err, "list holders")
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT node, module FROM licence_holders
		UNION SELECT manager_node, manager_module FROM licences WHERE manager_node IS NOT NULL
		ORDER BY 1, 2`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Holder
	for rows.Next() {
		var h Holder
		if err := rows.Scan(&h.Node, &h.Module); err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, rows.Err()
}
