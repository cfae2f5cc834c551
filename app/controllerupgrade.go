package app

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"mesh-controller/app/daemon"
	"mesh-controller/app/metrics"
	"mesh-controller/contexts/identity"
	"mesh-controller/embedded/sqlite"
)

// The controller upgraded in place: a newer binary started on the stores an
// older one served. serve migrates stores whose schema is behind its own,
// but never beneath a live controller: while one serves, it refuses (an
// embedded broker cannot be shared) or, with --broker, stands by, and
// migrates once the lease lapses, the identity store first, in the
// transactions that check no one took the lease meanwhile. Once the
// identity store is migrated, a controller older than it can no longer
// take the lease (identity migration 0008). A controller that finds the
// stores newer than it knows stands aside and says so (newerStores).

// migrateBehind migrates the stores this process found behind its schema
// (Stores.behind) once no controller serves them, and makes this server
// anew on them; nil when none was behind.
func (c *Server) migrateBehind(ctx context.Context, o ServeOptions, m *metrics.Metrics, log *slog.Logger) ([]Migrated, error) {
	st := c.all
	if len(st.behind) == 0 {
		return nil, nil
	}
	for _, name := range Contexts {
		if err := st.failed[name]; err != nil && st.behind[name] == nil {
			return nil, err // not only behind: refused as every command refuses it
		}
	}
	ids := identity.NewStore(st.behindOrOpen("identity"))
	for {
		if c.Broker == "" {
			l, err := ids.Lease(ctx)
			if err != nil {
				return nil, err
			}
			if l != nil && l.ExpiresAt.After(c.Now()) {
				return nil, &identity.LeaseHeldError{Lease: *l}
			}
		} else if err := daemon.StandBy(ctx, ids, c.Now, daemon.Options{LeaseTTL: o.LeaseTTL, Version: o.Version, Log: log, Standing: o.Standing, Metrics: m}); err != nil {
			return nil, err
		}
		done, err := c.migrateStores(ctx, st, ids)
		var held *identity.LeaseHeldError
		if errors.As(err, &held) && c.Broker != "" {
			continue // taken while this one looked: stand by again
		}
		if err != nil {
			return done, err
		}
		log.Info("migrated: the stores were behind this binary", "version", daemon.ShownVersion(o.Version), "stores", migratedShown(done))
		*c = *NewServer(c.Controller, st)
		return done, nil
	}
}

// behindOrOpen is a context's store, open or kept open behind.
func (st *Stores) behindOrOpen(name string) *sqlite.DB {
	if db := st.behind[name]; db != nil {
		return db
	}
	return st.dbs[name]
}

// migrateStores migrates every store kept behind, the identity store
// first under a guard that refuses while a controller holds the lease, and
// opens each as current.
func (c *Server) migrateStores(ctx context.Context, st *Stores, ids *identity.Store) ([]Migrated, error) {
	order := append([]string{"identity"}, Contexts...)
	var done []Migrated
	seen := map[string]bool{}
	for _, name := range order {
		db := st.behind[name]
		if db == nil || seen[name] {
			continue
		}
		seen[name] = true
		var guard func(context.Context, *sql.Tx) error
		if name == "identity" {
			guard = ids.NoLiveLease(c.Now())
		}
		m, err := c.migrateOne(ctx, name, db.Location, db, nil, false, guard)
		if err != nil {
			return done, err
		}
		done = append(done, m)
		delete(st.behind, name)
		delete(st.failed, name)
		st.dbs[name] = db
	}
	st.typed()
	return done, c.migratedBy(ctx, st.dbs["identity"], done)
}

// migratedShown says, for the log, what each store moved from and to.
func migratedShown(done []Migrated) string {
	var parts []string
	for _, m := range done {
		parts = append(parts, fmt.Sprintf("%s %d -> %d", m.Context, m.From, m.To))
	}
	return strings.Join(parts, ", ")
}

// newerStores says why this controller must never take the lease: a
// store's schema is newer than this binary knows, a newer controller
// having migrated them. "" when none is.
func (c *Server) newerStores(ctx context.Context) (string, error) {
	st := c.all
	var newer []string
	for _, name := range Contexts {
		db := st.dbs[name]
		if db == nil {
			continue
		}
		if _, err := db.Version(ctx, migrationsOf()[name]); errors.Is(err, sqlite.ErrSchemaNewer) {
			newer = append(newer, name)
		} else if err != nil && !errors.Is(err, sqlite.ErrBehind) {
			return "", err
		}
	}
	if len(newer) == 0 {
		return "", nil
	}
	named := ""
	if st.Identity != nil {
		if v, err := st.Identity.Controller(ctx); err == nil && v != "" {
			named = ", mesh-controller " + v
		}
	}
	return fmt.Sprintf("the stores were migrated by a newer controller%s (%s newer than this binary knows); this one is %s: upgrade it",
		named, strings.Join(newer, ", "), daemon.ShownVersion(c.Version)), nil
}
