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
	"sync"
	"syscall"
	"time"

	"mesh-controller/embedded/postgres"

	sqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// BusyTimeout is how long a connection waits for another writer (the daemon,
// or a person's command beside it) before giving up.
const BusyTimeout = 10 * time.Second

// pgIdle is how long a PostgreSQL connection may sit unused in a pool.
const pgIdle = time.Minute

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
	// ErrSymlink means the store's path is a symbolic link: refused, dangling
	// or not, so a store is never created or opened somewhere its path does
	// not say.
	ErrSymlink = errors.New("the store's path is a symbolic link")
	// ErrOpenTwice means this process already has the store open. SQLite's
	// POSIX locks belong to the process: a second handle on the file, closed,
	// drops the first one's locks, and another process may then delete the
	// WAL under it. A process opens each store exactly once.
	ErrOpenTwice = errors.New("this process has the store open already")
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
	// Postgres says the store is a PostgreSQL database (Location.DSN is
	// its URL), not a SQLite file: the SQL the stores share is the same,
	// what differs is asked of the DB (Write, Migrate, Schema, Check).
	Postgres bool
	// Observe, if set, is told how long each Write took (serve --metrics).
	// Set it before the store is shared: it is read without a lock.
	Observe func(time.Duration)
	// lockKey is the advisory lock a PostgreSQL store's writers take.
	lockKey int64
	// release gives the file back to the process's open files.
	release func()
}

