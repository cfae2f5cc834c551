package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"mesh-controller/embedded/postgres"
	"mesh-controller/embedded/sqlite"
	"mesh-controller/embedded/sqlite/sqlitetest"
)

func TestMain(m *testing.M) { os.Exit(sqlitetest.Main(m)) }

// load reads migrations from files; a migration without a twin gets one of
// the same text (the SQL of these tests is both engines').
func load(t *testing.T, files map[string]string) []sqlite.Migration {
	t.Helper()
	fsys := fstest.MapFS{}
	for k, v := range files {
		fsys[k] = &fstest.MapFile{Data: []byte(v)}
		twin := strings.TrimSuffix(k, ".sql") + sqlite.PostgresSuffix
		if _, given := files[twin]; !given && !strings.HasSuffix(k, sqlite.PostgresSuffix) {
			fsys[twin] = &fstest.MapFile{Data: []byte(v)}
		}
	}
	ms, err := sqlite.LoadMigrations(fsys)
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

// emptyStore opens an empty store on this run's engine.
func emptyStore(t *testing.T) *sqlite.DB {
	t.Helper()
	dsn := filepath.Join(t.TempDir(), "m.db")
	if sqlitetest.Engine() == "postgres" {
		dsn = sqlitetest.NewDatabase(t)
	}
	db, err := sqlite.Open(context.Background(), sqlite.Location{Context: "test", DSN: dsn}, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// The migration runner keeps its version table, refuses a newer schema and
// applies each migration in one transaction, on either engine.
func TestMigrate(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	v1 := map[string]string{"0001_a.sql": "CREATE TABLE a (x INTEGER PRIMARY KEY);"}
	v2 := map[string]string{"0001_a.sql": v1["0001_a.sql"], "0002_b.sql": "CREATE TABLE b (y INTEGER REFERENCES a(x)); INSERT INTO a VALUES (1);"}
	db := emptyStore(t)

	t.Run("fresh store is behind", func(t *testing.T) {
		v, err := db.Version(ctx, load(t, v1))
		if v != 0 || !errors.Is(err, sqlite.ErrBehind) {
			t.Fatalf("got %d, %v", v, err)
		}
	})
	t.Run("in order, then idempotent", func(t *testing.T) {
		from, to, err := db.Migrate(ctx, load(t, v1), now)
		if err != nil || from != 0 || to != 1 {
			t.Fatalf("got %d -> %d, %v", from, to, err)
		}
		from, to, err = db.Migrate(ctx, load(t, v2), now)
		if err != nil || from != 1 || to != 2 {
			t.Fatalf("got %d -> %d, %v", from, to, err)
		}
		from, to, err = db.Migrate(ctx, load(t, v2), now)
		if err != nil || from != 2 || to != 2 {
			t.Fatalf("second run: got %d -> %d, %v", from, to, err)
		}
		if v, err := db.Version(ctx, load(t, v2)); v != 2 || err != nil {
			t.Fatalf("Version = %d, %v", v, err)
		}
		var n int
		db.Reader.QueryRow(`SELECT count(*) FROM a`).Scan(&n)
		if n != 1 {
			t.Fatalf("migration 2 ran %d times", n)
		}
	})
	t.Run("newer schema refused", func(t *testing.T) {
		_, _, err := db.Migrate(ctx, load(t, v1), now)
		if !errors.Is(err, sqlite.ErrSchemaNewer) {
			t.Fatalf("got %v", err)
		}
		if _, err := db.Version(ctx, load(t, v1)); !errors.Is(err, sqlite.ErrSchemaNewer) {
			t.Fatalf("Version: got %v", err)
		}
	})
	t.Run("changed migration refused", func(t *testing.T) {
		changed := load(t, map[string]string{"0001_a.sql": "CREATE TABLE a (x TEXT);", "0002_b.sql": v2["0002_b.sql"]})
		if _, _, err := db.Migrate(ctx, changed, now); !errors.Is(err, sqlite.ErrMigrationChanged) {
			t.Fatalf("got %v", err)
		}
		if _, err := db.Version(ctx, changed); !errors.Is(err, sqlite.ErrMigrationChanged) {
			t.Fatalf("Version: got %v", err)
		}
	})
	t.Run("a failing migration leaves nothing half-done", func(t *testing.T) {
		bad := load(t, map[string]string{"0001_a.sql": v1["0001_a.sql"], "0002_b.sql": v2["0002_b.sql"],
			"0003_c.sql": "CREATE TABLE c (z TEXT); INSERT INTO nowhere VALUES (1);"})
		_, to, err := db.Migrate(ctx, bad, now)
		if err == nil || to != 2 {
			t.Fatalf("got to=%d, %v", to, err)
		}
		if has, err := db.HasTable(ctx, "c"); has || err != nil {
			t.Fatalf("table c outlived its failed migration (%v)", err)
		}
	})
	t.Run("foreign keys hold while migrating", func(t *testing.T) {
		db := emptyStore(t)
		_, _, err := db.Migrate(ctx, load(t, map[string]string{"0001_a.sql": "CREATE TABLE p (id INTEGER PRIMARY KEY); CREATE TABLE c (p INTEGER REFERENCES p(id)); INSERT INTO c VALUES (7);"}), now)
		if err == nil {
			t.Fatal("a dangling reference was accepted")
		}
	})
	t.Run("each engine applies its own file", func(t *testing.T) {
		db := emptyStore(t)
		ms := load(t, map[string]string{"0001_a.sql": "CREATE TABLE a (x INTEGER) STRICT;", "0001_a.postgres.sql": "CREATE TABLE a (x BIGINT);"})
		if _, _, err := db.Migrate(ctx, ms, now); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Version(ctx, ms); err != nil {
			t.Fatal(err)
		}
	})
}

// openTwice opens the same PostgreSQL database through two DBs, as two
// processes would (each its own pools).
func openTwice(t *testing.T) (*sqlite.DB, *sqlite.DB) {
	t.Helper()
	if sqlitetest.Engine() != "postgres" {
		t.Skip("on SQLite, TestBusyTimeout_SecondProcess: a process opens a file once")
	}
	dsn := sqlitetest.NewDatabase(t)
	var dbs [2]*sqlite.DB
	for i := range dbs {
		db, err := sqlite.Open(context.Background(), sqlite.Location{Context: "inventory", DSN: dsn}, true)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		dbs[i] = db
	}
	if _, err := dbs[0].Writer.Exec(`CREATE TABLE serials (n BIGINT NOT NULL); CREATE TABLE issued (n BIGINT NOT NULL); INSERT INTO serials VALUES (0)`); err != nil {
		t.Fatal(err)
	}
	return dbs[0], dbs[1]
}

// next issues the next serial as a declaration does: read the last, write
// one more. Under READ COMMITTED alone, two writers read the same last.
func next(ctx context.Context, tx *sql.Tx) (int64, error) {
	var n int64
	if err := tx.QueryRowContext(ctx, `SELECT n FROM serials`).Scan(&n); err != nil {
		return 0, err
	}
	n++
	if _, err := tx.ExecContext(ctx, `UPDATE serials SET n = ?`, n); err != nil {
		return 0, err
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO issued (n) VALUES (?)`, n)
	return n, err
}

// On PostgreSQL a Write waits for another's to end before it reads, as
// SQLite's BEGIN IMMEDIATE does: a serial read and bumped in a Write is
// never issued twice. First the race step by step: the second writer
// (another pool, as another process) must be held at its lock while the
// first has read; then many writers at once.
func TestWrite_OneWriterAtATime(t *testing.T) {
	a, b := openTwice(t)
	ctx := context.Background()
	t.Run("the second waits for the first", func(t *testing.T) {
		read := make(chan struct{})
		release := make(chan struct{})
		first := make(chan error, 1)
		go func() {
			first <- a.Write(ctx, func(tx *sql.Tx) error {
				var n int64
				if err := tx.QueryRowContext(ctx, `SELECT n FROM serials`).Scan(&n); err != nil {
					return err
				}
				close(read)
				<-release
				if _, err := tx.ExecContext(ctx, `UPDATE serials SET n = ?`, n+1); err != nil {
					return err
				}
				_, err := tx.ExecContext(ctx, `INSERT INTO issued (n) VALUES (?)`, n+1)
				return err
			})
		}()
		<-read
		second := make(chan error, 1)
		go func() {
			second <- b.Write(ctx, func(tx *sql.Tx) error { _, err := next(ctx, tx); return err })
		}()
		// The second is waiting on the advisory lock: PostgreSQL says so.
		deadline := time.Now().Add(10 * time.Second)
		for {
			var waiting int
			if err := a.Reader.QueryRow(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`).Scan(&waiting); err != nil {
				t.Fatal(err)
			}
			if waiting == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the second writer never waited on the lock")
			}
			time.Sleep(5 * time.Millisecond)
		}
		close(release)
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		if err := <-second; err != nil {
			t.Fatal(err)
		}
		var n, distinct int
		a.Reader.QueryRow(`SELECT count(*), count(DISTINCT n) FROM issued`).Scan(&n, &distinct)
		if n != 2 || distinct != 2 {
			t.Fatalf("%d serials issued, %d distinct", n, distinct)
		}
	})
	t.Run("many at once", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, 200)
		for i := range 8 {
			db := []*sqlite.DB{a, b}[i%2]
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 25 {
					errs <- db.Write(ctx, func(tx *sql.Tx) error { _, err := next(ctx, tx); return err })
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		var n, distinct int
		a.Reader.QueryRow(`SELECT count(*), count(DISTINCT n) FROM issued`).Scan(&n, &distinct)
		if n != 202 || distinct != n {
			t.Fatalf("%d serials issued, %d distinct", n, distinct)
		}
	})
}

