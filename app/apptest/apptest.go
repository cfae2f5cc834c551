// Package apptest is a controller as a process holds one, for the tests
// that drive its use cases from outside package app: its stores opened once,
// every service on them, and the stores opened again after what replaces
// their files (migrate, restore), as a process that ran one would on its
// next start.
package apptest

import (
	"context"
	"os"

	"mesh-controller/app"
)

// Mesh is a controller, its stores and every service on them. Each
// service's methods are its own (Assign is the Modules service's); the
// Controller's settings (DataDir, Now, Getenv, Broker) are shared by all.
type Mesh struct {
	*app.Controller
	*app.Nodes
	*app.Modules
	*app.Seats
	*app.Secrets
	*app.Licences
	*app.Builds
	*app.Health
	*app.Copies
	*app.Server
	// API are the services the HTTP API serves.
	API app.API
	// St are the stores, opened once for all the services.
	St *app.Stores
}

// New is the controller on dataDir reading the process's environment.
func New(dataDir string) *Mesh { return NewEnv(dataDir, os.Getenv) }

// NewEnv is New reading the environment from getenv (the stores'
// locations and credentials are read when they are opened).
func NewEnv(dataDir string, getenv func(string) string) *Mesh {
	c := app.New(dataDir)
	c.Getenv = getenv
	m := &Mesh{Controller: c}
	m.open()
	return m
}

// open opens the stores and makes each service on them.
func (m *Mesh) open() {
	c, st := m.Controller, m.Controller.OpenStores(context.Background())
	m.St = st
	m.Nodes, m.Modules, m.Seats, m.Secrets = app.NewNodes(c, st), app.NewModules(c, st), app.NewSeats(c, st), app.NewSecrets(c, st)
	m.Licences, m.Builds, m.Health = app.NewLicences(c, st), app.NewBuilds(c, st), app.NewHealth(c, st)
	m.Copies, m.Server, m.API = app.NewCopies(c, st), app.NewServer(c, st), app.NewAPI(c, st)
}

// Reopen closes the stores and opens them again: what a process sees on
// its next start.
func (m *Mesh) Reopen() error {
	err := m.St.Close()
	m.open()
	return err
}

// Stores are the stores once every one has opened.
func (m *Mesh) Stores(context.Context) (*app.Stores, error) {
	if err := m.St.Complete(); err != nil {
		return nil, err
	}
	return m.St, nil
}

// Close closes the stores.
func (m *Mesh) Close() error { return m.St.Close() }

// Migrate migrates every store, its handles closed first and opened again
// after.
func (m *Mesh) Migrate(ctx context.Context) ([]app.Migrated, error) {
	return m.MigrateWith(ctx, app.MigrateOptions{})
}

// MigrateWith is Migrate with options.
func (m *Mesh) MigrateWith(ctx context.Context, o app.MigrateOptions) ([]app.Migrated, error) {
	m.St.Close()
	defer m.open()
	return m.Controller.MigrateWith(ctx, o)
}

// Restore restores a backup of the stores, their handles closed first and
// opened again after.
func (m *Mesh) Restore(ctx context.Context, file, keyFile string) (app.Restored, error) {
	m.St.Close()
	defer m.open()
	return m.Controller.Restore(ctx, file, keyFile)
}
