package sqlitetest

import (
	"context"
	"strings"
	"testing"

	"mesh-controller/embedded/sqlite"
)

// QueryPlan is SQLite's EXPLAIN QUERY PLAN of a query: one detail line per
// step. On PostgreSQL, which plans by statistics a test's small tables do
// not have, it runs EXPLAIN only, so that the query is checked to be
// PostgreSQL's too, and returns nil.
func QueryPlan(t testing.TB, db *sqlite.DB, query string, args ...any) []string {
	t.Helper()
	ctx := context.Background()
	if db.Postgres {
		rows, err := db.Reader.QueryContext(ctx, `EXPLAIN `+query, args...)
		if err != nil {
			t.Fatalf("EXPLAIN %s: %v", query, err)
		}
		rows.Close()
		return nil
	}
	rows, err := db.Reader.QueryContext(ctx, `EXPLAIN QUERY PLAN `+query, args...)
	if err != nil {
		t.Fatalf("EXPLAIN QUERY PLAN %s: %v", query, err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return plan
}

// Indexed says a SQLite plan finds its rows through indexes: some step
// searches one, and none scans a table or an index whole.
func Indexed(plan []string) bool {
	used := false
	for _, step := range plan {
		if strings.HasPrefix(step, "SCAN ") {
			return false
		}
		used = used || strings.Contains(step, " USING INDEX ") || strings.Contains(step, " USING COVERING INDEX ") ||
			strings.Contains(step, " USING PRIMARY KEY") || strings.Contains(step, " USING INTEGER PRIMARY KEY")
	}
	return used
}
