package app

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"mesh-controller/app/daemon"
	"mesh-controller/contexts/identity"
	"mesh-controller/contexts/inventory"
	"mesh-controller/embedded/sqlite"
)

// Migrated is what migrate did to one context's store.
type Migrated struct {
	Context string `json:"context"`
	Store   string `json:"store"`
	From    int    `json:"from"`
	To      int    `json:"to"`
	// Known is how many migrations this binary has for the context.
	Known int `json:"known"`
	// Note says anything else done, e.g. the signing key made.
	Note string `json:"note,omitempty"`
}

// Changed says whether the store's schema moved.
func (m Migrated) Changed() bool { return m.From != m.To || m.Note != "" }

// MigrateOptions shape migrate.
type MigrateOptions struct {
	// NewIdentity makes a new signing key (and broker keys) even though
	// nodes have joined under the lost one: each must then join again.
	NewIdentity bool
}

// ErrIdentityLost means the identity store holds no signing key while the
// inventory says hosts joined under one: a new key would orphan them all.
var ErrIdentityLost = errors.New("the identity store holds no signing key, but nodes joined under one")

// Migrate brings every context's store up to date, creating missing stores,
// and makes the controller's signing key on the first run.
func (c *Controller) Migrate(ctx context.Context) ([]Migrated, error) {
	return c.MigrateWith(ctx, MigrateOptions{})
}

// ErrServed means migrate was asked to change stores a live controller
// serves: changing them beneath it is refused.
var ErrServed = errors.New("a controller serves these stores")

// ServedError is ErrServed, naming the controller that serves.
type ServedError struct{ Lease identity.Lease }

// Error names the controller serving, by pid, host and version.
func (e *ServedError) Error() string {
	return fmt.Sprintf("%v, and their schemas are behind this binary's: pid %d on %s (%s), until %s",
		ErrServed, e.Lease.PID, e.Lease.Host, e.Lease.Shown(), e.Lease.ExpiresAt.UTC().Format(time.RFC3339))
}

// Unwrap is ErrServed.
func (e *ServedError) Unwrap() error { return ErrServed }

// MigrateWith is Migrate with options. It stops at the first store it
// cannot migrate; those before it stay migrated. It refuses to make a new
// signing key while nodes have joined (ErrIdentityLost) unless told to,
// and to change a store while a controller serves (a *ServedError: an
// older controller must not find its stores changed beneath it; a newer
// binary's serve migrates them when it takes the lease over).
func (c *Controller) MigrateWith(ctx context.Context, o MigrateOptions) ([]Migrated, error) {
	// Migrate opens each store itself, with create: it runs before the
	// process opens its stores (a store is open once a process).
	var done []Migrated
	var inv, ids *sqlite.DB
	defer func() {
		for _, db := range []*sqlite.DB{inv, ids} {
			if db != nil {
				db.Close()
			}
		}
	}()
	served, err := c.servedBy(ctx)
	if err != nil {
		return nil, err
	}
	for _, name := range Contexts {
		loc, err := sqlite.Locate(name, c.DataDir, c.Getenv)
		if err != nil {
			return done, &StoreError{Location: loc, Err: err}
		}
		// judge: the identity store still has to be judged kept, once.
		judge := name == "identity" && !o.NewIdentity
		if judge && blank(loc) {
			// Judged before opening: opening would write a header into it.
			if err := identityKept(ctx, nil, inv); err != nil {
				return done, &StoreError{Location: loc, Err: err}
			}
			judge = false
		}
		db, err := sqlite.Open(ctx, loc, true)
		if err != nil {
			return done, &StoreError{Location: loc, Err: err}
		}
		if served != nil {
			if _, err := db.Version(ctx, migrationsOf()[name]); errors.Is(err, sqlite.ErrBehind) {
				db.Close()
				return done, &StoreError{Location: loc, Err: &ServedError{Lease: *served}}
			}
		}
		var guard func(context.Context, *sql.Tx) error
		if name == "identity" {
			guard = identity.NewStore(db).NoLiveLease(c.Now())
		}
		m, err := c.migrateOne(ctx, name, loc, db, inv, judge, guard)
		switch {
		case name == "inventory" && err == nil:
			inv = db // kept open: the identity store is judged against it
		case name == "identity" && err == nil:
			ids = db // kept open: it says who migrated the stores
		default:
			db.Close()
		}
		if err != nil {
			return done, err
		}
		done = append(done, m)
	}
	return done, c.migratedBy(ctx, ids, done)
}

