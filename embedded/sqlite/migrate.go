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
)

var (
	// ErrSchemaNewer means the store was migrated by a newer binary; it is never downgraded.
	ErrSchemaNewer = errors.New("the store's schema is newer than this binary knows")
	// ErrMigrationChanged means a migration already applied to the store differs from the binary's file.
	ErrMigrationChanged = errors.New("an applied migration was changed")
	// ErrBehind means the store's schema is older than this binary's.
	ErrBehind = errors.New("the store's schema is behind this binary")
)

// Migration is one numbered SQL file.
type Migration struct {
	// Version is the file's number, counting from 1 without gaps.
	Version int
	// Name is the file's name.
	Name string
	// SQL is the file's content.
	SQL string
	// Checksum is the SHA-256 of SQL, hex.
	Checksum string
}

// LoadMigrations reads NNNN_name.sql files from fsys (other files are not
// migrations) and checks they are numbered 1, 2, 3… without gaps or twins.
func LoadMigrations(fsys fs.FS) ([]Migration, error) {
	names, err := fs.Glob(fsys, "[0-9]*.sql")
	if err != nil {
		return nil, err
	}
	var ms []Migration
	for _, name := range names {
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v < 1 {
			return nil, fmt.Errorf("migration %s: name it NNNN_what.sql", name)
		}
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(b)
		ms = append(ms, Migration{Version: v, Name: path.Base(name), SQL: string(b), Checksum: hex.EncodeToString(sum[:])})
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
func recordedMigrations(ctx context.Context, q *sql.DB) ([]applied, error) {
	var n int
	if err := q.QueryRowContext(ctx,
		`SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'`).Scan(&n); err != nil {
		return nil, openError(err)
	}
	if n == 0 {
		return nil, nil
	}
	return appliedMigrations(ctx, q)
}

// judge compares what the store has applied with what the binary knows.
// It returns the store's version.
func judge(as []applied, ms []Migration) (int, error) {
	version := 0
	for _, a := range as {
		if a.version > len(ms) {
			return 0, fmt.Errorf("%w: it is at version %d (%s), this binary knows %d; use the newer mesh-controller, it is never downgraded",
				ErrSchemaNewer, as[len(as)-1].version, as[len(as)-1].name, len(ms))
		}
		m := ms[a.version-1]
		if m.Checksum != a.checksum {
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
	as, err := recordedMigrations(ctx, db.Reader)
	if err != nil {
		return 0, err
	}
	v, err := judge(as, ms)
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
// processes migrating at once apply each file once.
func (db *DB) Migrate(ctx context.Context, ms []Migration, now time.Time) (from, to int, err error) {
	if _, err := db.Writer.ExecContext(ctx, migrationsTable); err != nil {
		return 0, 0, openError(err)
	}
	as, err := appliedMigrations(ctx, db.Writer)
	if err != nil {
		return 0, 0, err
	}
	if from, err = judge(as, ms); err != nil {
		return 0, 0, err
	}
	to = from
	for _, m := range ms[from:] {
		err := db.Write(ctx, func(tx *sql.Tx) error {
			as, err := appliedMigrations(ctx, tx)
			if err != nil {
				return err
			}
			v, err := judge(as, ms)
			if err != nil || v >= m.Version {
				return err
			}
			if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
				return fmt.Errorf("apply %s: %w", m.Name, err)
			}
			_, err = tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, checksum, applied_at) VALUES (?, ?, ?, ?)`,
				m.Version, m.Name, m.Checksum, FormatTime(now))
			return err
		})
		if err != nil {
			return from, to, err
		}
		to = m.Version
	}
	if err := foreignKeyCheck(ctx, db.Writer); err != nil {
		return from, to, err
	}
	return from, to, nil
}

func foreignKeyCheck(ctx context.Context, w *sql.DB) error {
	problem, err := foreignKeyProblem(ctx, w)
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
// order, for comparison with a checked-in schema.sql.
func (db *DB) Schema(ctx context.Context) (string, error) {
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
