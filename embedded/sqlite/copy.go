package sqlite

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// ErrNotEmpty means a copy's target holds rows already: a copy never
// merges into, nor overwrites, a store in use.
var ErrNotEmpty = errors.New("the target store holds rows already")

// ErrCopyDiffers means a table read back from the copy's target differs
// from its source, by count or content digest.
var ErrCopyDiffers = errors.New("the copy differs from its source")

// Table is one table of a store, as a copy needs it.
type Table struct {
	// Name is the table's name.
	Name string
	// Columns are its columns, in their order.
	Columns []string
	// Key are its primary key's columns.
	Key []string
	// Parents are the tables its foreign keys refer to.
	Parents []string
	// Identity is the column PostgreSQL numbers itself ("" if none), whose
	// sequence must follow the rows a copy writes.
	Identity string
}

// Tables are the store's tables but schema_migrations, parents before the
// tables that refer to them (then by name), so that rows copied in that
// order never refer to a row not yet there.
func (db *DB) Tables(ctx context.Context) ([]Table, error) {
	var tables []Table
	var err error
	if db.Postgres {
		tables, err = postgresTables(ctx, db.Reader)
	} else {
		tables, err = sqliteTables(ctx, db.Reader)
	}
	if err != nil {
		return nil, fmt.Errorf("read the tables: %w", err)
	}
	return parentsFirst(tables), nil
}