// servedBy is the live lease on these stores, nil when none is held (or
// there is no identity store yet).
func (c *Controller) servedBy(ctx context.Context) (*identity.Lease, error) {
	loc, err := sqlite.Locate("identity", c.DataDir, c.Getenv)
	if err != nil {
		return nil, &StoreError{Location: loc, Err: err}
	}
	if blank(loc) {
		return nil, nil
	}
	db, err := sqlite.Open(ctx, loc, false)
	if errors.Is(err, sqlite.ErrNoStore) {
		return nil, nil
	}
	if err != nil {
		return nil, &StoreError{Location: loc, Err: err}
	}
	defer db.Close()
	if has, err := db.HasTable(ctx, "lease"); err != nil || !has {
		return nil, err
	}
	l, err := identity.NewStore(db).Lease(ctx)
	if err != nil || l == nil || !l.ExpiresAt.After(c.Now()) {
		return nil, err
	}
	return l, nil
}

// migratedBy records this binary's version as the one that migrated the
// stores, when any moved: an older controller refused by them names it.
func (c *Controller) migratedBy(ctx context.Context, ids *sqlite.DB, done []Migrated) error {
	if ids == nil || !slices.ContainsFunc(done, func(m Migrated) bool { return m.From != m.To }) {
		return nil
	}
	return identity.NewStore(ids).MigratedBy(ctx, daemon.ShownVersion(c.Version))
}

// migrateOne migrates one open store; judge asks that the identity store be
// judged kept (identityKept) first, and guard (if set) is asked in each
// migration's transaction (sqlite.MigrateGuarded).
func (c *Controller) migrateOne(ctx context.Context, name string, loc sqlite.Location, db *sqlite.DB, inv *sqlite.DB, judge bool, guard func(context.Context, *sql.Tx) error) (Migrated, error) {
	ms := migrationsOf()[name]
	if judge {
		if err := identityKept(ctx, db, inv); err != nil {
			return Migrated{}, &StoreError{Location: loc, Err: err}
		}
	}
	from, to, err := db.MigrateGuarded(ctx, ms, c.Now(), guard)
	if err != nil {
		return Migrated{}, &StoreError{Location: loc, Err: err}
	}
	m := Migrated{Context: name, Store: loc.Shown(), From: from, To: to, Known: len(ms)}
	if name == "inventory" {
		// The overlay's ULA prefix is random (crypto/rand), which SQL
		// cannot make: made here once, so a mesh recorded before the
		// overlay existed has one too.
		if err := inventory.NewStore(db).EnsureOverlayPrefix(ctx); err != nil {
			return m, &StoreError{Location: loc, Err: err}
		}
	}
	if name != "identity" {
		return m, nil
	}
	ids := identity.NewStore(db)
	key, made, err := ids.EnsureSigningKey(ctx, c.Now())
	if err != nil {
		return m, err
	}
	if made {
		m.Note = "signing key made: " + key.Fingerprint()
	}
	madeBroker, err := ids.EnsureBrokerKeys(ctx, newBrokerSeeds, c.Now())
	if err != nil {
		return m, err
	}
	if madeBroker {
		m.Note = strings.TrimPrefix(m.Note+"; broker keys made", "; ")
	}
	return m, nil
}

// blank says a store's file is missing or empty (a file: URI without a path
// is neither).
func blank(loc sqlite.Location) bool {
	path := loc.FilePath()
	if path == "" {
		return false
	}
	fi, err := os.Lstat(path)
	return errors.Is(err, os.ErrNotExist) || (err == nil && fi.Mode().IsRegular() && fi.Size() == 0)
}

// identityKept refuses an identity store without a signing key (missing,
// empty, or emptied; db nil means blank) while the inventory says nodes joined: they trust only the
// key that was, and a new one would orphan every host.
func identityKept(ctx context.Context, db, inv *sqlite.DB) error {
	if inv == nil {
		return nil
	}
	if db != nil {
		has, err := identity.HasSigningKey(ctx, db)
		if err != nil || has {
			return err
		}
	}
	joined, err := inventory.NewStore(inv).JoinedNodes(ctx)
	if err != nil || len(joined) == 0 {
		return err
	}
	names := joined
	if len(names) > 5 {
		names = append(names[:5:5], fmt.Sprintf("and %d more", len(joined)-5))
	}
	return fmt.Errorf("%w (%d joined: %s)", ErrIdentityLost, len(joined), strings.Join(names, ", "))
}
