package migrations_test

import (
	"context"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"mesh-controller/app"
	"mesh-controller/embedded/sqlite"
	"mesh-controller/embedded/sqlite/sqlitetest"
	"mesh-controller/migrations"
)

var update = flag.Bool("update", false, "rewrite each context's schema.sql from its migrations")

// Each context's schema after migrating must equal its checked-in schema.sql
// on SQLite, and schema.postgres.sql on PostgreSQL: a migration that changes
// the schema changes both golden files in the same commit, and the two
// dialects' files of one migration are read side by side in review.
func TestSchemaGolden(t *testing.T) {
	for _, name := range app.Contexts {
		for _, engine := range []string{"sqlite", "postgres"} {
			t.Run(name+"/"+engine, func(t *testing.T) {
				ms, err := sqlite.LoadMigrations(migrations.For(name))
				if err != nil {
					t.Fatal(err)
				}
				ctx := context.Background()
				dsn, golden := filepath.Join(t.TempDir(), name+".db"), "schema.sql"
				if engine == "postgres" {
					dsn, golden = sqlitetest.NewDatabase(t), "schema.postgres.sql"
				}
				db, err := sqlite.Open(ctx, sqlite.Location{Context: name, DSN: dsn}, true)
				if err != nil {
					t.Fatal(err)
				}
				defer db.Close()
				if _, _, err := db.Migrate(ctx, ms, time.Now()); err != nil {
					t.Fatal(err)
				}
				got, err := db.Schema(ctx)
				if err != nil {
					t.Fatal(err)
				}
				path := filepath.Join(name, golden)
				if *update {
					if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
						t.Fatal(err)
					}
					return
				}
				want, err := fs.ReadFile(migrations.For(name), golden)
				if err != nil {
					t.Fatalf("%v (run: go test ./migrations -update)", err)
				}
				if got != string(want) {
					t.Errorf("schema after migrating differs from %s (run: go test ./migrations -update, and review the diff)\n--- got\n%s\n--- want\n%s", path, got, want)
				}
			})
		}
	}
}

// Every context has a migrations directory, and nothing else does.
func TestEveryContextHasADirectory(t *testing.T) {
	for _, name := range app.Contexts {
		migrations.For(name) // panics if missing
	}
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, n := range app.Contexts {
		known[n] = true
	}
	for _, e := range entries {
		if e.IsDir() && !known[e.Name()] {
			t.Errorf("migrations/%s is not a context", e.Name())
		}
	}
}
