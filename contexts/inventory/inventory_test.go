package inventory

import (
	"context"
	"errors"
	"testing"
	"time"

	"mesh-controller/embedded/sqlite"
	"mesh-controller/embedded/sqlite/sqlitetest"
)

func newStore(t *testing.T) (*Store, *sqlite.DB) {
	db, _ := sqlitetest.Open(t, "inventory")
	return NewStore(db), db
}

// addNodes adds converged nodes.
func addNodes(t *testing.T, s *Store, at time.Time, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := s.AddNode(context.Background(), n, Converged, at); err != nil {
			t.Fatal(err)
		}
	}
}

func TestStore_AddNode(t *testing.T) {
	s, db := newStore(t)
	ctx := context.Background()
	now := time.Date(2026, 11, 29, 10, 0, 0, 123456789, time.UTC)
	n, err := s.AddNode(ctx, "web1", Converged, now)
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Node(ctx, "web1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "web1" || got.Mode != Converged || !got.CreatedAt.Equal(n.CreatedAt) || got.JoinedAt != nil || got.LastHeard != nil {
		t.Fatalf("got %+v, want %+v", got, n)
	}
	t.Run("duplicate", func(t *testing.T) {
		_, err := s.AddNode(ctx, "web1", Adopted, now)
		if !errors.Is(err, ErrNodeExists) {
			t.Fatalf("got %v", err)
		}
		if got, _ := s.Node(ctx, "web1"); got.Mode != Converged {
			t.Fatal("the refused add changed the node")
		}
	})
	t.Run("not found", func(t *testing.T) {
		if _, err := s.Node(ctx, "web2"); !errors.Is(err, ErrNodeNotFound) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("listed by name", func(t *testing.T) {
		s.AddNode(ctx, "db1", Adopted, now)
		nodes, err := s.Nodes(ctx)
		if err != nil || len(nodes) != 2 || nodes[0].Name != "db1" || nodes[1].Name != "web1" || nodes[0].Mode != Adopted {
			t.Fatalf("got %+v, %v", nodes, err)
		}
	})
	t.Run("only the named are read", func(t *testing.T) {
		nodes, err := s.NodesNamed(ctx, []string{"web1", "web9"})
		if err != nil || len(nodes) != 1 || nodes[0].Name != "web1" {
			t.Fatalf("got %+v, %v", nodes, err)
		}
	})
	t.Run("the store itself refuses bad names and modes", func(t *testing.T) {
		for _, row := range [][2]string{{"Web9", "converged"}, {"9web", "converged"}, {"web_9", "converged"}, {"web9", "sideways"}} {
			if _, err := db.Writer.Exec(`INSERT INTO nodes (name, mode, created_at) VALUES (?, ?, '2026-01-01T00:00:00.000Z')`, row[0], row[1]); err == nil {
				t.Errorf("store accepted %v", row)
			}
		}
	})
}

// A declaration made under a lease generation the store's fence has passed
// (a deposed controller's) is refused by the store: no serial is issued, and
// the next one, made by the new holder, is one above the last.
func TestStore_DeclarationFenced(t *testing.T) {
	s, db := newStore(t)
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	if _, err := s.AddNode(ctx, "web1", Converged, now); err != nil {
		t.Fatal(err)
	}
	sign := func(serial int64, _ time.Time) (string, string, string, error) { return "{}", "sig", "key", nil }
	old := sqlite.WithFence(ctx, 1)
	if d, err := s.SaveDeclaration(old, "web1", 0, sign, now); err != nil || d.Serial != 1 {
		t.Fatalf("serial %d, %v", d.Serial, err)
	}
	if err := db.RaiseFence(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SaveDeclaration(old, "web1", 0, sign, now); !errors.Is(err, sqlite.ErrLeaseLost) {
		t.Fatalf("the deposed controller's declaration: %v", err)
	}
	if d, err := s.SaveDeclaration(sqlite.WithFence(ctx, 2), "web1", 0, sign, now); err != nil || d.Serial != 2 {
		t.Fatalf("the new holder's declaration: serial %d, %v", d.Serial, err)
	}
	if err := db.RaiseFence(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if g, err := db.Fence(ctx); err != nil || g != 2 {
		t.Fatalf("the fence was lowered to %d (%v)", g, err)
	}
}

// A beat that says its host is applying a declaration is read back with
// the node; the next beat that says nothing of it clears it.
func TestStore_RecordBeatsApplying(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	if _, err := s.AddNode(ctx, "web1", Converged, t0); err != nil {
		t.Fatal(err)
	}
	since := t0.Add(-90 * time.Second)
	if err := s.RecordBeats(ctx, []Beat{{Node: "web1", HeardAt: t0, IntervalS: 10, SerialApplied: 6, Applying: &Applying{Serial: 7, Since: since, Phase: "archives"}}}); err != nil {
		t.Fatal(err)
	}
	n, err := s.Node(ctx, "web1")
	if err != nil || n.Applying == nil || n.Applying.Serial != 7 || !n.Applying.Since.Equal(since) || n.Applying.Phase != "archives" {
		t.Fatalf("applying %+v, %v", n.Applying, err)
	}
	if err := s.RecordBeats(ctx, []Beat{{Node: "web1", HeardAt: t0.Add(10 * time.Second), IntervalS: 10, SerialApplied: 7}}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Node(ctx, "web1"); err != nil || n.Applying != nil || n.SerialApplied != 7 {
		t.Fatalf("after the apply: applying %+v, applied %d, %v", n.Applying, n.SerialApplied, err)
	}
}
