package app

import (
	"context"
	"testing"
)

// testApp is a controller, its stores and every service on them: what
// apptest.Mesh is for the tests outside this package, which this package's
// own tests cannot import.
type testApp struct {
	*Controller
	*Nodes
	*Modules
	*Seats
	*Secrets
	*Licences
	*Builds
	*Health
	*Copies
	*Server
	// uses is every store's view: the package's unexported use cases.
	uses
	st *Stores
}

// newTestApp is a controller on dir reading getenv, its stores opened, and
// closed when the test ends.
func newTestApp(t testing.TB, dir string, getenv func(string) string) *testApp {
	a := &testApp{Controller: New(dir)}
	a.Getenv = getenv
	a.open()
	t.Cleanup(func() { a.Close() })
	return a
}

func (a *testApp) open() {
	c, st := a.Controller, a.Controller.OpenStores(context.Background())
	a.st, a.uses = st, view(c, st, Contexts...)
	a.Nodes, a.Modules, a.Seats, a.Secrets = NewNodes(c, st), NewModules(c, st), NewSeats(c, st), NewSecrets(c, st)
	a.Licences, a.Builds, a.Health, a.Copies, a.Server = NewLicences(c, st), NewBuilds(c, st), NewHealth(c, st), NewCopies(c, st), NewServer(c, st)
}

// stores are the stores once every one has opened.
func (a *testApp) stores(context.Context) (*Stores, error) {
	if err := a.st.Complete(); err != nil {
		return nil, err
	}
	return a.st, nil
}

// Stores is stores.
func (a *testApp) Stores(ctx context.Context) (*Stores, error) { return a.stores(ctx) }

// Close closes the stores.
func (a *testApp) Close() error { return a.st.Close() }

// Migrate migrates, the stores closed first and opened again after.
func (a *testApp) Migrate(ctx context.Context) ([]Migrated, error) {
	return a.MigrateWith(ctx, MigrateOptions{})
}

// MigrateWith is Migrate with options.
func (a *testApp) MigrateWith(ctx context.Context, o MigrateOptions) ([]Migrated, error) {
	a.st.Close()
	defer a.open()
	return a.Controller.MigrateWith(ctx, o)
}

// Restore restores, the stores closed first and opened again after.
func (a *testApp) Restore(ctx context.Context, file, keyFile string) (Restored, error) {
	a.st.Close()
	defer a.open()
	return a.Controller.Restore(ctx, file, keyFile)
}
