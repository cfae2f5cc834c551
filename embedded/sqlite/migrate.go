package sqlite

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"mesh-controller/embedded/postgres"
)

var (
	// ErrSchemaNewer means the store was migrated by a newer binary; it is never downgraded.
	ErrSchemaNewer = errors.New("the store's schema is newer than this binary knows")
	// ErrMigrationChanged means a migration already applied to the store differs from the binary's file.
	ErrMigrationChanged = errors.New("an applied migration was changed")
	// ErrBehind means the store's schema is older than this binary's.
	ErrBehind = errors.New("the store's schema is behind this binary")
)

// Migration is one numbered SQL file, and its PostgreSQL twin.
type Migration struct {
	// Version is the file's number, counting from 1 without gaps.
	Version int
	// Name is the file's name.
	Name string
	// SQL is the file's content.
	SQL string
	// Checksum is the SHA-256 of SQL, hex.
	Checksum string
	// Postgres is the twin file's content (NNNN_what.postgres.sql): the
	// same schema in PostgreSQL's words, applied to a store on PostgreSQL
	// in SQL's place.
	Postgres string
	// PostgresChecksum is the SHA-256 of Postgres, hex.
	PostgresChecksum string
}

// PostgresSuffix ends the name of a migration's PostgreSQL twin.
const PostgresSuffix = ".postgres.sql"

// forEngine is the migration's SQL and checksum for a store on SQLite, or
// on PostgreSQL.
func (m Migration) forEngine(pg bool) (sql, checksum string) {
	if pg {
		return m.Postgres, m.PostgresChecksum
	}
	return m.SQL, m.Checksum
}

// LoadMigrations reads NNNN_name.sql files from fsys (other files are not
// migrations), each with its twin NNNN_name.postgres.sql, and checks they
// are numbered 1, 2, 3… without gaps or twins. Every migration must have
// both: SQLite cannot be given PostgreSQL's types nor PostgreSQL SQLite's
// STRICT tables and GLOB checks, and shipped files are never edited, so the
// two dialects are written side by side rather than one translated at run time.
func LoadMigrations(fsys fs.FS) ([]Migration, error) {
	names, err := fs.Glob(fsys, "[0-9]*.sql")
	if err != nil {
		return nil, err
	}
	read := func(name string) (string, string, error) {
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return "", "", err
		}
		sum := sha256.Sum256(b)
		return string(b), hex.EncodeToString(sum[:]), nil
	}
	var ms []Migration
	for _, name := range names {
		if strings.HasSuffix(name, PostgresSuffix) {
			if _, err := fs.Stat(fsys, strings.TrimSuffix(name, PostgresSuffix)+".sql"); err != nil {
				return nil, fmt.Errorf("migration %s: no %s beside it", name, strings.TrimSuffix(name, PostgresSuffix)+".sql")
			}
			continue
		}
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v < 1 {
			return nil, fmt.Errorf("migration %s: name it NNNN_what.sql", name)
		}
		m := Migration{Version: v, Name: path.Base(name)}
		if m.SQL, m.Checksum, err = read(name); err != nil {
			return nil, err
		}
		twin := strings.TrimSuffix(name, ".sql") + PostgresSuffix
		if m.Postgres, m.PostgresChecksum, err = read(twin); err != nil {
			return nil, fmt.Errorf("migration %s: its PostgreSQL twin %s: %w", name, twin, err)
		}
		ms = append(ms, m)
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i, m := range ms {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migration %s: expected number %d (no gaps, no twins)", m.Name, i+1)
		}
	}
	return ms, nil
}

const migrationsTable = `CREATE TABLE IF NOT EXISTS schema_migrations (
	version    INTEGER PRIMARY KEY,
	name       TEXT NOT NULL,
	checksum   TEXT NOT NULL,
	applied_at TEXT NOT NULL
)`

type applied struct {
	version  int
	name     string
	checksum string
}

