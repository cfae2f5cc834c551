package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"

	"mesh-controller/app"
	"mesh-controller/embedded/sqlite"
	"mesh-controller/embedded/sqlite/sqlitetest"
)

// Two mesh-controller processes acting at once, round after round, on
// SQLite and on PostgreSQL: whatever their timing, the outcome is that of
// one act after the other, and no rule is ever broken (issue 30).
//   - ports: two modules that both declare port 8000 assigned to one node:
//     exactly one is;
//   - seats: a module whose seat has one holder assigned to two nodes: the
//     seat has exactly one holder;
//   - node remove against assign: never both, and never a removed node
//     running something;
//   - unassign against unassign of a consumer's two providers: one stays;
//   - pin against unassign of the provider pinned: the consumer is bound to
//     a provider that is assigned.
//
// MESH_ACT_ROUNDS sets the rounds on SQLite (each round runs every pair;
// PostgreSQL runs half as many); make stress runs 200.
func TestActs_TwoProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binary hundreds of times")
	}
	t.Parallel()
	bin := buildBinary(t)
	rounds := 8 // MESH_ACT_ROUNDS=100 for a longer stress
	if s := os.Getenv("MESH_ACT_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("MESH_ACT_ROUNDS=%q: %v", s, err)
		}
		rounds = n
	}
	for _, engine := range []string{"sqlite", "postgres"} {
		t.Run(engine, func(t *testing.T) {
			if engine == "postgres" && os.Getenv(sqlitetest.PostgresVar) == "" && !sqlitetest.Required() {
				t.Skip(sqlitetest.PostgresVar + " is not set")
			}
			env := []string{"MESH_DATA=" + filepath.Join(t.TempDir(), "data")}
			rounds := rounds
			if engine == "postgres" {
				rounds = (rounds + 1) / 2 // a process opens six databases
				for _, name := range app.Contexts {
					env = append(env, sqlite.EnvVar(name)+"="+sqlitetest.NewDatabase(t))
				}
			}
			work := t.TempDir()
			run := func(args ...string) (string, error) {
				cmd := exec.Command(bin, args...)
				cmd.Dir, cmd.Env = work, append(os.Environ(), env...)
				var out bytes.Buffer
				cmd.Stdout, cmd.Stderr = &out, &out
				err := cmd.Run()
				return out.String(), err
			}
			must := func(args ...string) string {
				t.Helper()
				out, err := run(args...)
				if err != nil {
					t.Fatalf("%v: %v\n%s", args, err, out)
				}
				return out
			}
			both := func(a, b []string) (errA, errB error, outA, outB string) {
				var wg sync.WaitGroup
				wg.Add(2)
				go func() { defer wg.Done(); outA, errA = run(a...) }()
				go func() { defer wg.Done(); outB, errB = run(b...) }()
				wg.Wait()
				return
			}
			type planJSON struct {
				Modules []struct {
					Module   string `json:"module"`
					Bindings []struct {
						From string `json:"from"`
					} `json:"bindings"`
				} `json:"modules"`
			}
			modulesOn := func(node string) []string {
				t.Helper()
				var p planJSON
				decodeJSON(t, must("plan", node, "--json"), &p)
				var out []string
				for _, m := range p.Modules {
					out = append(out, m.Module)
				}
				return out
			}
			must("migrate")
			for name, manifest := range map[string]string{
				"porta":  `{"module": "porta", "version": "1.0.0", "ports": [{"name": "http", "port": 8000}]}`,
				"portb":  `{"module": "portb", "version": "1.0.0", "ports": [{"name": "http", "port": 8000}]}`,
				"keeper": `{"module": "keeper", "version": "1.0.0", "seats": [{"seat": "vault", "delivers": "keeps things"}]}`,
				"prov":   `{"module": "prov", "version": "1.0.0", "provides": [{"provision": "thing"}]}`,
				"cons":   `{"module": "cons", "version": "1.0.0", "needs": [{"provision": "thing"}]}`,
			} {
				path := filepath.Join(work, name+".json")
				if err := os.WriteFile(path, []byte(manifest), 0o600); err != nil {
					t.Fatal(err)
				}
				must("module", "add", path)
			}
			for _, n := range []string{"n1", "k1", "k2", "gone", "p1", "p2", "c1"} {
				must("node", "add", n)
			}
			must("assign", "p1", "prov")
			must("assign", "p2", "prov")
			must("assign", "c1", "cons")
			for i := range rounds {
				// ports
				ea, eb, oa, ob := both([]string{"assign", "n1", "porta"}, []string{"assign", "n1", "portb"})
				on := modulesOn("n1")
				if len(on) != 1 || (ea == nil) == (eb == nil) {
					t.Fatalf("round %d, ports: n1 runs %v; porta: %v %s; portb: %v %s", i, on, ea, oa, eb, ob)
				}
				must("unassign", "n1", on[0])

				// seats
				ea, eb, oa, ob = both([]string{"assign", "k1", "keeper"}, []string{"assign", "k2", "keeper"})
				if ea != nil || eb != nil {
					t.Fatalf("round %d, seats: k1: %v %s; k2: %v %s", i, ea, oa, eb, ob)
				}
				var seats []struct {
					Seat    string   `json:"seat"`
					Holders []string `json:"holders"`
				}
				decodeJSON(t, must("seat", "list", "--json"), &seats)
				for _, s := range seats {
					if s.Seat == "vault" && len(s.Holders) != 1 {
						t.Fatalf("round %d, seats: vault is held by %v", i, s.Holders)
					}
				}
				must("unassign", "k1", "keeper")
				must("unassign", "k2", "keeper")

				// node remove against assign
				er, ea2, or, oa2 := both([]string{"node", "remove", "gone"}, []string{"assign", "gone", "porta"})
				nodes := must("node", "list")
				there := bytes.Contains([]byte(nodes), []byte("gone"))
				switch {
				case er == nil && ea2 == nil:
					t.Fatalf("round %d, node remove and assign both done:\n%s\n%s", i, or, oa2)
				case er == nil && there:
					t.Fatalf("round %d: gone was removed yet is listed:\n%s", i, nodes)
				case er != nil && (ea2 != nil || !slices.Equal(modulesOn("gone"), []string{"porta"})):
					t.Fatalf("round %d: the removal was refused (%s), the assign said %v %s", i, or, ea2, oa2)
				}
				if er == nil {
					must("node", "add", "gone")
				} else {
					must("unassign", "gone", "porta")
				}

				// unassign against unassign of a consumer's two providers
				e1, e2, o1, o2 := both([]string{"unassign", "p1", "prov"}, []string{"unassign", "p2", "prov"})
				left := len(modulesOn("p1")) + len(modulesOn("p2"))
				if left != 1 || (e1 == nil) == (e2 == nil) {
					t.Fatalf("round %d, last provider: %d providers left; p1: %v %s; p2: %v %s", i, left, e1, o1, e2, o2)
				}
				if e1 == nil {
					must("assign", "p1", "prov")
				} else {
					must("assign", "p2", "prov")
				}

				// pin against unassign of the provider pinned
				ep, eu, op, ou := both([]string{"provision", "pin", "c1", "thing", "p1", "prov"}, []string{"unassign", "p1", "prov"})
				if eu != nil {
					t.Fatalf("round %d, pin and unassign: the unassign was refused: %s (pin: %v %s)", i, ou, ep, op)
				}
				var p planJSON
				decodeJSON(t, must("plan", "c1", "--json"), &p)
				for _, m := range p.Modules {
					for _, b := range m.Bindings {
						if b.From != "p2/prov" {
							t.Fatalf("round %d, pin and unassign: c1 is bound to %s, which does not run (pin: %v %s)", i, b.From, ep, op)
						}
					}
				}
				if ep == nil {
					must("provision", "unpin", "c1", "thing")
				}
				must("assign", "p1", "prov")
			}
			t.Log(fmt.Sprintf("%d rounds of five pairs of acts from two processes at once on %s, each the outcome of one after the other", rounds, engine))
		})
	}
}
