package app

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"mesh-controller/contexts/inventory"
	"mesh-controller/embedded/sqlite"
	"mesh-controller/embedded/sqlite/sqlitetest"
)

// Two acts at once, round after round, on SQLite and on PostgreSQL, each
// pair held once judged until both are (judged on one snapshot): the
// outcome is always that of one act after the other.
//   - two modules that both declare port 8000, assigned to one node at
//     once: exactly one is assigned;
//   - a node removed while a module is assigned to it: either the node is
//     gone and nothing is assigned to it, or it stays with its module.
func TestActs_Concurrent(t *testing.T) {
	for _, engine := range []string{"sqlite", "postgres"} {
		t.Run(engine, func(t *testing.T) {
			env := map[string]string{}
			// The gate makes every round judge both acts on one snapshot:
			// a few dozen rounds try the window as surely as hundreds.
			rounds := 50
			if engine == "postgres" {
				for _, name := range Contexts {
					env[sqlite.EnvVar(name)] = sqlitetest.NewDatabase(t)
				}
				rounds = 20
			}
			dir := t.TempDir()
			open := func() *testApp {
				c := newTestApp(t, dir, func(k string) string { return env[k] })
				return c
			}
			// On SQLite a process opens a store once: the second acts
			// through the same controller, as the API and serve do in one
			// process (the two-process stress is the command line's,
			// cmd/mesh-controller's TestActs_TwoProcesses); on PostgreSQL
			// a second controller has connections of its own.
			c1, c2 := open(), (*testApp)(nil)
			if engine == "postgres" {
				c2 = open()
			} else {
				c2 = c1
			}
			ctx := context.Background()
			if _, err := c1.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			for _, m := range []string{"porta", "portb"} {
				if _, err := c1.ModuleAdd(ctx, writeManifest(t, `{"module": "`+m+`", "version": "1.0.0", "ports": [{"name": "http", "port": 8000}]}`), ""); err != nil {
					t.Fatal(err)
				}
			}
			for _, n := range []string{"n1", "gone"} {
				if _, err := c1.NodeAdd(ctx, n, false); err != nil {
					t.Fatal(err)
				}
			}
			both := func(a, b func() error) (error, error) {
				var wg sync.WaitGroup
				var ea, eb error
				wg.Add(2)
				go func() { defer wg.Done(); ea = a() }()
				go func() { defer wg.Done(); eb = b() }()
				wg.Wait()
				return ea, eb
			}
			assigned := func(node string) []string {
				_, snap, err := c1.storesAndSnapshot(ctx)
				if err != nil {
					t.Fatal(err)
				}
				var out []string
				for _, a := range snap.Assignments {
					if a.Node == node {
						out = append(out, a.Module)
					}
				}
				return out
			}
			// The first two acts of a round are held once judged until
			// both are: both judged on one snapshot, the window the
			// commit must close.
			var mu sync.Mutex
			var held int
			gate := make(chan struct{})
			actJudged = func(string) {
				mu.Lock()
				held++
				n, g := held, gate
				mu.Unlock()
				switch n {
				case 1:
					select {
					case <-g:
					case <-time.After(time.Second):
					}
				case 2:
					close(g)
				}
			}
			t.Cleanup(func() { actJudged = nil })
			// round arms the gate for a pair of acts that both go through
			// it (or lets every act by: held past two).
			round := func(pair bool) {
				mu.Lock()
				held, gate = 0, make(chan struct{})
				if !pair {
					held = 2
				}
				mu.Unlock()
			}
			for i := range rounds {
				round(true)
				ea, eb := both(func() error { _, err := c1.Assign(ctx, "n1", []string{"porta"}); return err },
					func() error { _, err := c2.Assign(ctx, "n1", []string{"portb"}); return err })
				on := assigned("n1")
				if len(on) != 1 || (ea == nil) == (eb == nil) {
					t.Fatalf("round %d: both assigns at once: porta %v, portb %v; n1 runs %v", i, ea, eb, on)
				}
				if errors.Is(ea, inventory.ErrActConflict) || errors.Is(eb, inventory.ErrActConflict) {
					t.Fatalf("round %d: an act was not judged again: %v %v", i, ea, eb)
				}
				round(false)
				if _, err := c1.Unassign(ctx, "n1", on); err != nil {
					t.Fatalf("round %d: %v", i, err)
				}

				er, ea2 := both(func() error { _, err := c1.NodeRemove(ctx, NodeRemoveRequest{Names: []string{"gone"}}); return err },
					func() error { _, err := c2.Assign(ctx, "gone", []string{"porta"}); return err })
				_, snap, err := c1.storesAndSnapshot(ctx)
				if err != nil {
					t.Fatal(err)
				}
				_, there := snap.Nodes["gone"]
				switch on := assigned("gone"); {
				case er == nil && (there || len(on) > 0):
					t.Fatalf("round %d: the node was removed (assign: %v) yet it is there %v running %v", i, ea2, there, on)
				case er != nil && (!there || ea2 != nil || len(on) != 1):
					t.Fatalf("round %d: the removal was refused (%v), the assign said %v, it runs %v", i, er, ea2, on)
				}
				if er == nil {
					if _, err := c1.NodeAdd(ctx, "gone", false); err != nil {
						t.Fatal(err)
					}
				} else if _, err := c1.Unassign(ctx, "gone", []string{"porta"}); err != nil {
					t.Fatal(err)
				}
			}
			fmt.Fprintf(testingWriter{t}, "%d rounds of two acts at once on %s, each the outcome of one after the other\n", rounds, engine)
		})
	}
}

// testingWriter logs through t.
type testingWriter struct{ t *testing.T }

func (w testingWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }
