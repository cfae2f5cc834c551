package postgres

import (
	"strings"
	"testing"
)

func TestRebind(t *testing.T) {
	for in, want := range map[string]string{
		`SELECT 1`: `SELECT 1`,
		`SELECT * FROM t WHERE a = ? AND b IN (?, ?)`: `SELECT * FROM t WHERE a = $1 AND b IN ($2, $3)`,
		`SELECT '?' || ?, "q?" FROM t -- why?
		WHERE x = ? /* ? */`: `SELECT '?' || $1, "q?" FROM t -- why?
		WHERE x = $2 /* ? */`,
		// SQLite's numbering: ?N is N, a bare ? one more than the largest before it.
		`UPDATE t SET a = ?1, b = CASE WHEN b > ?3 THEN b ELSE ?3 END, c = ?`: `UPDATE t SET a = $1, b = CASE WHEN b > $3 THEN b ELSE $3 END, c = $4`,
		`SELECT 'it''s ?' , ?`: `SELECT 'it''s ?' , $1`,
		`FROM nodes n LEFT JOIN declarations d INDEXED BY declarations_versions ON d.node = n.name WHERE n.name = ?`: `FROM nodes n LEFT JOIN declarations d ON d.node = n.name WHERE n.name = $1`,
	} {
		if got := Rebind(in); got != want {
			t.Errorf("Rebind(%q)\n got %q\nwant %q", in, got, want)
		}
	}
}

// A password never leaves through a message or a listing.
func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://mesh:s3cret@db.example:5432/inventory?sslmode=require": "postgres://mesh:xxxxx@db.example:5432/inventory?sslmode=require",
		"postgresql://mesh@db/inventory":                                   "postgresql://mesh@db/inventory",
		"postgres://db/inventory?user=mesh&password=s3cret":                "postgres://db/inventory?password=xxxxx&user=mesh",
		"postgres://mesh:s3cret@db:notaport/inventory":                     "postgres://(unparsable)",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
	if _, _, err := Config("postgres://mesh:s3cret@db:notaport/inventory"); err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("a URL that does not parse: %v", err)
	}
}
