// Package postgres opens a context's store on PostgreSQL through pgx's
// database/sql driver (no cgo): queries written with SQLite's ? placeholders
// are rebound to $n on the way in, one place for every query; connection
// failures are told apart by PostgreSQL's error codes, never by message; and
// writers are serialised with a transaction-scoped advisory lock, the
// guarantee SQLite's BEGIN IMMEDIATE gives.
package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"hash/fnv"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

var (
	// ErrBadURL means the store's URL does not parse as a PostgreSQL URL.
	ErrBadURL = errors.New("the PostgreSQL URL does not parse")
	// ErrUnreachable means no PostgreSQL server answered at the URL's address.
	ErrUnreachable = errors.New("PostgreSQL is unreachable")
	// ErrNoDatabase means the server answered but has no database of the URL's name.
	ErrNoDatabase = errors.New("the database does not exist")
	// ErrNoRole means the server answered but has no role of the URL's user.
	ErrNoRole = errors.New("the role does not exist")
	// ErrAuth means the server refused the URL's password (or its method of login).
	ErrAuth = errors.New("PostgreSQL refused the login")
	// ErrNoRights means the role may connect but not do what the store needs
	// (make tables in the schema, read or write them).
	ErrNoRights = errors.New("the role lacks rights")
)

// IsURL says a store's DSN names a PostgreSQL database rather than a SQLite file.
func IsURL(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

// Redact is the URL with its password replaced by "xxxxx", for messages and
// listings: a password never leaves through output.
func Redact(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return "postgres://(unparsable)"
	}
	if u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
	}
	if q := u.Query(); q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// Target is who and where a URL logs in: for telling a person what to create.
type Target struct {
	// User is the role the URL logs in as.
	User string
	// Database is the database it names.
	Database string
	// Host is the server's address, as the URL gave it.
	Host string
}

// Config parses a store's URL; an error is ErrBadURL.
func Config(dsn string) (*pgx.ConnConfig, Target, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, Target{}, fmt.Errorf("%w: %s", ErrBadURL, parseProblem(err))
	}
	if cfg.Database == "" {
		return nil, Target{}, fmt.Errorf("%w: it names no database (postgres://USER@HOST/DATABASE)", ErrBadURL)
	}
	return cfg, Target{User: cfg.User, Database: cfg.Database, Host: cfg.Host}, nil
}

// parseProblem is what pgx found wrong with a URL, without the URL: pgx
// hides its password as best it can, and an error that quotes the URL
// (url.Parse's) is left out, so that none is ever printed.
func parseProblem(err error) string {
	msg := err.Error()
	if _, after, ok := strings.Cut(msg, "`: "); ok {
		msg = after
	}
	if i := strings.Index(msg, " ("); i >= 0 && strings.Contains(msg[i:], "://") {
		msg = msg[:i]
	}
	if strings.Contains(msg, "://") || strings.Contains(msg, "@") {
		return "check its form"
	}
	return msg
}

// Error is a failure to reach, log in to or use a store's database, with
// who and where the URL logs in, so that a person can be told what to
// create or grant. Err is one of this package's sentinels.
type Error struct {
	Err    error
	Target Target
	Detail string
}

func (e *Error) Error() string { return fmt.Sprintf("%v: %s", e.Err, e.Detail) }

// Unwrap returns the sentinel.
func (e *Error) Unwrap() error { return e.Err }

// Open makes a pool on the URL's database whose connections rebind ?
// placeholders, and checks it answers. Failures are ErrBadURL, or an *Error
// of ErrUnreachable, ErrNoDatabase, ErrNoRole or ErrAuth.
func Open(ctx context.Context, dsn string) (*sql.DB, Target, error) {
	cfg, target, err := Config(dsn)
	if err != nil {
		return nil, target, err
	}
	db := sql.OpenDB(connector{stdlib.GetConnector(*cfg, stdlib.OptionShouldPing(stale))})
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, target, ConnectError(err, target)
	}
	return db, target, nil
}

// ConnectError names a failure to reach, log in to or use the server by its
// PostgreSQL code; other errors are returned as they are.
func ConnectError(err error, target Target) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "3D000": // invalid_catalog_name
			return &Error{ErrNoDatabase, target, pe.Message}
		case "28000": // invalid_authorization_specification: no such role, or pg_hba refuses
			return &Error{ErrNoRole, target, pe.Message}
		case "28P01": // invalid_password
			return &Error{ErrAuth, target, pe.Message}
		case "42501": // insufficient_privilege
			return &Error{ErrNoRights, target, pe.Message}
		}
		return err
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return &Error{ErrUnreachable, target, ce.Unwrap().Error()}
	}
	return err
}

// LockKey is the advisory lock a context's writers take: one per context, so
// stores that share a server (each in its own database) never wait on each other.
func LockKey(context string) int64 {
	h := fnv.New64a()
	h.Write([]byte("mesh-controller store " + context))
	return int64(h.Sum64())
}