// Open opens a context's store. With create, a missing file (and its
// directory) is made, with modes 0600 (0700); without, a missing file is
// ErrNoStore, so that a read never leaves an empty store behind. A path that
// is a symbolic link is ErrSymlink; a file this process has open already is
// ErrOpenTwice (see open files below); an existing file is made 0600.
//
// A store whose DSN is a postgres:// URL opens on PostgreSQL (openPostgres);
// create then makes nothing: databases and roles are a person's to make.
func Open(ctx context.Context, loc Location, create bool) (db *DB, err error) {
	if postgres.IsURL(loc.DSN) {
		return openPostgres(ctx, loc)
	}
	if path := loc.FilePath(); path != "" {
		var release func()
		if release, err = claim(path, create); err != nil {
			return nil, err
		}
		// err is the named result: a failure below gives the file back.
		defer func() {
			if err != nil {
				release()
			} else {
				db.release = release
			}
		}()
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

// Close closes both pools and gives the file back: it may be opened again.
func (db *DB) Close() error {
	err := errors.Join(db.Reader.Close(), db.Writer.Close())
	if db.release != nil {
		db.release()
		db.release = nil
	}
	return err
}

// Write runs fn in one immediate write transaction: committed if fn returns
// nil, rolled back otherwise. A write whose ctx carries a lease generation
// (WithFence) is refused first if the store's fence is above it.
//
// On PostgreSQL the transaction takes the context's advisory lock first, so
// that writers follow one another exactly as SQLite's do (see
// postgres.BeginWrite); a connection lost before the commit is said to be,
// and nothing of fn's is kept.
func (db *DB) Write(ctx context.Context, fn func(*sql.Tx) error) error {
	if db.Observe != nil {
		defer func(start time.Time) { db.Observe(time.Since(start)) }(time.Now())
	}
	var tx *sql.Tx
	var err error
	if db.Postgres {
		tx, err = postgres.BeginWrite(ctx, db.Writer, db.lockKey)
	} else {
		tx, err = db.Writer.BeginTx(ctx, nil)
	}
	if err != nil {
		return err
	}
	if err := checkFence(ctx, tx); err != nil {
		tx.Rollback()
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// openPostgres opens a store on PostgreSQL: a writer pool whose Write
// transactions serialise on the context's advisory lock, and a reader pool.
// The second writer connection lets a Write begin (and wait on the lock
// at the server) while another holds the first: the order among this
// process's writers is then the server's, as among processes.
func openPostgres(ctx context.Context, loc Location) (*DB, error) {
	w, _, err := postgres.Open(ctx, loc.DSN)
	if err != nil {
		return nil, err
	}
	w.SetMaxOpenConns(2)
	w.SetMaxIdleConns(2)
	r, _, err := postgres.Open(ctx, loc.DSN)
	if err != nil {
		w.Close()
		return nil, err
	}
	r.SetMaxOpenConns(readers)
	r.SetMaxIdleConns(readers)
	// A server's connections are counted (max_connections, 100 by
	// default) across every controller and command on it: six stores' pools
	// give back what they have not used for a while.
	for _, p := range []*sql.DB{w, r} {
		p.SetConnMaxIdleTime(pgIdle)
	}
	return &DB{Location: loc, Writer: w, Reader: r, Postgres: true, lockKey: postgres.LockKey(loc.Context)}, nil
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

// openFiles is every store file this process has open, by device and inode, so
// that none is opened twice (ErrOpenTwice): the header check below, and a
// second SQLite handle later closed, would otherwise drop the locks the
// first one holds.
var openFiles = struct {
	sync.Mutex
	files map[[2]uint64]string
}{files: map[[2]uint64]string{}}

// claim prepares a store file and records it open in this process; release
// forgets it. A missing file is made (0600, in a 0700 directory) or refused;
// a symbolic link is refused; an existing file is made 0600 (with its WAL
// and shared-memory files, which SQLite creates with the database's mode);
// one that is not SQLite is refused by its header rather than by whichever
// pragma first trips on it. The header is read only while no SQLite
// connection of this process has the file open, so closing that read drops
// no lock.
func claim(path string, create bool) (release func(), err error) {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if !create {
			return nil, ErrNoStore
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, err
		}
		// O_EXCL never follows a link: a link planted since the Lstat is refused.
		f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY|syscall.O_NOFOLLOW, 0o600)
		if err != nil && !errors.Is(err, os.ErrExist) {
			return nil, err
		}
		if f != nil {
			f.Close()
		}
		if fi, err = os.Lstat(path); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, err
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		return nil, ErrSymlink
	}
	if !fi.Mode().IsRegular() {
		return nil, ErrNotSQLite
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil, fmt.Errorf("%s: no device and inode", path)
	}
	key := [2]uint64{uint64(st.Dev), st.Ino}
	openFiles.Lock()
	defer openFiles.Unlock()
	if _, held := openFiles.files[key]; held {
		return nil, ErrOpenTwice
	}
	for _, f := range []string{path, path + "-wal", path + "-shm"} {
		if fi, err := os.Lstat(f); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm() != 0o600 {
			if err := os.Chmod(f, 0o600); err != nil {
				return nil, err
			}
		}
	}
	if err := checkHeader(path); err != nil {
		return nil, err
	}
	openFiles.files[key] = path
	return func() {
		openFiles.Lock()
		delete(openFiles.files, key)
		openFiles.Unlock()
	}, nil
}

// checkHeader refuses a file that is not empty and not SQLite.
func checkHeader(path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	head := make([]byte, len(sqliteHeader))
	n, err := io.ReadFull(f, head)
	if n == 0 && err == io.EOF {
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

// Size is how many bytes the store takes: a SQLite file with its
// write-ahead log, or a PostgreSQL store's database (one per context).
func (db *DB) Size(ctx context.Context) (int64, error) {
	if db.Postgres {
		var n int64
		err := db.Reader.QueryRowContext(ctx, `SELECT pg_database_size(current_database())`).Scan(&n)
		return n, err
	}
	path := db.Location.FilePath()
	if path == "" {
		return 0, fmt.Errorf("%s store: no file to measure", db.Location.Context)
	}
	var n int64
	for _, p := range []string{path, path + "-wal"} {
		fi, err := os.Stat(p)
		if errors.Is(err, os.ErrNotExist) && p != path {
			continue
		}
		if err != nil {
			return 0, err
		}
		n += fi.Size()
	}
	return n, nil
}