func sqliteTables(ctx context.Context, q *sql.DB) ([]Table, error) {
	names, err := Strings(ctx, q, `SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name <> 'schema_migrations' ORDER BY name`)
	if err != nil {
		return nil, err
	}
	var out []Table
	for _, name := range names {
		t := Table{Name: name}
		rows, err := q.QueryContext(ctx, `SELECT name, pk FROM pragma_table_info(?) ORDER BY cid`, name)
		if err != nil {
			return nil, err
		}
		keys := map[int]string{}
		for rows.Next() {
			var col string
			var pk int
			if err := rows.Scan(&col, &pk); err != nil {
				rows.Close()
				return nil, err
			}
			t.Columns = append(t.Columns, col)
			if pk > 0 {
				keys[pk] = col
			}
		}
		rows.Close()
		for i := 1; i <= len(keys); i++ {
			t.Key = append(t.Key, keys[i])
		}
		if t.Parents, err = Strings(ctx, q, `SELECT DISTINCT "table" FROM pragma_foreign_key_list(?)`, name); err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

func postgresTables(ctx context.Context, q *sql.DB) ([]Table, error) {
	names, err := Strings(ctx, q, `SELECT table_name FROM information_schema.tables
		WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' AND table_name <> 'schema_migrations' ORDER BY table_name`)
	if err != nil {
		return nil, err
	}
	var out []Table
	for _, name := range names {
		t := Table{Name: name}
		rows, err := q.QueryContext(ctx, `SELECT column_name, is_identity FROM information_schema.columns
			WHERE table_schema = current_schema() AND table_name = ? ORDER BY ordinal_position`, name)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var col, identity string
			if err := rows.Scan(&col, &identity); err != nil {
				rows.Close()
				return nil, err
			}
			t.Columns = append(t.Columns, col)
			if identity == "YES" {
				t.Identity = col
			}
		}
		rows.Close()
		if t.Key, err = Strings(ctx, q, `SELECT a.attname FROM pg_index i
			JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
			WHERE i.indrelid = CAST(? AS regclass) AND i.indisprimary
			ORDER BY array_position(i.indkey, a.attnum)`, name); err != nil {
			return nil, err
		}
		if t.Parents, err = Strings(ctx, q, `SELECT DISTINCT CAST(confrelid AS regclass)::text FROM pg_constraint
			WHERE conrelid = CAST(? AS regclass) AND contype = 'f'`, name); err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

// parentsFirst orders tables so that each comes after the tables it refers
// to (a table referring to itself is no constraint), by name otherwise.
func parentsFirst(tables []Table) []Table {
	sort.Slice(tables, func(i, j int) bool { return tables[i].Name < tables[j].Name })
	placed := map[string]bool{}
	var out []Table
	for len(out) < len(tables) {
		progress := false
		for _, t := range tables {
			if placed[t.Name] {
				continue
			}
			ready := true
			for _, p := range t.Parents {
				if p != t.Name && !placed[p] {
					ready = false
				}
			}
			if ready {
				out, placed[t.Name], progress = append(out, t), true, true
			}
		}
		if !progress { // a cycle: the rest in name order, and the copy says so
			for _, t := range tables {
				if !placed[t.Name] {
					out, placed[t.Name] = append(out, t), true
				}
			}
		}
	}
	return out
}

// Count is a table's rows and the digest of their content.
type Count struct {
	Table  string `json:"table"`
	Rows   int64  `json:"rows"`
	Digest string `json:"digest"`
}

// Digest counts a table's rows (read through q: a pool, or the
// transaction that wrote them) and digests them: SHA-256 over every row in
// key order, each value encoded by its kind (null, integer, real, text,
// bytes) so that the same rows give the same digest on either engine. The
// key order is that of the keys' encodings, byte by byte, so that neither
// engine's collation of text decides it.
func Digest(ctx context.Context, q Querier, t Table) (Count, error) {
	rows, err := q.QueryContext(ctx, `SELECT `+strings.Join(t.Columns, ", ")+` FROM `+t.Name)
	if err != nil {
		return Count{}, fmt.Errorf("read %s: %w", t.Name, err)
	}
	defer rows.Close()
	keyAt := make([]int, len(t.Key))
	for i, k := range t.Key {
		keyAt[i] = -1
		for j, c := range t.Columns {
			if c == k {
				keyAt[i] = j
			}
		}
	}
	type row struct{ key, sum []byte }
	var all []row
	vals, ptrs := scanTargets(len(t.Columns))
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return Count{}, err
		}
		var key, body bytes.Buffer
		for _, i := range keyAt {
			if i >= 0 {
				encode(&key, vals[i])
			}
		}
		for _, v := range vals {
			encode(&body, v)
		}
		if len(t.Key) == 0 {
			key = body
		}
		sum := sha256.Sum256(body.Bytes())
		all = append(all, row{key.Bytes(), sum[:]})
	}
	if err := rows.Err(); err != nil {
		return Count{}, err
	}
	sort.Slice(all, func(i, j int) bool { return bytes.Compare(all[i].key, all[j].key) < 0 })
	h := sha256.New()
	for _, r := range all {
		h.Write(r.sum)
	}
	return Count{Table: t.Name, Rows: int64(len(all)), Digest: hex.EncodeToString(h.Sum(nil))}, nil
}

// encode writes one value canonically: a kind letter, then the value, its
// length first where it has one.
func encode(b *bytes.Buffer, v any) {
	switch x := v.(type) {
	case nil:
		b.WriteString("N;")
	case int64:
		b.WriteString("I" + strconv.FormatInt(x, 10) + ";")
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<53 {
			b.WriteString("F" + strconv.FormatInt(int64(x), 10) + ";")
		} else {
			b.WriteString("F" + strconv.FormatFloat(x, 'g', -1, 64) + ";")
		}
	case string:
		b.WriteString("S" + strconv.Itoa(len(x)) + ":" + x)
	case []byte:
		b.WriteString("B" + strconv.Itoa(len(x)) + ":")
		b.Write(x)
	default:
		b.WriteString(fmt.Sprintf("?%T:%v;", v, v))
	}
}

// CopyRows copies every row of tables from src into dst's open
// transaction, parents first, and moves each PostgreSQL identity sequence
// past the rows written, so that the next row the store numbers itself
// takes a new number. It returns the rows copied per table.
func CopyRows(ctx context.Context, src *DB, tx *sql.Tx, dstPostgres bool, tables []Table) (map[string]int64, error) {
	copied := map[string]int64{}
	for _, t := range tables {
		marks := strings.TrimSuffix(strings.Repeat("?, ", len(t.Columns)), ", ")
		ins, err := tx.PrepareContext(ctx, `INSERT INTO `+t.Name+` (`+strings.Join(t.Columns, ", ")+`) VALUES (`+marks+`)`)
		if err != nil {
			return nil, fmt.Errorf("copy %s: %w", t.Name, err)
		}
		n, err := copyTable(ctx, src, ins, t)
		ins.Close()
		if err != nil {
			return nil, fmt.Errorf("copy %s: %w", t.Name, err)
		}
		copied[t.Name] = n
		if dstPostgres && t.Identity != "" {
			if _, err := tx.ExecContext(ctx, `SELECT setval(pg_get_serial_sequence(?, ?), coalesce(max(`+t.Identity+`), 0) + 1, false) FROM `+t.Name,
				t.Name, t.Identity); err != nil {
				return nil, fmt.Errorf("copy %s: move its sequence: %w", t.Name, err)
			}
		}
	}
	return copied, nil
}

func copyTable(ctx context.Context, src *DB, ins *sql.Stmt, t Table) (int64, error) {
	rows, err := src.Reader.QueryContext(ctx, `SELECT `+strings.Join(t.Columns, ", ")+` FROM `+t.Name)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	vals, ptrs := scanTargets(len(t.Columns))
	var n int64
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return n, err
		}
		if _, err := ins.ExecContext(ctx, vals...); err != nil {
			return n, err
		}
		n++
	}
	return n, rows.Err()
}

// scanTargets are a row's values and the pointers rows.Scan fills them through.
func scanTargets(n int) (vals, ptrs []any) {
	vals, ptrs = make([]any, n), make([]any, n)
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	return vals, ptrs
}