// A store's PostgreSQL URL that is wrong is refused with what is wrong, by
// kind: it does not parse, nothing answers there, the database or role is
// missing, the role may not make tables.
func TestOpen_PostgresBadInput(t *testing.T) {
	if sqlitetest.Engine() != "postgres" {
		t.Skip("PostgreSQL's URLs")
	}
	ctx := context.Background()
	admin := sqlitetest.AdminURL(t)
	open := func(dsn string) error {
		db, err := sqlite.Open(ctx, sqlite.Location{Context: "inventory", DSN: dsn}, true)
		if err == nil {
			db.Close()
		}
		return err
	}
	t.Run("does not parse", func(t *testing.T) {
		if err := open("postgres://u:p@host:notaport/db"); !errors.Is(err, postgres.ErrBadURL) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("no database named", func(t *testing.T) {
		if err := open("postgres://u@127.0.0.1:1"); !errors.Is(err, postgres.ErrBadURL) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		// Port 1 on loopback: nothing listens there, and it is refused at once.
		if err := open("postgres://u@127.0.0.1:1/db?connect_timeout=5"); !errors.Is(err, postgres.ErrUnreachable) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("no such database", func(t *testing.T) {
		err := open(sqlitetest.WithDatabase(t, admin, "no_such_db"))
		var pe *postgres.Error
		if !errors.Is(err, postgres.ErrNoDatabase) || !errors.As(err, &pe) || pe.Target.Database != "no_such_db" {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("no such role", func(t *testing.T) {
		if err := open(sqlitetest.WithUser(t, admin, "no_such_role", "")); !errors.Is(err, postgres.ErrNoRole) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("a role that may not make tables", func(t *testing.T) {
		dsn := sqlitetest.NewDatabase(t)
		role := fmt.Sprintf("r_%d", time.Now().UnixNano())
		u, _ := url.Parse(dsn)
		name := strings.TrimPrefix(u.Path, "/")
		sqlitetest.Admin(t, "", `CREATE ROLE `+role+` LOGIN`)
		t.Cleanup(func() {
			sqlitetest.Admin(t, "", `DROP DATABASE IF EXISTS `+name+` WITH (FORCE)`, `DROP ROLE IF EXISTS `+role)
		})
		// PostgreSQL 15 gives PUBLIC no CREATE on schema public: a role
		// that does not own the database may connect and do nothing else.
		db, err := sqlite.Open(ctx, sqlite.Location{Context: "inventory", DSN: sqlitetest.WithUser(t, dsn, role, "")}, true)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		_, _, err = db.Migrate(ctx, load(t, map[string]string{"0001_a.sql": "CREATE TABLE a (x INTEGER);"}), time.Now())
		var pe *postgres.Error
		if !errors.Is(err, postgres.ErrNoRights) || !errors.As(err, &pe) || pe.Target.User != role {
			t.Fatalf("got %v", err)
		}
	})
}

// PostgreSQL restarted under an open store: a write under way when it
// stops is reported and leaves nothing of itself; once it is back, the
// same store writes again without being opened anew.
func TestWrite_PostgresRestart(t *testing.T) {
	if sqlitetest.Engine() != "postgres" {
		t.Skip("a PostgreSQL server's restart")
	}
	srv := sqlitetest.NewServer(t)
	ctx := context.Background()
	db, err := sqlite.Open(ctx, sqlite.Location{Context: "inventory", DSN: srv.URL}, true)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Writer.Exec(`CREATE TABLE t (n BIGINT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	err = db.Write(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO t VALUES (1)`); err != nil {
			return err
		}
		if err := srv.Stop(); err != nil {
			t.Fatal(err)
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO t VALUES (2)`)
		return err
	})
	if err == nil {
		t.Fatal("a write across the server's stop reported success")
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	// The pool's connections died with the server: the next write, through
	// the same pools, finds a new one (an idle connection is pinged first).
	werr := db.Write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO t VALUES (3)`)
		return err
	})
	if werr != nil {
		t.Fatalf("the first write after the restart: %v", werr)
	}
	var rows []int64
	r, err := db.Reader.Query(`SELECT n FROM t ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	for r.Next() {
		var n int64
		r.Scan(&n)
		rows = append(rows, n)
	}
	r.Close()
	if fmt.Sprint(rows) != "[3]" {
		t.Fatalf("rows after the restart: %v, want [3]: the interrupted write must leave nothing", rows)
	}
}
