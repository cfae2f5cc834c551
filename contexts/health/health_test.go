package health

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"mesh-controller/embedded/sqlite/sqlitetest"
)

func TestStore_HandActs(t *testing.T) {
	db, _ := sqlitetest.Open(t, "health")
	s := NewStore(db)
	ctx := context.Background()
	now := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	if _, err := s.RecordHandAct(ctx, HandAct{At: now, What: "x"}); !errors.Is(err, ErrNoWhy) {
		t.Fatalf("no why: %v", err)
	}
	for i, why := range []string{"first", "second"} {
		if _, err := s.RecordHandAct(ctx, HandAct{At: now.Add(time.Duration(i) * time.Hour), What: "declare", Why: why, Who: "me@here"}); err != nil {
			t.Fatal(err)
		}
	}
	acts, err := s.HandActs(ctx, now.Add(30*time.Minute))
	if err != nil || len(acts) != 1 || acts[0].Why != "second" {
		t.Fatalf("since: %+v, %v", acts, err)
	}
}

func TestStore_Drops(t *testing.T) {
	db, _ := sqlitetest.Open(t, "health")
	s := NewStore(db)
	ctx := context.Background()
	t0 := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	s.CountDrops(ctx, "web1", "bad signature", 2, t0)
	s.CountDrops(ctx, "web1", "bad signature", 3, t0.Add(time.Minute))
	s.CountDrops(ctx, "web2", "unknown sender", 1, t0)
	drops, err := s.Drops(ctx, "web1")
	if err != nil || len(drops) != 1 || drops[0].Count != 5 || !drops[0].FirstAt.Equal(t0) || !drops[0].LastAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("web1: %+v, %v", drops, err)
	}
	if all, _ := s.Drops(ctx, ""); len(all) != 2 {
		t.Fatalf("all: %+v", all)
	}
}

