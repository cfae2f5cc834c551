package app

import (
	"context"
	"errors"
	"testing"
	"time"

	"filippo.io/age"

	"mesh-controller/contexts/health"
)

// migrated is a controller on migrated stores in a temporary dir, no daemon,
// and its stores.
func migrated(t testing.TB) (*testApp, *Stores) {
	t.Helper()
	c := newTestApp(t, t.TempDir(), func(string) string { return "" })
	if _, err := c.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	st, err := c.stores(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return c, st
}

// withOperator sets a new operator key on c and returns its identity, which
// opens what is sealed to the operator (backups, break-glass copies).
func withOperator(t testing.TB, c *testApp) *age.X25519Identity {
	t.Helper()
	op, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.OperatorKeySet(context.Background(), op.Recipient().String(), false); err != nil {
		t.Fatal(err)
	}
	return op
}

func TestDeclare_RecordsTheHandAct(t *testing.T) {
	c := newTestApp(t, t.TempDir(), func(string) string { return "" })
	ctx := context.Background()
	if _, err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.NodeAdd(ctx, "web1", false); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Declare(ctx, DeclareRequest{Node: "web1", Body: []byte(`{}`), From: "x.json"}); !errors.Is(err, health.ErrNoWhy) {
		t.Fatalf("no why: %v", err)
	}
	if _, err := c.Declare(ctx, DeclareRequest{Node: "web1", Body: []byte(`{"modules": []}`), From: "x.json", Why: "testing"}); err != nil {
		t.Fatal(err)
	}
	st, err := c.stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	acts, err := st.Health.HandActs(ctx, time.Time{})
	if err != nil || len(acts) != 1 || acts[0].Why != "testing" || acts[0].What != "declare web1 serial 1 from x.json" || acts[0].Who == "" {
		t.Fatalf("hand acts: %+v, %v", acts, err)
	}
}
