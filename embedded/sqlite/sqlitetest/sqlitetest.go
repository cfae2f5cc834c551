// Package sqlitetest gives tests a real, migrated store of one context in a
// temporary directory: the same files and pragmas the binary uses, never a mock.
package sqlitetest

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"mesh-controller/embedded/sqlite"
	"mesh-controller/migrations"
)

// Open makes and migrates the named context's store under t.TempDir(); it is
// closed when the test ends. It returns the store and its file's path.
func Open(t testing.TB, contextName string) (*sqlite.DB, string) {
	t.Helper()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), contextName+".db")
	db, err := sqlite.Open(ctx, sqlite.Location{Context: contextName, DSN: path}, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ms, err := sqlite.LoadMigrations(migrations.For(contextName))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := db.Migrate(ctx, ms, time.Now()); err != nil {
		t.Fatal(err)
	}
	return db, path
}