func TestStore_JoinRefusals(t *testing.T) {
	db, _ := sqlitetest.Open(t, "health")
	s := NewStore(db)
	ctx := context.Background()
	t0 := time.Date(2026, 11, 29, 10, 0, 30, 0, time.UTC)
	for _, r := range []struct {
		source, reason string
		n              int64
		at             time.Time
	}{
		{"192.0.2.7", "unknown token", 5, t0.Add(-20 * time.Minute)},
		{"192.0.2.7", "unknown token", 2, t0},
		{"192.0.2.7", "unknown token", 3, t0.Add(10 * time.Second)},
		{"192.0.2.7", "used token", 1, t0.Add(time.Minute)},
		{"192.0.2.8", "unknown token", 4, t0},
	} {
		if err := s.CountJoinRefusals(ctx, r.source, r.reason, r.n, r.at); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.JoinRefusalsSince(ctx, t0.Add(-10*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].Source != "192.0.2.7" || got[0].Reason != "unknown token" || got[0].Count != 5 ||
		!got[0].FirstAt.Equal(t0.Truncate(time.Minute)) || !got[0].LastAt.Equal(t0.Add(10*time.Second)) ||
		got[1].Reason != "used token" || got[2].Source != "192.0.2.8" || got[2].Count != 4 {
		t.Fatalf("since: %+v", got)
	}
	if n, err := s.PruneMeasurements(ctx, t0.Add(-10*time.Minute), t0.Add(-10*time.Minute), 100); err != nil || n != 1 {
		t.Fatalf("pruned %d, %v", n, err)
	}
}

// The reads that take an optional filter (a node, a kind, a key) find
// their rows through an index, with the filter and without it where an
// index serves that: the WHERE clause is written per case, since one
// statement for both would have one plan, a scan.
func TestStore_QueryPlans(t *testing.T) {
	db, _ := sqlitetest.Open(t, "health")
	since := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name, index string
		query       func() (string, []any)
	}{
		{"drops of a node", "sqlite_autoindex_dropped_messages_1 (node=?)", func() (string, []any) { return dropsQuery("web1") }},
		{"durations of a kind", "durations_kind_at (kind=? AND at>?)", func() (string, []any) { return durationsQuery("apply", since) }},
		{"durations of all", "durations_kind_at (kind=? AND at>?)", func() (string, []any) { return durationsQuery("", since) }},
		{"a condition", "sqlite_autoindex_conditions_1 (key=?)", func() (string, []any) { return conditionsQuery("node.silent/web1") }},
		// by its key, not every key's rows since, read to keep one key's
		{"history of a key", "condition_history_key (key=? AND at>?)", func() (string, []any) { return historyQuery("node.silent/web1", since) }},
		{"history of every key", "condition_history_at (at>?)", func() (string, []any) { return historyQuery("", since) }},
	} {
		query, args := c.query()
		plan := sqlitetest.QueryPlan(t, db, query, args...)
		if db.Postgres {
			continue
		}
		t.Logf("%s: %q", c.name, plan)
		if !sqlitetest.Indexed(plan) || !strings.Contains(strings.Join(plan, "\n"), c.index) {
			t.Errorf("%s does not find its rows through %s: %q", c.name, c.index, plan)
		}
	}
	// Every node's drops and every open condition are read whole: a scan
	// is their plan; that they run is what is checked.
	for _, q := range []func() (string, []any){
		func() (string, []any) { return dropsQuery("") },
		func() (string, []any) { return conditionsQuery("") },
	} {
		query, args := q()
		sqlitetest.QueryPlan(t, db, query, args...)
	}
}

// Durations of every kind are read as every kind the table allows named:
// the list is the table's CHECK, so a kind added there and not here fails.
func TestStore_DurationKinds(t *testing.T) {
	db, _ := sqlitetest.Open(t, "health")
	s := NewStore(db)
	ctx := context.Background()
	t0 := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	var ds []Duration
	for i, k := range durationKinds {
		ds = append(ds, Duration{Kind: k, Subject: "web1", MS: float64(i), At: t0})
	}
	if err := s.RecordDurations(ctx, ds); err != nil {
		t.Fatal(err)
	}
	if !db.Postgres {
		var table string
		if err := db.Reader.QueryRow(`SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'durations'`).Scan(&table); err != nil {
			t.Fatal(err)
		}
		want := "CHECK (kind IN ('" + strings.Join(durationKinds, "', '") + "'))"
		if !strings.Contains(table, want) {
			t.Fatalf("the durations table's CHECK is not %s: durationKinds must name every kind it allows\n%s", want, table)
		}
	}
	if all, err := s.Durations(ctx, "", t0); err != nil || len(all) != len(durationKinds) {
		t.Fatalf("every kind: %d durations, %v; want %d", len(all), err, len(durationKinds))
	}
	if got, err := s.Durations(ctx, "start", t0); err != nil || len(got) != 1 || got[0].Kind != "start" {
		t.Fatalf("start: %+v, %v", got, err)
	}
	if later, err := s.Durations(ctx, "", t0.Add(time.Second)); err != nil || len(later) != 0 {
		t.Fatalf("since later: %+v, %v", later, err)
	}
}

// A database's error says the store and the act it came from; the
// context's refusals come as they were, their words the whole answer.
func TestStore_ErrorsSayTheStore(t *testing.T) {
	db, _ := sqlitetest.Open(t, "health")
	s := NewStore(db)
	ctx := context.Background()
	if _, err := s.LastVerdict(ctx); err != ErrNoVerdict {
		t.Fatalf("no verdict: %v, want ErrNoVerdict as it is", err)
	}
	if _, err := s.Condition(ctx, "node.silent/web1"); !errors.Is(err, ErrNoCondition) || err.Error() != "node.silent/web1: no open condition has that key" {
		t.Fatalf("no condition: %q", err)
	}
	if _, err := db.Writer.Exec(`DROP TABLE hand_acts`); err != nil {
		t.Fatal(err)
	}
	_, err := s.HandActs(ctx, time.Time{})
	if err == nil || !strings.HasPrefix(err.Error(), "health store: read hand acts: ") {
		t.Fatalf("a lost table: %v", err)
	}
	if _, err := s.RecordHandAct(ctx, HandAct{What: "x", Why: "y"}); err == nil || !strings.HasPrefix(err.Error(), "health store: record a hand act: ") {
		t.Fatalf("a lost table, written: %v", err)
	}
}
