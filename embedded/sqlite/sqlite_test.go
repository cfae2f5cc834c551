package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"testing/fstest"
	"time"
)

// checkFor polls check until it returns nil, failing the test after
// timeout with the last error check returned.
func checkFor(t testing.TB, timeout time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v", timeout, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestLocate(t *testing.T) {
	dir := t.TempDir()
	cred := filepath.Join(dir, "cred")
	if err := os.WriteFile(cred, []byte("\n  file:/srv/inv.db?cache=private \n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Run("data dir", func(t *testing.T) {
		l, err := Locate("inventory", "/d", env(nil))
		if err != nil || l.DSN != "/d/inventory.db" || l.From != "data dir" || l.Var != "MESH_STORE_INVENTORY" {
			t.Fatalf("got %+v, %v", l, err)
		}
	})
	t.Run("variable", func(t *testing.T) {
		l, err := Locate("inventory", "/d", env(map[string]string{"MESH_STORE_INVENTORY": " /x.db ", "MESH_STORE_INVENTORY_FILE": cred}))
		if err != nil || l.DSN != "/x.db" || l.From != "MESH_STORE_INVENTORY" {
			t.Fatalf("got %+v, %v", l, err)
		}
	})
	t.Run("file", func(t *testing.T) {
		l, err := Locate("inventory", "/d", env(map[string]string{"MESH_STORE_INVENTORY_FILE": cred}))
		if err != nil || l.DSN != "file:/srv/inv.db?cache=private" || !strings.HasPrefix(l.From, "MESH_STORE_INVENTORY_FILE") {
			t.Fatalf("got %+v, %v", l, err)
		}
		if got := l.FilePath(); got != "/srv/inv.db" {
			t.Fatalf("FilePath = %q", got)
		}
	})
	t.Run("file missing", func(t *testing.T) {
		_, err := Locate("health", "/d", env(map[string]string{"MESH_STORE_HEALTH_FILE": filepath.Join(dir, "nope")}))
		if !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("file empty", func(t *testing.T) {
		_, err := Locate("health", "/d", env(map[string]string{"MESH_STORE_HEALTH_FILE": empty}))
		if err == nil || !strings.Contains(err.Error(), "empty") {
			t.Fatalf("got %v", err)
		}
	})
}

func TestLocation_FilePath(t *testing.T) {
	for dsn, want := range map[string]string{
		"/a/b.db":                    "/a/b.db",
		"rel.db":                     "rel.db",
		"file:/a/b.db?mode=rw":       "/a/b.db",
		"file:///a/b.db":             "/a/b.db",
		"file://localhost/a/b.db":    "/a/b.db",
		"file::memory:?cache=shared": "",
	} {
		if got := (Location{DSN: dsn}).FilePath(); got != want {
			t.Errorf("FilePath(%q) = %q, want %q", dsn, got, want)
		}
	}
}

func open(t *testing.T, path string, create bool) *DB {
	t.Helper()
	db, err := Open(context.Background(), Location{Context: "test", DSN: path}, create)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// The pragmas must really take effect: modernc silently ignores mattn-style
// parameters (lessons.md).
func TestOpen_Pragmas(t *testing.T) {
	db := open(t, filepath.Join(t.TempDir(), "p.db"), true)
	ctx := context.Background()
	check := func(pool string, q interface {
		Scan(...any) error
	}, want string) {
		t.Helper()
		var got string
		if err := q.Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s: got %q, want %q", pool, got, want)
		}
	}
	check("writer journal_mode", db.Writer.QueryRowContext(ctx, "PRAGMA journal_mode"), "wal")
	check("reader journal_mode", db.Reader.QueryRowContext(ctx, "PRAGMA journal_mode"), "wal")
	check("writer busy_timeout", db.Writer.QueryRowContext(ctx, "PRAGMA busy_timeout"), "10000")
	check("reader busy_timeout", db.Reader.QueryRowContext(ctx, "PRAGMA busy_timeout"), "10000")
	check("writer foreign_keys", db.Writer.QueryRowContext(ctx, "PRAGMA foreign_keys"), "1")
	check("reader foreign_keys", db.Reader.QueryRowContext(ctx, "PRAGMA foreign_keys"), "1")
	check("writer synchronous", db.Writer.QueryRowContext(ctx, "PRAGMA synchronous"), "1")
	check("writer journal_size_limit", db.Writer.QueryRowContext(ctx, "PRAGMA journal_size_limit"), "67108864")
	check("reader query_only", db.Reader.QueryRowContext(ctx, "PRAGMA query_only"), "1")
	if got := db.Writer.Stats().MaxOpenConnections; got != 1 {
		t.Errorf("writer pool allows %d connections, want 1", got)
	}
	if _, err := db.Reader.ExecContext(ctx, "CREATE TABLE t (x)"); err == nil {
		t.Error("reader pool wrote")
	}
}

func TestOpen_Files(t *testing.T) {
	dir := t.TempDir()
	t.Run("missing without create", func(t *testing.T) {
		p := filepath.Join(dir, "none", "x.db")
		_, err := Open(context.Background(), Location{DSN: p}, false)
		if !errors.Is(err, ErrNoStore) {
			t.Fatalf("got %v", err)
		}
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatal("a read left a store behind")
		}
	})
	t.Run("missing without create, as URI", func(t *testing.T) {
		p := filepath.Join(dir, "y.db")
		_, err := Open(context.Background(), Location{DSN: "file:" + p}, false)
		if !errors.Is(err, ErrNoStore) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("created 0600 in a 0700 dir", func(t *testing.T) {
		p := filepath.Join(dir, "new", "x.db")
		open(t, p, true)
		for path, want := range map[string]os.FileMode{p: 0o600, filepath.Dir(p): 0o700} {
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != want {
				t.Errorf("%s has mode %v, want %v", path, fi.Mode().Perm(), want)
			}
		}
	})
	t.Run("not SQLite", func(t *testing.T) {
		p := filepath.Join(dir, "notes.txt")
		content := []byte("not a database at all, but somebody's notes\n")
		if err := os.WriteFile(p, content, 0o644); err != nil {
			t.Fatal(err)
		}
		for _, create := range []bool{false, true} {
			_, err := Open(context.Background(), Location{DSN: p}, create)
			if !errors.Is(err, ErrNotSQLite) {
				t.Fatalf("create=%v: got %v", create, err)
			}
		}
		if b, _ := os.ReadFile(p); string(b) != string(content) {
			t.Fatal("the file was changed")
		}
	})
	t.Run("path with URI characters", func(t *testing.T) {
		p := filepath.Join(dir, "odd?name#x%.db")
		open(t, p, true)
		if _, err := os.Stat(p); err != nil {
			t.Fatal(err)
		}
	})
}

// migrationsFS holds files, each migration with a PostgreSQL twin of the
// same text unless one is given.
func migrationsFS(files map[string]string) fstest.MapFS {
	m := fstest.MapFS{}
	for k, v := range files {
		m[k] = &fstest.MapFile{Data: []byte(v)}
		twin := strings.TrimSuffix(k, ".sql") + PostgresSuffix
		if _, given := files[twin]; !given && !strings.HasSuffix(k, PostgresSuffix) && k != "schema.sql" {
			m[twin] = &fstest.MapFile{Data: []byte(v)}
		}
	}
	return m
}

func TestLoadMigrations(t *testing.T) {
	ms, err := LoadMigrations(migrationsFS(map[string]string{
		"0002_b.sql": "CREATE TABLE b (x);", "0001_a.sql": "CREATE TABLE a (x);", "schema.sql": "ignored", "README.md": "ignored",
	}))
	if err != nil || len(ms) != 2 || ms[0].Name != "0001_a.sql" || ms[1].Version != 2 {
		t.Fatalf("got %+v, %v", ms, err)
	}
	for name, files := range map[string]map[string]string{
		"gap":       {"0001_a.sql": "", "0003_c.sql": ""},
		"twins":     {"0001_a.sql": "", "001_b.sql": ""},
		"no number": {"0x_a.sql": ""},
		"zero":      {"0000_a.sql": ""},
	} {
		if _, err := LoadMigrations(migrationsFS(files)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	for name, fsys := range map[string]fstest.MapFS{
		"no PostgreSQL twin": {"0001_a.sql": {}},
		"a twin alone":       {"0001_a.sql": {}, "0001_a.postgres.sql": {}, "0002_b.postgres.sql": {}},
	} {
		if _, err := LoadMigrations(fsys); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	ms, err = LoadMigrations(migrationsFS(map[string]string{"0001_a.sql": "CREATE TABLE a (x) STRICT;", "0001_a.postgres.sql": "CREATE TABLE a (x BIGINT);"}))
	if err != nil || ms[0].Postgres != "CREATE TABLE a (x BIGINT);" || ms[0].PostgresChecksum == ms[0].Checksum {
		t.Fatalf("twin: %+v, %v", ms, err)
	}
}

// Two processes on one file is the normal case (the daemon and a person's
// command): a writer in another process must wait out a held write
// transaction within the busy timeout, not fail at once.
func TestBusyTimeout_SecondProcess(t *testing.T) {
	if os.Getenv("MESH_TEST_WRITER") != "" || os.Getenv("MESH_TEST_ENGINE") == "postgres" {
		return // SQLite's own: run once, on the first pass
	}
	path := filepath.Join(t.TempDir(), "busy.db")
	db := open(t, path, true)
	ctx := context.Background()
	if _, err := db.Writer.Exec(`CREATE TABLE t (who TEXT)`); err != nil {
		t.Fatal(err)
	}
	tx, err := db.Writer.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(`INSERT INTO t VALUES ('first')`); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperWriter$")
	cmd.Env = append(os.Environ(), "MESH_TEST_WRITER="+path)
	var output strings.Builder
	cmd.Stdout, cmd.Stderr = &output, &output
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() { ended <- cmd.Wait() }()
	// Hold the lock until the other process waits on it: its marker file
	// says its write is in SQLite's busy handler. A writer that does not
	// wait fails at once, before saying so, and so does the test.
	waiting := path + ".waiting"
	checkFor(t, 20*time.Second, func() error {
		select {
		case err := <-ended:
			t.Fatalf("the second process ended (%v) before its write waited on the lock:\n%s", err, output.String())
		default:
		}
		if _, err := os.Stat(waiting); err != nil {
			return fmt.Errorf("the second process's write is not waiting on the lock: %v", err)
		}
		return nil
	})
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-ended; err != nil {
		t.Fatalf("second process failed: %v\n%s", err, output.String())
	}
	var n int
	db.Reader.QueryRow(`SELECT count(*) FROM t`).Scan(&n)
	if n != 2 {
		t.Fatalf("%d rows, want 2", n)
	}
}

// TestHelperWriter is the second process of TestBusyTimeout_SecondProcess.
func TestHelperWriter(t *testing.T) {
	path := os.Getenv("MESH_TEST_WRITER")
	if path == "" || os.Getenv("MESH_TEST_ENGINE") == "postgres" {
		t.Skip("only run as the helper of TestBusyTimeout_SecondProcess")
	}
	db := open(t, path, false)
	// Say when the write below waits in SQLite's busy handler (its frame
	// on this process's stacks): the first process holds its lock until then.
	go func() {
		buf := make([]byte, 1<<20)
		for {
			if n := runtime.Stack(buf, true); bytes.Contains(buf[:n], []byte("sqliteDefaultBusyCallback")) {
				os.WriteFile(path+".waiting", nil, 0o600)
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	start := time.Now()
	err := db.Write(context.Background(), func(tx *sql.Tx) error {
		_, err := tx.Exec(`INSERT INTO t VALUES ('second')`)
		return err
	})
	if err != nil {
		t.Fatalf("after %v: %v", time.Since(start), err)
	}
}

// A store path that is a symbolic link is refused, dangling or not: a store
// is never made or opened where its path does not say (issue 11: one made
// through a dangling link got mode 0644).
func TestOpen_RefusesSymlinks(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	target := filepath.Join(dir, "elsewhere.db")
	dangling := filepath.Join(dir, "dangling.db")
	if err := os.Symlink(target, dangling); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(ctx, Location{DSN: dangling}, true); !errors.Is(err, ErrSymlink) {
		t.Fatalf("a dangling link: %v", err)
	}
	if _, err := os.Lstat(target); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a store was made through the link: %v", err)
	}
	real := filepath.Join(dir, "real.db")
	open(t, real, true).Close()
	linked := filepath.Join(dir, "linked.db")
	if err := os.Symlink(real, linked); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(ctx, Location{DSN: linked}, false); !errors.Is(err, ErrSymlink) {
		t.Fatalf("a link to a store: %v", err)
	}
}

// Every store file is 0600, always: made so, and made so again when found otherwise.
func TestOpen_Mode0600(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.db")
	db := open(t, path, true)
	if _, err := db.Writer.Exec("CREATE TABLE t (x)"); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{path, path + "-wal", path + "-shm"} {
		if fi, err := os.Stat(f); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", f, fi.Mode(), err)
		}
	}
	db.Close()
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	open(t, path, false)
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Fatalf("reopened store left %v", fi.Mode())
	}
}

// A process opens each store once: a second Open of the same file is
// refused while the first is open, and allowed once it is closed.
func TestOpen_OnceAProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "once.db")
	first := open(t, path, true)
	if _, err := Open(context.Background(), Location{DSN: path}, false); !errors.Is(err, ErrOpenTwice) {
		t.Fatalf("a second handle: %v", err)
	}
	first.Close()
	open(t, path, false)
}

// A store that fails to open is given back: opening it again says why it
// fails, never that it is open already.
func TestOpen_FailureGivesTheFileBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.db")
	bad := append([]byte("SQLite format 3\x00"), make([]byte, 4096)...)
	for i := 16; i < len(bad); i++ {
		bad[i] = 0xff
	}
	if err := os.WriteFile(path, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		_, err := Open(context.Background(), Location{DSN: path}, false)
		if err == nil || errors.Is(err, ErrOpenTwice) {
			t.Fatalf("open %d: %v", i, err)
		}
	}
}
