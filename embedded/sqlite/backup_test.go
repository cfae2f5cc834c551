package sqlite

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// migrated opens a new store with two migrations applied and some rows, the
// last of them still in the WAL (no checkpoint), as a live store's are.
func migrated(t *testing.T, path string) *DB {
	t.Helper()
	db := open(t, path, true)
	ms, err := LoadMigrations(migrationsFS(map[string]string{
		"0001_a.sql": "CREATE TABLE a (id INTEGER PRIMARY KEY, body TEXT NOT NULL);",
		"0002_b.sql": "CREATE TABLE b (id INTEGER PRIMARY KEY, a INTEGER NOT NULL REFERENCES a (id)); CREATE INDEX b_a ON b (a);",
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, _, err := db.Migrate(ctx, ms, time.Now()); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 200; i++ {
		if _, err := db.Writer.ExecContext(ctx, `INSERT INTO a (body) VALUES (printf('row %d %.*c', ?, 500, 'x'))`, i); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Writer.ExecContext(ctx, `INSERT INTO b (a) SELECT id FROM a`); err != nil {
		t.Fatal(err)
	}
	return db
}

func count(t *testing.T, path, table string) int {
	t.Helper()
	db := open(t, path, false)
	var n int
	if err := db.Reader.QueryRow(`SELECT count(*) FROM ` + table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestDB_CopyInto(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db := migrated(t, filepath.Join(dir, "live.db"))
	if fi, err := os.Stat(filepath.Join(dir, "live.db-wal")); err != nil || fi.Size() == 0 {
		t.Fatalf("the rows should still be in the WAL: %v", err)
	}

	t.Run("whole, standalone, consistent", func(t *testing.T) {
		out := filepath.Join(dir, "odd?name#x%.db")
		c, err := db.CopyInto(ctx, out)
		if err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(out)
		if err != nil || c.Bytes != fi.Size() || c.SchemaVersion != 2 || c.Path != out {
			t.Fatalf("copied %+v, file %v", c, err)
		}
		for _, side := range []string{"-wal", "-shm", "-journal"} {
			if _, err := os.Lstat(out + side); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s beside the copy: %v", side, err)
			}
		}
		// What was only in the live store's WAL is in the copy.
		if n := count(t, out, "a"); n != 200 {
			t.Fatalf("the copy has %d rows, want 200", n)
		}
	})

	t.Run("the reader pool is read-only again", func(t *testing.T) {
		for i := 0; i < 8; i++ {
			if _, err := db.Reader.ExecContext(ctx, `INSERT INTO a (body) VALUES ('via a reader')`); err == nil {
				t.Fatal("a reader wrote after the copy")
			}
		}
	})

	t.Run("an existing file is refused and kept", func(t *testing.T) {
		out := filepath.Join(dir, "taken.db")
		if err := os.WriteFile(out, []byte("mine"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := db.CopyInto(ctx, out); err == nil {
			t.Fatal("copied over an existing file")
		}
		if b, _ := os.ReadFile(out); string(b) != "mine" {
			t.Fatal("the existing file was changed")
		}
	})

	t.Run("while a writer goes on", func(t *testing.T) {
		var wg sync.WaitGroup
		var stop atomic.Bool
		var written atomic.Int64
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				if _, err := db.Writer.ExecContext(ctx, `INSERT INTO a (body) VALUES ('during')`); err != nil {
					t.Error(err)
					return
				}
				written.Add(1)
			}
		}()
		for written.Load() < 50 {
			time.Sleep(time.Millisecond)
		}
		out := filepath.Join(dir, "during.db")
		_, err := db.CopyInto(ctx, out)
		before := written.Load()
		stop.Store(true)
		wg.Wait()
		if err != nil {
			t.Fatal(err)
		}
		n := count(t, out, "a")
		if n < 200+50 || int64(n) > 200+before+1 {
			t.Fatalf("the copy has %d rows: not one snapshot between 250 and %d", n, 200+before)
		}
	})
}

func TestDB_Check(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	t.Run("ok", func(t *testing.T) {
		db := migrated(t, filepath.Join(dir, "ok.db"))
		if err := db.Check(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("a foreign key that points nowhere", func(t *testing.T) {
		db := migrated(t, filepath.Join(dir, "fk.db"))
		if _, err := db.Writer.ExecContext(ctx, `PRAGMA foreign_keys = OFF`); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Writer.ExecContext(ctx, `INSERT INTO b (a) VALUES (9999)`); err != nil {
			t.Fatal(err)
		}
		if err := db.Check(ctx); !errors.Is(err, ErrIntegrity) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("damaged pages", func(t *testing.T) {
		path := filepath.Join(dir, "bad.db")
		db := migrated(t, path)
		if _, err := db.Writer.ExecContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
			t.Fatal(err)
		}
		db.Close()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		// Scribble over the middle of the file: the pages of table a and index b_a.
		for i := len(b) / 3; i < len(b)/3+4096 && i < len(b); i++ {
			b[i] = 0x5a
		}
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := open(t, path, false).Check(ctx); !errors.Is(err, ErrIntegrity) {
			t.Fatalf("got %v", err)
		}
	})
}
