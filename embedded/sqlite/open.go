package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	sqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// BusyTimeout is how long a connection waits for another writer (the daemon,
// or a person's command beside it) before giving up.
const BusyTimeout = 10 * time.Second

// readers is the size of the reader pool.
const readers = 4

// journalSizeLimit keeps the WAL file from growing without bound once
// checkpoints complete (lessons.md: headscale, gotosocial and k3s hit it).
const journalSizeLimit = 64 << 20

var (
	// ErrNoStore means the store's file does not exist and the command does not create one.
	ErrNoStore = errors.New("no store there yet")
	// ErrNotSQLite means the file exists but is not a SQLite database.
	ErrNotSQLite = errors.New("file is not a SQLite database")
)

// DB is one context's store: one writer connection, whose transactions begin
// IMMEDIATE, and a small pool of read-only connections.
type DB struct {
	// Location is where the store is and what said so.
	Location Location
	// Writer is the single writer connection; every write goes through Write.
	Writer *sql.DB
	// Reader is the pool for queries that change nothing.
	Reader *sql.DB
}

// Open opens a context's store. With create, a missing file (and its
// directory) is made, with modes 0600 (0700); without, a missing file is
// ErrNoStore, so that a read never leaves an empty store behind.
func Open(ctx context.Context, loc Location, create bool) (*DB, error) {
	if path := loc.FilePath(); path != "" {
		if err := prepareFile(path, create); err != nil {
			return nil, err
		}
	}
	mode := "rw"
	if create {
		mode = "rwc"
	}
	w, err := sql.Open("sqlite", dsn(loc.DSN, mode, writerParams))
	if err != nil {
		return nil, err
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	if err := w.PingContext(ctx); err != nil {
		w.Close()
		return nil, openError(err)
	}
	var journal string
	if err := w.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&journal); err != nil {
		w.Close()
		return nil, openError(err)
	}
	if !strings.EqualFold(journal, "wal") {
		w.Close()
		return nil, fmt.Errorf("journal mode is %q, not wal: the store must be on a local file system", journal)
	}
	r, err := sql.Open("sqlite", dsn(loc.DSN, "rw", readerParams))
	if err != nil {
		w.Close()
		return nil, err
	}
	r.SetMaxOpenConns(readers)
	r.SetMaxIdleConns(readers)
	return &DB{Location: loc, Writer: w, Reader: r}, nil
}

// Close closes both pools.
func (db *DB) Close() error {
	return errors.Join(db.Reader.Close(), db.Writer.Close())
}

// Write runs fn in one immediate write transaction: committed if fn returns
// nil, rolled back otherwise.
func (db *DB) Write(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := db.Writer.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// writerParams are modernc's spelling of the pragmas (lessons.md: mattn-style
// parameters are silently ignored; busy_timeout must come first, and modernc
// sorts it first). Transactions begin IMMEDIATE so that a reader turning
// writer waits on the busy timeout instead of failing at once.
var writerParams = []string{
	"_txlock=immediate",
	fmt.Sprintf("_pragma=busy_timeout(%d)", BusyTimeout.Milliseconds()),
	"_pragma=journal_mode(WAL)",
	"_pragma=synchronous(NORMAL)",
	"_pragma=foreign_keys(ON)",
	fmt.Sprintf("_pragma=journal_size_limit(%d)", journalSizeLimit),
}

var readerParams = []string{
	fmt.Sprintf("_pragma=busy_timeout(%d)", BusyTimeout.Milliseconds()),
	"_pragma=foreign_keys(ON)",
	"_pragma=query_only(1)",
}

// dsn turns a path or file: URI into a file: URI carrying params, adding the
// open mode unless the URI already says one.
func dsn(base, mode string, params []string) string {
	uri := base
	if !strings.HasPrefix(uri, "file:") {
		uri = "file:" + strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(base)
	}
	q := append([]string(nil), params...)
	if !strings.Contains(uri, "mode=") {
		q = append(q, "mode="+mode)
	}
	sep := "?"
	if strings.Contains(uri, "?") {
		sep = "&"
	}
	return uri + sep + strings.Join(q, "&")
}

var sqliteHeader = []byte("SQLite format 3\x00")

// prepareFile checks the file before SQLite sees it: a missing one is made
// (0600) or refused, and one that is not SQLite is refused by its header
// rather than by whichever pragma first trips on it.
func prepareFile(path string, create bool) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		if !create {
			return ErrNoStore
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return err
		}
		f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
		if f != nil {
			return f.Close()
		}
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	head := make([]byte, len(sqliteHeader))
	n, err := io.ReadFull(f, head)
	if n == 0 && (err == io.EOF) {
		return nil // an empty file is a new store
	}
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return err
	}
	if !bytes.Equal(head[:n], sqliteHeader) {
		return ErrNotSQLite
	}
	return nil
}

// openError maps SQLite's result codes to this package's errors, by code,
// never by message.
func openError(err error) error {
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case sqlite3.SQLITE_NOTADB:
			return fmt.Errorf("%w: %v", ErrNotSQLite, err)
		case sqlite3.SQLITE_CANTOPEN:
			return fmt.Errorf("%w: %v", ErrNoStore, err)
		case sqlite3.SQLITE_CORRUPT:
			return fmt.Errorf("%w: %v", ErrIntegrity, err)
		}
	}
	return err
}
