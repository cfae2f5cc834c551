package app

import (
	"context"
	"strings"

	"mesh-controller/contexts/identity"
	"mesh-controller/embedded/sqlite"
	"mesh-controller/migrations"
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

// Migrate brings every context's store up to date, creating missing stores,
// and makes the controller's signing key on the first run. It stops at the
// first store it cannot migrate; those before it stay migrated.
func (c *Controller) Migrate(ctx context.Context) ([]Migrated, error) {
	var done []Migrated
	for _, name := range Contexts {
		m, err := c.migrateOne(ctx, name)
		if err != nil {
			return done, err
		}
		done = append(done, m)
	}
	return done, nil
}

func (c *Controller) migrateOne(ctx context.Context, name string) (Migrated, error) {
	loc, err := sqlite.Locate(name, c.DataDir, c.Getenv)
	if err != nil {
		return Migrated{}, &StoreError{Location: loc, Err: err}
	}
	ms, err := sqlite.LoadMigrations(migrations.For(name))
	if err != nil {
		return Migrated{}, err
	}
	db, err := sqlite.Open(ctx, loc, true)
	if err != nil {
		return Migrated{}, &StoreError{Location: loc, Err: err}
	}
	defer db.Close()
	from, to, err := db.Migrate(ctx, ms, c.Now())
	if err != nil {
		return Migrated{}, &StoreError{Location: loc, Err: err}
	}
	m := Migrated{Context: name, Store: loc.DSN, From: from, To: to, Known: len(ms)}
	if name == "identity" {
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
	}
	return m, nil
}
