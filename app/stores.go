package app

import (
	"context"
	"errors"
	"sync"

	"mesh-controller/contexts/builds"
	"mesh-controller/contexts/health"
	"mesh-controller/contexts/identity"
	"mesh-controller/contexts/inventory"
	"mesh-controller/contexts/licences"
	"mesh-controller/contexts/secrets"
	"mesh-controller/embedded/sqlite"
	"mesh-controller/migrations"
)

// Stores are every context's store, opened once by a process and named, not
// indexed: a use case reads st.Inventory, never dbs[0]. A process opens each
// store file exactly once (sqlite.ErrOpenTwice): the daemon, its self-check
// and a person's command all work through the same handles.
type Stores struct {
	Inventory *inventory.Store
	Identity  *identity.Store
	Secrets   *secrets.Store
	Licences  *licences.Store
	Health    *health.Store
	Builds    *builds.Store
	// dbs are the open files by context, for probes and backups.
	dbs map[string]*sqlite.DB
	// failed are the stores that could not be opened, and why.
	failed map[string]error
	// behind are the failed stores whose schema is only behind this
	// binary's, kept open: serve migrates them (upgrade.go's
	// migrateBehind) once no older controller serves them.
	behind map[string]*sqlite.DB
	// named are the contexts a service's view holds (see view); nil for
	// the process's own, which holds every one.
	named []string
}

// DB is one context's open store, nil if it could not be opened.
func (s *Stores) DB(context string) *sqlite.DB { return s.dbs[context] }

// Failed is why a context's store could not be opened, nil if it is open.
func (s *Stores) Failed(context string) error { return s.failed[context] }

// close closes every open store.
func (s *Stores) close() error {
	var errs []error
	for _, db := range s.dbs {
		errs = append(errs, db.Close())
	}
	for _, db := range s.behind {
		errs = append(errs, db.Close())
	}
	return errors.Join(errs...)
}

// migrationsOf are a context's migrations, read and hashed once per process.
var migrationsOf = sync.OnceValue(func() map[string][]sqlite.Migration {
	out := map[string][]sqlite.Migration{}
	for _, name := range Contexts {
		ms, err := sqlite.LoadMigrations(migrations.For(name))
		if err != nil {
			// The files are embedded: a bad one is a build defect the
			// migrations tests catch, never a person's mistake.
			panic("migrations of " + name + ": " + err.Error())
		}
		out[name] = ms
	}
	return out
})

// OpenStores opens every context's store, once where the process starts,
// and checks each schema is exactly what this binary knows. A store that
// cannot be opened is recorded (Failed, Complete) and the others are still
// opened: the self-check reports each, and every other use case refuses.
func (c *Controller) OpenStores(ctx context.Context) *Stores {
	st := &Stores{dbs: map[string]*sqlite.DB{}, failed: map[string]error{}, behind: map[string]*sqlite.DB{}}
	for _, name := range Contexts {
		db, err := c.openOne(ctx, name)
		if err != nil {
			st.failed[name] = err
			if db != nil {
				st.behind[name] = db
			}
			continue
		}
		st.dbs[name] = db
	}
	st.typed()
	return st
}

// typed makes each open store's typed store.
func (st *Stores) typed() {
	if db := st.dbs["inventory"]; db != nil {
		st.Inventory = inventory.NewStore(db)
	}
	if db := st.dbs["identity"]; db != nil {
		st.Identity = identity.NewStore(db)
	}
	if db := st.dbs["secrets"]; db != nil {
		st.Secrets = secrets.NewStore(db)
	}
	if db := st.dbs["licences"]; db != nil {
		st.Licences = licences.NewStore(db)
	}
	if db := st.dbs["health"]; db != nil {
		st.Health = health.NewStore(db)
	}
	if db := st.dbs["builds"]; db != nil {
		st.Builds = builds.NewStore(db)
	}
}

// openOne opens a context's existing store and checks its schema. A store
// whose schema is only behind this binary's is returned open with its
// error: serve may migrate it.
func (c *Controller) openOne(ctx context.Context, name string) (*sqlite.DB, error) {
	loc, err := sqlite.Locate(name, c.DataDir, c.Getenv)
	if err != nil {
		return nil, &StoreError{Location: loc, Err: err}
	}
	db, err := sqlite.Open(ctx, loc, false)
	if err != nil {
		return nil, &StoreError{Location: loc, Err: err}
	}
	if _, err := db.Version(ctx, migrationsOf()[name]); err != nil {
		if errors.Is(err, sqlite.ErrBehind) {
			return db, &StoreError{Location: loc, Err: err}
		}
		db.Close()
		return nil, &StoreError{Location: loc, Err: err}
	}
	return db, nil
}

// Close closes every store the process opened.
func (s *Stores) Close() error { return s.close() }

// Complete is the first store that could not be opened, nil when every one
// is open: a command never works on part of the mesh.
func (s *Stores) Complete() error {
	for _, name := range Contexts {
		if err := s.failed[name]; err != nil {
			return err
		}
	}
	return nil
}
