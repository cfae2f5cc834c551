// Package sqlitetest gives tests a real, migrated store of one context, on
// each engine a store can be on: a SQLite file in a temporary directory (the
// same files and pragmas the binary uses), and a fresh database on the real
// PostgreSQL named by MESH_TEST_POSTGRES (make test starts one). Never a mock.
package sqlitetest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"mesh-controller/embedded/postgres"
	"mesh-controller/embedded/sqlite"
	"mesh-controller/migrations"
)

// PostgresVar names the URL of a PostgreSQL superuser the tests may make
// and drop databases with; scripts/with-postgres sets it.
const PostgresVar = "MESH_TEST_POSTGRES"

// EngineVar is set to "postgres" while Main runs the tests the second time.
const EngineVar = "MESH_TEST_ENGINE"

// engine is the engine Open gives stores on in this run of the package's
// tests (see Main).
var engine = "sqlite"

// Engine is the engine this run of the tests is on: "sqlite" or "postgres".
func Engine() string { return engine }

// Required says the PostgreSQL runs must not be skipped: under CI, and
// under make test (MESH_TEST_TOOLS), which brings everything the tests need.
func Required() bool { return os.Getenv("CI") != "" || os.Getenv("MESH_TEST_TOOLS") != "" }

// Main runs a package's tests once on SQLite and, when PostgreSQL is there,
// once more with every store on PostgreSQL; a package whose tests open
// stores calls it from TestMain. Without MESH_TEST_POSTGRES the second run
// is skipped, saying so (go test -v shows it), unless Required: then it
// fails, since CI must run every store test on both engines.
func Main(m *testing.M) int {
	code := m.Run()
	if os.Getenv(PostgresVar) == "" {
		if Required() {
			fmt.Fprintf(os.Stderr, "FAIL: the store tests on PostgreSQL cannot run: %s is not set (run them through make test, which starts PostgreSQL)\n", PostgresVar)
			return 1
		}
		fmt.Fprintf(os.Stderr, "sqlitetest: skipped the PostgreSQL runs: %s is not set (make test starts PostgreSQL and sets it)\n", PostgresVar)
		return code
	}
	engine = "postgres"
	// Said to the processes tests start too, and to tests inside
	// embedded/sqlite, which cannot import this package.
	os.Setenv(EngineVar, engine)
	fmt.Fprintln(os.Stderr, "sqlitetest: the same tests again, every store on PostgreSQL")
	if again := m.Run(); code == 0 {
		code = again
	}
	return code
}