// BeginWrite begins a write transaction on db and takes the context's
// advisory lock inside it, so that writers follow one another as SQLite's
// IMMEDIATE transactions do: the lock is held until commit or rollback, and
// each statement after it (READ COMMITTED) sees every earlier writer's
// commit. A read-then-write, such as the next declaration serial, is
// therefore never raced.
func BeginWrite(ctx context.Context, db *sql.DB, key int64) (*sql.Tx, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(?)`, key); err != nil {
		tx.Rollback()
		return nil, err
	}
	return tx, nil
}

// pingIdle is how long a pooled connection may sit unused before it is
// asked whether it still stands, before its next use.
const pingIdle = 50 * time.Millisecond

// stale says a connection must be pinged before it is used again: pgx's
// default asks only after a second, and a server restarted faster than that
// (pg_ctl restart takes a few hundred milliseconds) left every pooled
// connection dead, each failing its next query once. A connection used
// while the server was down failed then and was dropped; one idle across
// the restart was idle longer than this, and is found dead by its ping and
// replaced. Only a statement under way when the server went is lost, and
// reported.
func stale(_ context.Context, p stdlib.ShouldPingParams) bool { return p.IdleDuration > pingIdle }

// connector hands out connections that rebind each query.
type connector struct{ driver.Connector }

func (c connector) Connect(ctx context.Context) (driver.Conn, error) {
	dc, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &conn{dc.(*stdlib.Conn)}, nil
}

// conn is pgx's connection with the stores' dialect put right on the way in:
// ? placeholders become $n; a Go bool becomes 0 or 1, as SQLite stores it in
// the INTEGER columns both schemas share; and a read-only transaction reads
// one snapshot (REPEATABLE READ), as SQLite's read transactions do.
type conn struct{ *stdlib.Conn }

func (c *conn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

func (c *conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	s, err := c.Conn.PrepareContext(ctx, Rebind(query))
	if err != nil {
		return nil, err
	}
	return stmt{s.(*stdlib.Stmt)}, nil
}

func (c *conn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	return c.Conn.ExecContext(ctx, Rebind(query), ints(args))
}

func (c *conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	return c.Conn.QueryContext(ctx, Rebind(query), ints(args))
}

func (c *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if opts.ReadOnly && sql.IsolationLevel(opts.Isolation) == sql.LevelDefault {
		opts.Isolation = driver.IsolationLevel(sql.LevelRepeatableRead)
	}
	return c.Conn.BeginTx(ctx, opts)
}

type stmt struct{ *stdlib.Stmt }

func (s stmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	return s.Stmt.ExecContext(ctx, ints(args))
}

func (s stmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	return s.Stmt.QueryContext(ctx, ints(args))
}

// ints turns bool arguments into the integers SQLite would store.
func ints(args []driver.NamedValue) []driver.NamedValue {
	for i, a := range args {
		if b, ok := a.Value.(bool); ok {
			v := int64(0)
			if b {
				v = 1
			}
			args[i].Value = v
		}
	}
	return args
}

// indexedBy is SQLite's planner hint, which PostgreSQL has no words for.
var indexedBy = regexp.MustCompile(`\s+INDEXED BY \w+`)

// Rebind turns SQLite's placeholders into PostgreSQL's, as SQLite numbers
// them: ?N is $N, and each bare ? is one more than the largest number
// before it. Quoted strings, quoted names and comments are left alone.
// SQLite's planner hint INDEXED BY, which only tells SQLite which index to
// use, is dropped.
func Rebind(query string) string {
	if strings.Contains(query, "INDEXED BY") {
		query = indexedBy.ReplaceAllString(query, "")
	}
	if !strings.Contains(query, "?") {
		return query
	}
	var b strings.Builder
	b.Grow(len(query) + 16)
	n := 0
	for i := 0; i < len(query); i++ {
		c := query[i]
		switch {
		case c == '\'' || c == '"':
			j := i + 1
			for j < len(query) && query[j] != c {
				j++
			}
			b.WriteString(query[i:min(j+1, len(query))])
			i = j
		case c == '-' && i+1 < len(query) && query[i+1] == '-':
			j := strings.IndexByte(query[i:], '\n')
			if j < 0 {
				j = len(query) - i
			}
			b.WriteString(query[i : i+j])
			i += j - 1
		case c == '/' && i+1 < len(query) && query[i+1] == '*':
			j := strings.Index(query[i+2:], "*/")
			end := len(query)
			if j >= 0 {
				end = i + 2 + j + 2
			}
			b.WriteString(query[i:end])
			i = end - 1
		case c == '?':
			j := i + 1
			for j < len(query) && query[j] >= '0' && query[j] <= '9' {
				j++
			}
			if j > i+1 {
				b.WriteString("$" + query[i+1:j])
				if k, _ := strconv.Atoi(query[i+1 : j]); k > n {
					n = k
				}
				i = j - 1
			} else {
				n++
				fmt.Fprintf(&b, "$%d", n)
			}
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}
