package migrations_test

import (
	"context"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
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
				ctx := context.Background()
				dsn, golden := filepath.Join(t.TempDir(), name+".db"), "schema.sql"
				if engine == "postgres" {
					dsn, golden = sqlitetest.NewDatabase(t), "schema.postgres.sql"
				}
				got, err := migrated(t, name, dsn).Schema(ctx)
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

// The same migrations make the same tables on both engines: each table's
// columns in their order, its primary key and the tables it refers to (the
// types are each engine's own words, compared by eye in the goldens).
func TestSchemasAgree(t *testing.T) {
	for _, name := range app.Contexts {
		t.Run(name, func(t *testing.T) {
			var got [2][]sqlite.Table
			for i, dsn := range []string{filepath.Join(t.TempDir(), name+".db"), sqlitetest.NewDatabase(t)} {
				var err error
				if got[i], err = migrated(t, name, dsn).Tables(context.Background()); err != nil {
					t.Fatal(err)
				}
				for j := range got[i] {
					got[i][j].Identity = "" // PostgreSQL's alone: SQLite numbers a rowid key without saying so
					slices.Sort(got[i][j].Parents)
				}
			}
			if !reflect.DeepEqual(got[0], got[1]) {
				t.Errorf("the tables differ\nSQLite:     %+v\nPostgreSQL: %+v", got[0], got[1])
			}
		})
	}
}

// migrated opens a store of the named context at dsn and migrates it; it
// is closed when the test ends.
func migrated(t *testing.T, name, dsn string) *sqlite.DB {
	t.Helper()
	ms, err := sqlite.LoadMigrations(migrations.For(name))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	db, err := sqlite.Open(ctx, sqlite.Location{Context: name, DSN: dsn}, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, _, err := db.Migrate(ctx, ms, time.Now()); err != nil {
		t.Fatal(err)
	}
	return db
}

// health 0009 clears node.unmanaged-listener's former keys, one a
// listener, open and in the history, and leaves every other condition and
// its history as it was (with no subject: those rows go with the age
// window), on both engines.
func TestHealth0009_ClearsListenerKeys(t *testing.T) {
	ms, err := sqlite.LoadMigrations(migrations.For("health"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, engine := range []string{"sqlite", "postgres"} {
		t.Run(engine, func(t *testing.T) {
			dsn := filepath.Join(t.TempDir(), "health.db")
			if engine == "postgres" {
				dsn = sqlitetest.NewDatabase(t)
			}
			db, err := sqlite.Open(ctx, sqlite.Location{Context: "health", DSN: dsn}, true)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if _, _, err := db.Migrate(ctx, ms[:8], time.Now()); err != nil {
				t.Fatal(err)
			}
			for _, key := range []string{"node.unmanaged-listener/web1/tcp/6379", "node.unmanaged-listener/web1/udp/53", "node.silent/web1"} {
				kind, _, _ := strings.Cut(key, "/")
				if _, err := db.Exec(ctx, `INSERT INTO conditions (key, kind, scope, machine, severity, summary, raised_at, changed_at) VALUES (?, ?, 'machine', 'web1', 'notice', 'x', 't', 't')`, key, kind); err != nil {
					t.Fatal(err)
				}
				if _, err := db.Exec(ctx, `INSERT INTO condition_history (key, kind, event, severity, summary, at) VALUES (?, ?, 'raised', 'notice', 'x', 't')`, key, kind); err != nil {
					t.Fatal(err)
				}
			}
			if _, _, err := db.Migrate(ctx, ms, time.Now()); err != nil {
				t.Fatal(err)
			}
			for _, table := range []string{"conditions", "condition_history"} {
				var keys []string
				rows, err := db.Reader.QueryContext(ctx, `SELECT key FROM `+table+` ORDER BY key`)
				if err != nil {
					t.Fatal(err)
				}
				for rows.Next() {
					var k string
					rows.Scan(&k)
					keys = append(keys, k)
				}
				rows.Close()
				if !slices.Equal(keys, []string{"node.silent/web1"}) {
					t.Errorf("%s after migrating: %v", table, keys)
				}
			}
			var subject string
			if err := db.Reader.QueryRowContext(ctx, `SELECT subject FROM condition_history`).Scan(&subject); err != nil || subject != "" {
				t.Errorf("a row from before has the subject %q, %v", subject, err)
			}
		})
	}
}