// Open makes and migrates the named context's store on this run's engine;
// it is closed (and on PostgreSQL its database dropped) when the test ends.
// It returns the store and its DSN: the SQLite file's path, or the URL.
func Open(t testing.TB, contextName string) (*sqlite.DB, string) {
	t.Helper()
	ctx := context.Background()
	dsn := filepath.Join(t.TempDir(), contextName+".db")
	if engine == "postgres" {
		// A copy of a database migrated once in this process: migrating
		// each test's afresh took a fifth of a second on PostgreSQL, and
		// some packages open hundreds.
		dsn = newDatabaseFrom(t, migratedTemplate(t, contextName))
	}
	db, err := sqlite.Open(ctx, sqlite.Location{Context: contextName, DSN: dsn}, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if engine != "postgres" {
		if err := migrate(ctx, db, contextName); err != nil {
			t.Fatal(err)
		}
	}
	return db, dsn
}

// migrate brings db to the context's newest schema.
func migrate(ctx context.Context, db *sqlite.DB, contextName string) error {
	ms, err := sqlite.LoadMigrations(migrations.For(contextName))
	if err != nil {
		return err
	}
	_, _, err = db.Migrate(ctx, ms, time.Now())
	return err
}

// template is a PostgreSQL database migrated once, copied for each test.
type template struct {
	once sync.Once
	name string
	err  error
}

// templates holds this process's templates, by context.
var templates sync.Map

// migratedTemplate is the name of the database, made and migrated on the
// first call in this process, that the context's test databases copy. It
// is left on the throw-away server (make test's), which goes with them.
func migratedTemplate(t testing.TB, contextName string) string {
	t.Helper()
	admin := AdminURL(t)
	v, _ := templates.LoadOrStore(contextName, &template{})
	tpl := v.(*template)
	tpl.once.Do(func() {
		b := make([]byte, 6)
		rand.Read(b)
		name := "tpl_" + contextName + "_" + hex.EncodeToString(b)
		server, _, err := postgres.Open(context.Background(), admin)
		if err != nil {
			tpl.err = err
			return
		}
		defer server.Close()
		if _, err := server.Exec(`CREATE DATABASE ` + name + ` TEMPLATE template0`); err != nil {
			tpl.err = err
			return
		}
		db, err := sqlite.Open(context.Background(), sqlite.Location{Context: contextName, DSN: WithDatabase(t, admin, name)}, true)
		if err != nil {
			tpl.err = err
			return
		}
		// Closed before any copy: PostgreSQL copies no database in use.
		defer db.Close()
		tpl.name, tpl.err = name, migrate(context.Background(), db, contextName)
	})
	if tpl.err != nil {
		t.Fatalf("the migrated %s template on PostgreSQL: %v", contextName, tpl.err)
	}
	return tpl.name
}

// NewDatabase makes an empty database on the test PostgreSQL and returns
// its URL; the database is dropped when the test ends (after the stores
// opened on it are closed: cleanups run last first). The test is skipped
// when no PostgreSQL is there, or failed under CI.
func NewDatabase(t testing.TB) string {
	t.Helper()
	return newDatabaseFrom(t, "template0")
}

// newDatabaseFrom makes a database copying template, dropped when the
// test ends, and returns its URL.
func newDatabaseFrom(t testing.TB, template string) string {
	t.Helper()
	admin := AdminURL(t)
	b := make([]byte, 6)
	rand.Read(b)
	name := "t_" + hex.EncodeToString(b)
	db := adminDB(t, admin)
	if _, err := db.Exec(`CREATE DATABASE ` + name + ` TEMPLATE ` + template + ` STRATEGY FILE_COPY`); err != nil {
		t.Fatalf("make a test database: %v", err)
	}
	t.Cleanup(func() {
		if _, err := db.Exec(`DROP DATABASE IF EXISTS ` + name + ` WITH (FORCE)`); err != nil {
			t.Errorf("drop test database %s: %v", name, err)
		}
	})
	return WithDatabase(t, admin, name)
}

// AdminURL is MESH_TEST_POSTGRES; without it the test is skipped (failed
// under CI).
func AdminURL(t testing.TB) string {
	t.Helper()
	admin := os.Getenv(PostgresVar)
	if admin == "" {
		if Required() {
			t.Fatalf("%s is not set: this test needs PostgreSQL (make test starts it)", PostgresVar)
		}
		t.Skipf("%s is not set: make test starts PostgreSQL", PostgresVar)
	}
	return admin
}

// WithDatabase is the URL u with its database replaced by name.
func WithDatabase(t testing.TB, u, name string) string {
	t.Helper()
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	p.Path = "/" + name
	return p.String()
}

// WithUser is the URL u logging in as user (with password, if not "").
func WithUser(t testing.TB, u, user, password string) string {
	t.Helper()
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	p.User = url.User(user)
	if password != "" {
		p.User = url.UserPassword(user, password)
	}
	return p.String()
}

// adminDB is a connection to the test server's maintenance database, closed
// when the test ends.
func adminDB(t testing.TB, admin string) *sql.DB {
	t.Helper()
	db, _, err := postgres.Open(context.Background(), admin)
	if err != nil {
		t.Fatalf("PostgreSQL at %s: %v", postgres.Redact(admin), err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// Admin runs statements as the test server's superuser (making roles,
// granting, revoking), on the maintenance database or, if database is not
// "", on that one.
func Admin(t testing.TB, database string, statements ...string) {
	t.Helper()
	u := AdminURL(t)
	if database != "" {
		u = WithDatabase(t, u, database)
	}
	db := adminDB(t, u)
	for _, s := range statements {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// Server is a PostgreSQL server of a test's own, which it may stop and
// start (a restart under an open store) without touching the server the
// other tests share.
type Server struct {
	// URL is its superuser's URL, on its maintenance database.
	URL  string
	ctl  func(args ...string) error
	data string
}

// Stop stops the server at once (-m immediate: as a crash or a kill would).
func (s *Server) Stop() error { return s.ctl("-D", s.data, "-m", "immediate", "-w", "stop") }

// Start starts it again on the same port.
func (s *Server) Start() error { return s.ctl("-D", s.data, "-w", "-t", "30", "start") }

// NewServer makes and starts a PostgreSQL server for this test alone, in a
// temporary directory, as an unprivileged user when the test runs as root
// (initdb refuses root), on a free loopback port; it is stopped when the
// test ends. Like the shared server, it is skipped without
// MESH_TEST_POSTGRES, and failed under CI when PostgreSQL is missing.
func NewServer(t testing.TB) *Server {
	t.Helper()
	AdminURL(t)
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	if len(bins) == 0 {
		t.Fatal("no /usr/lib/postgresql/*/bin/pg_ctl: apt-get install --no-install-recommends postgresql")
	}
	bin := filepath.Dir(bins[len(bins)-1])
	dir, err := os.MkdirTemp("", "mesh-pg-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	user := "postgres"
	var prefix []string
	if os.Geteuid() == 0 {
		user, prefix = "nobody", []string{"setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"}
		if err := os.Chown(dir, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	} else if u := os.Getenv("USER"); u != "" {
		user = u
	}
	run := func(name string, args ...string) error {
		full := append(append(append([]string(nil), prefix...), filepath.Join(bin, name)), args...)
		out, err := exec.Command(full[0], full[1:]...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s: %v: %s", name, err, out)
		}
		return nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	data := filepath.Join(dir, "data")
	if err := run("initdb", "-D", data, "-U", user, "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"); err != nil {
		t.Fatal(err)
	}
	s := &Server{
		URL:  fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?sslmode=disable", user, port),
		ctl:  func(args ...string) error { return run("pg_ctl", args...) },
		data: data,
	}
	opts := fmt.Sprintf("-k %s -h 127.0.0.1 -p %d -c fsync=off", dir, port)
	s.ctl = func(args ...string) error {
		if args[len(args)-1] == "start" {
			args = append([]string{"-o", opts, "-l", filepath.Join(dir, "log")}, args...)
		}
		return run("pg_ctl", args...)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Stop() })
	return s
}
