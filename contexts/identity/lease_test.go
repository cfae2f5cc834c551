package identity

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"mesh-controller/embedded/sqlite"
	"mesh-controller/embedded/sqlite/sqlitetest"
	"mesh-controller/migrations"
)

// Each take of the lease is a new generation, one above any before, even
// after the lease was given back; a live lease is refused to another
// holder; and once taken over, the deposed holder's renewal is refused by
// the store's fence, whatever its process believes.
func TestStore_LeaseGenerations(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	take := func(holder string, at time.Time) (Lease, error) {
		return s.TakeLease(ctx, Lease{Holder: holder, PID: 1, Host: "h", ExpiresAt: at.Add(10 * time.Second)}, at)
	}
	a, err := take("a", now)
	if err != nil || a.Generation != 1 {
		t.Fatalf("first take: generation %d, %v", a.Generation, err)
	}
	if err := s.ReleaseLease(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if a, err = take("a", now); err != nil || a.Generation != 2 {
		t.Fatalf("taken again after giving it back: generation %d, %v (want 2: generations are never issued twice)", a.Generation, err)
	}

	t.Run("held", func(t *testing.T) {
		_, err := take("b", now.Add(9*time.Second))
		var held *LeaseHeldError
		if !errors.As(err, &held) || held.Lease.Holder != "a" || held.Lease.Generation != 2 {
			t.Fatalf("got %v, want a's live lease named", err)
		}
	})

	t.Run("deposed", func(t *testing.T) {
		b, err := take("b", now.Add(11*time.Second))
		if err != nil || b.Generation != 3 {
			t.Fatalf("take over a lapsed lease: generation %d, %v", b.Generation, err)
		}
		// a was paused past its lease: its renewal, carrying generation
		// 2, is refused by the fence, not by the lease row alone.
		err = s.RenewLease(sqlite.WithFence(ctx, a.Generation), "b", now.Add(time.Minute), "")
		var fenced *sqlite.FencedError
		if !errors.Is(err, ErrLeaseLost) || !errors.As(err, &fenced) || fenced.Mine != 2 || fenced.Fence != 3 {
			t.Fatalf("a deposed controller's renewal: %v", err)
		}
		if err := s.RenewLease(sqlite.WithFence(ctx, b.Generation), "b", now.Add(time.Minute), "nats://x"); err != nil {
			t.Fatalf("the holder's renewal: %v", err)
		}
		if l, _ := s.Lease(ctx); l.Holder != "b" || l.Generation != 3 || l.BrokerURL != "nats://x" {
			t.Fatalf("lease %+v", l)
		}
	})
}

// Standbys are listed while heard, and forgotten once they take the lease.
func TestStore_Standbys(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	for _, h := range []string{"x", "y"} {
		if err := s.StandBy(ctx, Standby{Holder: h, PID: 7, Host: "h", Since: now, ExpiresAt: now.Add(10 * time.Second)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.StandBy(ctx, Standby{Holder: "x", PID: 7, Host: "h", Since: now, ExpiresAt: now.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if sbs, err := s.Standbys(ctx, now.Add(30*time.Second)); err != nil || len(sbs) != 1 || sbs[0].Holder != "x" {
		t.Fatalf("after y lapsed: %+v, %v", sbs, err)
	}
	if _, err := s.TakeLease(ctx, Lease{Holder: "x", ExpiresAt: now.Add(time.Minute)}, now); err != nil {
		t.Fatal(err)
	}
	if sbs, err := s.Standbys(ctx, now); err != nil || len(sbs) != 1 || sbs[0].Holder != "y" {
		t.Fatalf("after x took the lease: %+v, %v", sbs, err)
	}
}

// openAt is an identity store migrated up to migration n only, as a
// binary that knows no more left it.
func openAt(t *testing.T, n int) (*sqlite.DB, []sqlite.Migration) {
	t.Helper()
	ctx := context.Background()
	dsn := filepath.Join(t.TempDir(), "identity.db")
	if sqlitetest.Engine() == "postgres" {
		dsn = sqlitetest.NewDatabase(t)
	}
	db, err := sqlite.Open(ctx, sqlite.Location{Context: "identity", DSN: dsn}, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ms, err := sqlite.LoadMigrations(migrations.For("identity"))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := db.Migrate(ctx, ms[:n], time.Now()); err != nil {
		t.Fatal(err)
	}
	return db, ms
}

// takeAsV020 takes the lease exactly as v0.2.0's TakeLease did: the fence
// raised alone, the lease written without a version.
func takeAsV020(ctx context.Context, db *sqlite.DB, holder string, now time.Time) error {
	return db.Write(ctx, func(tx *sql.Tx) error {
		var fence int64
		if err := tx.QueryRowContext(ctx, `SELECT generation FROM fence WHERE id = 1`).Scan(&fence); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE fence SET generation = ? WHERE id = 1`, fence+1); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO lease (id, holder, pid, host, taken_at, expires_at, broker_url, generation) VALUES (1, ?, 1, 'h', ?, ?, '', ?)
			ON CONFLICT (id) DO UPDATE SET holder = excluded.holder, generation = excluded.generation, expires_at = excluded.expires_at`,
			holder, sqlite.FormatTime(now), sqlite.FormatTime(now.Add(10*time.Second)), fence+1)
		return err
	})
}

// A store an older controller serves (its schema before migration 0008)
// is read and stood by on as it is; once migrated, the older controller's
// take of the lease, and its standing by, are refused by the store itself
// (it writes nothing, and is told to upgrade), while this one's take
// records its version.
func TestStore_LeaseAcrossVersions(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	db, ms := openAt(t, 6)
	s := NewStore(db)
	if err := takeAsV020(ctx, db, "old", now); err != nil {
		t.Fatal(err)
	}
	l, err := s.Lease(ctx)
	if err != nil || l == nil || l.Holder != "old" || l.Version != "" || l.Generation != 1 {
		t.Fatalf("the older controller's lease, read before migrating: %+v, %v", l, err)
	}
	if !strings.Contains((&LeaseHeldError{Lease: *l}).Error(), "(an older mesh-controller, which records no version)") {
		t.Errorf("held by an older one: %v", &LeaseHeldError{Lease: *l})
	}
	if err := s.StandBy(ctx, Standby{Holder: "new", PID: 2, Host: "h", Since: now, ExpiresAt: now.Add(10 * time.Second), Version: "v0.3.0"}); err != nil {
		t.Fatalf("standing by on the older schema: %v", err)
	}
	if sbs, err := s.Standbys(ctx, now); err != nil || len(sbs) != 1 || sbs[0].Holder != "new" {
		t.Fatalf("standbys before migrating: %+v, %v", sbs, err)
	}

	if _, _, err := db.Migrate(ctx, ms, now); err != nil {
		t.Fatal(err)
	}
	if err := s.MigratedBy(ctx, "v0.3.0"); err != nil {
		t.Fatal(err)
	}
	err = takeAsV020(ctx, db, "old2", now.Add(time.Minute))
	// PostgreSQL's names the version; SQLite's RAISE says a literal.
	if err == nil || !regexp.MustCompile(`these stores were migrated by (a newer mesh-controller|mesh-controller v0\.3\.0), which this older one cannot serve: upgrade this mesh-controller`).MatchString(err.Error()) {
		t.Fatalf("v0.2.0's take after migrating: %v", err)
	}
	if l, _ := s.Lease(ctx); l.Holder != "old" || l.Generation != 1 {
		t.Fatalf("the refused take changed the lease: %+v", l)
	}
	if g, _ := db.Fence(ctx); g != 1 {
		t.Fatalf("the refused take raised the fence to %d", g)
	}
	_, err = db.Exec(ctx, `INSERT INTO standbys (holder, pid, host, since, expires_at) VALUES ('old3', 3, 'h', ?, ?)`, sqlite.FormatTime(now), sqlite.FormatTime(now.Add(time.Hour)))
	if err == nil || !strings.Contains(err.Error(), "upgrade this mesh-controller") {
		t.Fatalf("v0.2.0 standing by after migrating: %v", err)
	}
	if sbs, _ := s.Standbys(ctx, now); len(sbs) != 0 {
		t.Fatalf("standbys recorded before migrating are forgotten: %+v", sbs)
	}

	got, err := s.TakeLease(ctx, Lease{Holder: "new", PID: 2, Host: "h", ExpiresAt: now.Add(time.Hour), Version: "v0.3.0"}, now.Add(time.Minute))
	if err != nil || got.Generation != 2 {
		t.Fatalf("this version's take: %+v, %v", got, err)
	}
	if l, _ := s.Lease(ctx); l.Version != "v0.3.0" || l.Generation != 2 {
		t.Fatalf("lease %+v", l)
	}
	if v, err := s.Controller(ctx); err != nil || v != "v0.3.0" {
		t.Fatalf("last served by %q, %v", v, err)
	}
	if err := s.StandBy(ctx, Standby{Holder: "aside", PID: 4, Host: "h", Since: now, ExpiresAt: now.Add(time.Hour), Version: "v0.2.9", Aside: "too old"}); err != nil {
		t.Fatal(err)
	}
	if sbs, err := s.Standbys(ctx, now); err != nil || len(sbs) != 1 || sbs[0].Version != "v0.2.9" || sbs[0].Aside != "too old" {
		t.Fatalf("standbys: %+v, %v", sbs, err)
	}
}