func appliedMigrations(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}) ([]applied, error) {
	rows, err := q.QueryContext(ctx, `SELECT version, name, checksum FROM schema_migrations ORDER BY version`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var as []applied
	for rows.Next() {
		var a applied
		if err := rows.Scan(&a.version, &a.name, &a.checksum); err != nil {
			return nil, err
		}
		as = append(as, a)
	}
	return as, rows.Err()
}

// recordedMigrations are the migrations a store records, in order: none
// for a store never migrated, which has no table to record them in (reading
// never makes one).
func recordedMigrations(ctx context.Context, q *sql.DB, pg bool) ([]applied, error) {
	n, err := tableCount(ctx, q, pg, "schema_migrations")
	if err != nil {
		return nil, openError(err)
	}
	if n == 0 {
		return nil, nil
	}
	return appliedMigrations(ctx, q)
}

// tableCount is 1 if the store has a table of that name, 0 if not.
func tableCount(ctx context.Context, q *sql.DB, pg bool, table string) (int, error) {
	query := `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?`
	if pg {
		query = `SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = ?`
	}
	var n int
	err := q.QueryRowContext(ctx, query, table).Scan(&n)
	return n, err
}

// HasTable says the store has a table of that name.
func (db *DB) HasTable(ctx context.Context, table string) (bool, error) {
	n, err := tableCount(ctx, db.Reader, db.Postgres, table)
	return n > 0, err
}

// HasColumn says the store's table has a column of that name: what a
// binary reads of a store its migrations have not reached yet (an upgrade
// under way) depends on it.
func (db *DB) HasColumn(ctx context.Context, table, column string) (bool, error) {
	query := `SELECT count(*) FROM pragma_table_info(?) WHERE name = ?`
	if db.Postgres {
		query = `SELECT count(*) FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = ? AND column_name = ?`
	}
	var n int
	err := db.Reader.QueryRowContext(ctx, query, table, column).Scan(&n)
	return n > 0, err
}

// judge compares what the store has applied with what the binary knows.
// It returns the store's version.
func judge(as []applied, ms []Migration, pg bool) (int, error) {
	version := 0
	for _, a := range as {
		if a.version > len(ms) {
			return 0, fmt.Errorf("%w: it is at version %d (%s), this binary knows %d; use the newer mesh-controller, it is never downgraded",
				ErrSchemaNewer, as[len(as)-1].version, as[len(as)-1].name, len(ms))
		}
		m := ms[a.version-1]
		if _, sum := m.forEngine(pg); sum != a.checksum {
			return 0, fmt.Errorf("%w: %s differs from the file applied as version %d", ErrMigrationChanged, m.Name, a.version)
		}
		version = a.version
	}
	return version, nil
}

// Version tells the store's schema version and checks it against ms: a newer
// schema or a changed migration is an error; a schema behind ms is ErrBehind
// (with the version still returned).
func (db *DB) Version(ctx context.Context, ms []Migration) (int, error) {
	as, err := recordedMigrations(ctx, db.Reader, db.Postgres)
	if err != nil {
		return 0, err
	}
	v, err := judge(as, ms, db.Postgres)
	if err != nil {
		return 0, err
	}
	if v < len(ms) {
		return v, fmt.Errorf("%w: it is at version %d, this binary is at %d", ErrBehind, v, len(ms))
	}
	return v, nil
}

// Migrate applies the migrations the store lacks, each in its own
// transaction, recording each with its checksum. It returns the version
// before and after. The version is judged inside each transaction, so two
// processes migrating at once apply each file once. On PostgreSQL each file
// applied is its twin (Migration.Postgres), checksummed as such; a role
// that may not make tables is postgres.ErrNoRights.
func (db *DB) Migrate(ctx context.Context, ms []Migration, now time.Time) (from, to int, err error) {
	return db.MigrateGuarded(ctx, ms, now, nil)
}

// MigrateGuarded is Migrate, with guard (if set) asked inside each
// migration's transaction before it is applied: an error of its stops the
// migration there, that file not applied. The identity store is migrated
// so, its guard refusing while another controller holds the lease: the
// check and the change are one transaction, so no controller takes the
// lease between them.
func (db *DB) MigrateGuarded(ctx context.Context, ms []Migration, now time.Time, guard func(context.Context, *sql.Tx) error) (from, to int, err error) {
	// Made inside a write: PostgreSQL's IF NOT EXISTS is not safe against
	// a second process making the same table at the same moment.
	if err := db.Write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, migrationsTable)
		return err
	}); err != nil {
		return 0, 0, db.schemaError(err)
	}
	as, err := appliedMigrations(ctx, db.Writer)
	if err != nil {
		return 0, 0, err
	}
	if from, err = judge(as, ms, db.Postgres); err != nil {
		return 0, 0, err
	}
	to = from
	for _, m := range ms[from:] {
		err := db.Write(ctx, func(tx *sql.Tx) error {
			as, err := appliedMigrations(ctx, tx)
			if err != nil {
				return err
			}
			v, err := judge(as, ms, db.Postgres)
			if err != nil || v >= m.Version {
				return err
			}
			if guard != nil {
				if err := guard(ctx, tx); err != nil {
					return err
				}
			}
			text, sum := m.forEngine(db.Postgres)
			if _, err := tx.ExecContext(ctx, text); err != nil {
				return fmt.Errorf("apply %s: %w", m.Name, db.schemaError(err))
			}
			_, err = tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, checksum, applied_at) VALUES (?, ?, ?, ?)`,
				m.Version, m.Name, sum, FormatTime(now))
			return err
		})
		if err != nil {
			return from, to, err
		}
		to = m.Version
	}
	if err := db.foreignKeyCheck(ctx); err != nil {
		return from, to, err
	}
	return from, to, nil
}

// schemaError names a PostgreSQL role's lack of rights; on SQLite it is
// openError.
func (db *DB) schemaError(err error) error {
	if db.Postgres {
		t, _ := postgresTarget(db.Location.DSN)
		return postgres.ConnectError(err, t)
	}
	return openError(err)
}

// postgresTarget is who and where a store's URL logs in.
func postgresTarget(dsn string) (postgres.Target, error) {
	_, t, err := postgres.Config(dsn)
	return t, err
}

// foreignKeyCheck checks every reference after migrating; PostgreSQL
// enforces them always, so it is SQLite's alone.
func (db *DB) foreignKeyCheck(ctx context.Context) error {
	if db.Postgres {
		return nil
	}
	problem, err := foreignKeyProblem(ctx, db.Writer)
	if err != nil || problem == "" {
		return err
	}
	return fmt.Errorf("foreign key check after migrating: %s", problem)
}

// foreignKeyProblem is the first row PRAGMA foreign_key_check reports, said
// for a person; "" when every reference holds.
func foreignKeyProblem(ctx context.Context, q Querier) (string, error) {
	rows, err := q.QueryContext(ctx, `PRAGMA foreign_key_check`)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	if rows.Next() {
		var table, parent string
		var rowid sql.NullInt64
		var fkid int
		if err := rows.Scan(&table, &rowid, &parent, &fkid); err != nil {
			return "", err
		}
		return fmt.Sprintf("table %s row %d refers to a missing %s", table, rowid.Int64, parent), nil
	}
	return "", rows.Err()
}

// Schema is the store's schema as SQL, one statement per object in name
// order, for comparison with a checked-in schema.sql (schema.postgres.sql
// on PostgreSQL, read from its catalogue: postgres.Schema).
func (db *DB) Schema(ctx context.Context) (string, error) {
	if db.Postgres {
		return postgres.Schema(ctx, db.Reader)
	}
	rows, err := db.Reader.QueryContext(ctx,
		`SELECT sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%' ORDER BY type DESC, name`)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return "", err
		}
		b.WriteString(s)
		b.WriteString(";\n")
	}
	return b.String(), rows.Err()
}
