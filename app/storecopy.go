package app

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"mesh-controller/contexts/identity"
	"mesh-controller/embedded/sqlite"
)

var (
	// ErrUnknownContext means a store copy names a context the mesh has none of.
	ErrUnknownContext = errors.New("is not a context")
	// ErrCopyTarget means a store copy's --to is not CONTEXT=URL, or names
	// a context twice, or the store it copies from.
	ErrCopyTarget = errors.New("is not a target of store copy")
)

// StoreCopied is what store copy did to one context's store.
type StoreCopied struct {
	Context string `json:"context"`
	// From and To are the stores, as output may show them (no password).
	From string `json:"from"`
	To   string `json:"to"`
	// Tables are each table's rows and content digest, the same read from
	// both ends.
	Tables []sqlite.Count `json:"tables"`
	// Var is the variable to set so that the mesh uses the copy.
	Var string `json:"variable"`
}

// Rows is every row copied.
func (s StoreCopied) Rows() int64 {
	var n int64
	for _, t := range s.Tables {
		n += t.Rows
	}
	return n
}

// StoreCopy copies contexts' stores onto other stores (SQLite to
// PostgreSQL, or back), targets given as context → DSN. It refuses while
// a controller serves (the lease is live: a store in use changes under the
// copy), and any target that holds a row already; it brings each target's
// schema up to this binary's first, copies in one transaction per target,
// then reads both ends again and compares, per table, the rows and their
// content digest. Targets done before a failing one stay copied.
func (c *Copies) StoreCopy(ctx context.Context, targets map[string]string) ([]StoreCopied, error) {
	var names []string
	for name, dsn := range targets {
		if !slices.Contains(Contexts, name) {
			return nil, fmt.Errorf("%q %w (the contexts: %s)", name, ErrUnknownContext, strings.Join(Contexts, ", "))
		}
		if strings.TrimSpace(dsn) == "" {
			return nil, fmt.Errorf("%s= %w: give a URL or path after =", name, ErrCopyTarget)
		}
		names = append(names, name)
	}
	// In the mesh's order of contexts, so that output is the same each time.
	slices.SortFunc(names, func(a, b string) int { return slices.Index(Contexts, a) - slices.Index(Contexts, b) })
	st, err := c.stores(ctx)
	if err != nil {
		return nil, err
	}
	l, err := st.Identity.Lease(ctx)
	if err != nil {
		return nil, err
	}
	if l != nil && l.ExpiresAt.After(c.Now()) {
		return nil, &identity.LeaseHeldError{Lease: *l}
	}
	var done []StoreCopied
	for _, name := range names {
		cp, err := c.copyStore(ctx, st.DB(name), name, targets[name])
		if err != nil {
			return done, err
		}
		done = append(done, cp)
	}
	return done, nil
}

// copyStore copies one open store to the store dsn names.
func (c *Controller) copyStore(ctx context.Context, src *sqlite.DB, name, dsn string) (StoreCopied, error) {
	loc := sqlite.Location{Context: name, DSN: dsn, From: "store copy --to", Var: sqlite.EnvVar(name)}
	if loc.FilePath() != "" && loc.FilePath() == src.Location.FilePath() || dsn == src.Location.DSN {
		return StoreCopied{}, &StoreError{Location: loc, Err: fmt.Errorf("%w: it is the store copied from", ErrCopyTarget)}
	}
	dst, err := sqlite.Open(ctx, loc, true)
	if err != nil {
		return StoreCopied{}, &StoreError{Location: loc, Err: err}
	}
	defer dst.Close()
	if _, _, err := dst.Migrate(ctx, migrationsOf()[name], c.Now()); err != nil {
		return StoreCopied{}, &StoreError{Location: loc, Err: err}
	}
	tables, err := src.Tables(ctx)
	if err != nil {
		return StoreCopied{}, err
	}
	// The target's own account of its tables: the same names and columns
	// (both are at this binary's version), and which column PostgreSQL
	// numbers itself, which SQLite does not say.
	theirs, err := dst.Tables(ctx)
	if err != nil {
		return StoreCopied{}, &StoreError{Location: loc, Err: err}
	}
	byName := map[string]sqlite.Table{}
	for _, t := range theirs {
		byName[t.Name] = t
	}
	for i, t := range tables {
		d, ok := byName[t.Name]
		if !ok || !slices.Equal(d.Columns, t.Columns) || len(theirs) != len(tables) {
			return StoreCopied{}, &StoreError{Location: loc, Err: fmt.Errorf("%w: table %s is not the same at both ends", sqlite.ErrCopyDiffers, t.Name)}
		}
		tables[i].Identity = d.Identity
	}
	// Empty means as the migrations leave it: some seed a row (a store's
	// fence), which the copy replaces with the source's; any other row is
	// someone's, and refused.
	seeds, err := c.seededRows(ctx, name)
	if err != nil {
		return StoreCopied{}, err
	}
	var seeded []string
	for _, t := range tables {
		got, err := sqlite.Digest(ctx, dst.Reader, t)
		if err != nil {
			return StoreCopied{}, &StoreError{Location: loc, Err: err}
		}
		switch {
		case got.Rows == 0:
		case got == seeds[t.Name]:
			seeded = append(seeded, t.Name)
		default:
			return StoreCopied{}, &StoreError{Location: loc, Err: fmt.Errorf("%w: table %s has %d", sqlite.ErrNotEmpty, t.Name, got.Rows)}
		}
	}
	// Compared before the commit, read back through the transaction that
	// wrote them: a copy that differs is rolled back whole.
	cp := StoreCopied{Context: name, From: src.Location.Shown(), To: loc.Shown(), Var: loc.Var}
	err = dst.Write(ctx, func(tx *sql.Tx) error {
		for _, t := range seeded {
			if _, err := tx.ExecContext(ctx, `DELETE FROM `+t); err != nil {
				return err
			}
		}
		if _, err := sqlite.CopyRows(ctx, src, tx, dst.Postgres, tables); err != nil {
			return err
		}
		cp.Tables = nil
		for _, t := range tables {
			want, err := sqlite.Digest(ctx, src.Reader, t)
			if err != nil {
				return err
			}
			got, err := sqlite.Digest(ctx, tx, t)
			if err != nil {
				return err
			}
			if got != want {
				return fmt.Errorf("%w: table %s: %d rows (digest %.12s) copied from %d (%.12s)",
					sqlite.ErrCopyDiffers, t.Name, got.Rows, got.Digest, want.Rows, want.Digest)
			}
			cp.Tables = append(cp.Tables, got)
		}
		return nil
	})
	if err != nil {
		return StoreCopied{}, &StoreError{Location: loc, Err: err}
	}
	return cp, nil
}

// seededRows are the rows a context's migrations make in an empty store,
// per table, counted and digested (the same on either engine): read from a
// scratch SQLite store migrated for the purpose.
func (c *Controller) seededRows(ctx context.Context, name string) (map[string]sqlite.Count, error) {
	dir, err := os.MkdirTemp("", "mesh-seeds-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(ctx, sqlite.Location{Context: name, DSN: filepath.Join(dir, name+".db")}, true)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	if _, _, err := db.Migrate(ctx, migrationsOf()[name], c.Now()); err != nil {
		return nil, err
	}
	tables, err := db.Tables(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]sqlite.Count{}
	for _, t := range tables {
		if out[t.Name], err = sqlite.Digest(ctx, db.Reader, t); err != nil {
			return nil, err
		}
	}
	return out, nil
}
