package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"os"
)

var (
	// ErrIntegrity means a store fails SQLite's integrity check or its
	// foreign key check.
	ErrIntegrity = errors.New("fails its integrity check")
	// ErrCopyIncomplete means a copy is not one whole database file standing
	// on its own (a WAL beside it, a size that is not its page count, a WAL
	// mode header).
	ErrCopyIncomplete = errors.New("the copy is not a complete database")
)

// Copied is a copy CopyInto made.
type Copied struct {
	// Path is the copy's file.
	Path string
	// Bytes is its size.
	Bytes int64
	// SchemaVersion is the highest migration recorded in the copy, 0 if none.
	SchemaVersion int
}

// CopyInto writes a consistent copy of the live store to path, which must not
// exist, and checks the copy: one file in rollback mode, no WAL beside it,
// its size its page count, integrity_check ok.
//
// The copy goes through this DB's own connections (VACUUM INTO), never a
// second open of the store's file: a process that opens the file again and
// closes it drops its POSIX locks, and a file copy of a WAL database misses
// what is still in the WAL. VACUUM INTO reads one snapshot, so the copy is
// consistent while writers go on. It runs on a reader, not the writer, so
// the daemon's writes are not held up for the copy's length; the reader's
// query_only guard is lifted for that one statement, and a connection that
// cannot have it back is dropped from the pool rather than reused.
func (db *DB) CopyInto(ctx context.Context, path string) (Copied, error) {
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		return Copied{}, fmt.Errorf("copy into %s: exists already", path)
	}
	conn, err := db.Reader.Conn(ctx)
	if err != nil {
		return Copied{}, err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `PRAGMA query_only = 0`); err != nil {
		return Copied{}, err
	}
	_, err = conn.ExecContext(ctx, `VACUUM INTO ?`, path)
	if _, rerr := conn.ExecContext(context.Background(), `PRAGMA query_only = 1`); rerr != nil {
		conn.Raw(func(any) error { return driver.ErrBadConn })
	}
	if err != nil {
		os.Remove(path)
		return Copied{}, fmt.Errorf("vacuum into %s: %w", path, openError(err))
	}
	c, err := checkCopy(ctx, path)
	if err != nil {
		os.Remove(path)
		return Copied{}, err
	}
	return c, nil
}

// checkCopy proves a copy whole and standalone, reading it as an immutable
// file so that checking it leaves nothing beside it.
func checkCopy(ctx context.Context, path string) (Copied, error) {
	for _, side := range []string{"-wal", "-journal"} {
		if _, err := os.Lstat(path + side); err == nil {
			return Copied{}, fmt.Errorf("%s: %w: %s%s is beside it", path, ErrCopyIncomplete, path, side)
		}
	}
	f, err := os.Open(path)
	if err != nil {
		return Copied{}, err
	}
	head := make([]byte, 100)
	_, err = io.ReadFull(f, head)
	fi, serr := f.Stat()
	f.Close()
	if err != nil || serr != nil || !bytes.Equal(head[:len(sqliteHeader)], sqliteHeader) {
		return Copied{}, fmt.Errorf("%s: %w: no SQLite header", path, ErrCopyIncomplete)
	}
	// Bytes 18 and 19 are 2 in a WAL-mode file, which would want a WAL to be read whole.
	if head[18] != 1 || head[19] != 1 {
		return Copied{}, fmt.Errorf("%s: %w: its header asks for a WAL", path, ErrCopyIncomplete)
	}
	r, err := sql.Open("sqlite", dsn(path, "ro", []string{"immutable=1"}))
	if err != nil {
		return Copied{}, err
	}
	defer r.Close()
	r.SetMaxOpenConns(1)
	var pages, pageSize int64
	if err := r.QueryRowContext(ctx, `PRAGMA page_count`).Scan(&pages); err != nil {
		return Copied{}, openError(err)
	}
	if err := r.QueryRowContext(ctx, `PRAGMA page_size`).Scan(&pageSize); err != nil {
		return Copied{}, err
	}
	if pages*pageSize != fi.Size() {
		return Copied{}, fmt.Errorf("%s: %w: %d bytes, but %d pages of %d", path, ErrCopyIncomplete, fi.Size(), pages, pageSize)
	}
	if err := integrityCheck(ctx, r); err != nil {
		return Copied{}, fmt.Errorf("%s: %w", path, err)
	}
	as, err := recordedMigrations(ctx, r, false)
	if err != nil {
		return Copied{}, err
	}
	c := Copied{Path: path, Bytes: fi.Size()}
	if len(as) > 0 {
		c.SchemaVersion = as[len(as)-1].version
	}
	return c, nil
}

// Check runs SQLite's integrity check and foreign key check on the store: a
// store that fails either is ErrIntegrity, with the first problems found.
// A store on PostgreSQL is checked by its server (references are enforced
// always, pages checksummed if the cluster was made so): it is only asked
// to answer.
func (db *DB) Check(ctx context.Context) error {
	if db.Postgres {
		return db.Reader.PingContext(ctx)
	}
	if err := integrityCheck(ctx, db.Reader); err != nil {
		return err
	}
	problem, err := foreignKeyProblem(ctx, db.Reader)
	if err != nil {
		return openError(err)
	}
	if problem != "" {
		return fmt.Errorf("%w: %s", ErrIntegrity, problem)
	}
	return nil
}

// integrityCheck runs PRAGMA integrity_check, which answers one row "ok" or
// up to the given number of problems.
func integrityCheck(ctx context.Context, q Querier) error {
	problems, err := Strings(ctx, q, `PRAGMA integrity_check(5)`)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrIntegrity, openError(err))
	}
	if len(problems) == 1 && problems[0] == "ok" {
		return nil
	}
	return fmt.Errorf("%w: %v", ErrIntegrity, problems)
}
