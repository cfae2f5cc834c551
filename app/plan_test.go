package app

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"mesh-controller/app/plan"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/inventory"
)

func TestMergeSettings(t *testing.T) {
	for _, c := range []struct {
		docs []string
		want string
	}{
		{[]string{`{"a":1}`}, `{"a":1}`},
		{[]string{`{"a":1,"b":{"x":1,"y":2}}`, `{"b":{"y":3,"z":4}}`, `{"a":2}`}, `{"a":2,"b":{"x":1,"y":3,"z":4}}`},
		{[]string{`{"b":{"x":1}}`, `{"b":[1,2]}`}, `{"b":[1,2]}`},
		{[]string{`{"b":[1,2]}`, `{"b":{"x":1}}`}, `{"b":{"x":1}}`},
		{[]string{`{"n":1.50,"s":"<&>"}`}, `{"n":1.50,"s":"<&>"}`},
		{nil, `{}`},
	} {
		var docs []json.RawMessage
		for _, d := range c.docs {
			docs = append(docs, json.RawMessage(d))
		}
		got, err := plan.MergeSettings(docs...)
		if err != nil || string(got) != c.want {
			t.Errorf("merge %v = %s, %v; want %s", c.docs, got, err, c.want)
		}
	}
	if _, err := plan.MergeSettings(json.RawMessage(`[1]`)); err == nil {
		t.Error("an array merged as settings")
	}
}

// plannedMesh makes a mesh of nodes with modules assigned in its stores (no
// daemon): nodes x perNode assignments over a pool of modules.
func plannedMesh(t testing.TB, nodes, perNode, modules int) *testApp {
	t.Helper()
	c, st := migrated(t)
	ctx := context.Background()
	inv := st.Inventory
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for i := 0; i < modules; i++ {
		doc := fmt.Sprintf(`{"module": "m%d", "version": "1.%d.0", "ports": [{"name": "p", "port": %d}],
			"settings": {"schema": {"type": "object", "properties": {"workers": {"type": "integer"}}}, "defaults": {"workers": %d}},
			"data": [{"name": "d", "path": "/srv/m%d", "precious": "costly", "backup": "daily"}]}`, i, i, 1000+i, i, i)
		m, ps := inventory.ParseManifest([]byte(doc))
		if len(ps) > 0 {
			t.Fatal(ps)
		}
		canon, _ := protocol.Canonical(m)
		if _, err := inv.AddModule(ctx, m, canon, "", now); err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 {
			inv.SetSettings(ctx, inventory.SettingsLayer{Module: m.Module, Body: json.RawMessage(`{"workers": 9}`), SetAt: now}, nil)
		}
	}
	var as []inventory.Assignment
	for n := 0; n < nodes; n++ {
		name := fmt.Sprintf("n%d", n)
		if _, err := inv.AddNode(ctx, name, inventory.Converged, now); err != nil {
			t.Fatal(err)
		}
		for k := 0; k < perNode; k++ {
			mod := (n + k*7) % modules
			as = append(as, inventory.Assignment{Node: name, Module: fmt.Sprintf("m%d", mod), Version: fmt.Sprintf("1.%d.0", mod), AssignedAt: now})
		}
	}
	if err := inv.Apply(ctx, inventory.Change{Assign: as}, now); err != nil {
		t.Fatal(err)
	}
	return c
}

// Computing a plan twice gives the same bytes, and so does a new snapshot.
func TestPlan_Deterministic(t *testing.T) {
	c := plannedMesh(t, 20, 4, 10)
	ctx := context.Background()
	first, err := c.PlanShow(ctx, "n3")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		again, err := c.PlanShow(ctx, "n3")
		if err != nil {
			t.Fatal(err)
		}
		if string(again.JSON) != string(first.JSON) {
			t.Fatalf("plan changed between runs:\n%s\n%s", first.JSON, again.JSON)
		}
	}
	if len(first.Plan.Body.Modules) != 4 {
		t.Fatalf("n3 plans %d modules", len(first.Plan.Body.Modules))
	}
}

// BenchmarkPlans computes the plan of every node of a mesh of 500 nodes and
// 2,000 assignments, from one snapshot of the store (read included).
//
//	go test -run '^$' -bench Plans ./app/
func BenchmarkPlans(b *testing.B) {
	c := plannedMesh(b, 500, 4, 40)
	ctx := context.Background()
	st, err := c.stores(ctx)
	if err != nil {
		b.Fatal(err)
	}
	inv := st.Inventory
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		snap, err := inv.Snapshot(ctx)
		if err != nil {
			b.Fatal(err)
		}
		pl := plan.New(snap, nil)
		for _, n := range snap.NodeNames {
			p, err := pl.Plan(n)
			if err != nil || len(p.Problems) > 0 {
				b.Fatal(err, p.Problems)
			}
			if _, err := p.Body.Encode(); err != nil {
				b.Fatal(err)
			}
		}
	}
}

func FuzzModuleCheck(f *testing.F) {
	f.Add([]byte(`{"module":"a","version":"1.0.0"}`))
	f.Add([]byte(`{"module":"a","version":"1.0.0","settings":{"schema":{"type":"object"},"defaults":{}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		file := filepath.Join(t.TempDir(), "mesh.json")
		if err := os.WriteFile(file, data, 0o600); err != nil {
			t.Fatal(err)
		}
		files, problems, err := ModuleCheck([]string{file})
		if err != nil || len(files) != 1 {
			t.Fatalf("files %v, err %v", files, err)
		}
		for _, p := range problems {
			if p.File != file || p.Field == "" || p.What == "" {
				t.Fatalf("problem without file, field or what: %+v", p)
			}
		}
	})
}

// BenchmarkDeclare1000 plans, signs and keeps the declarations of 1,000
// nodes (4,000 assignments) in one push, without sending them.
//
//	go test -run '^$' -bench Declare1000 ./app/
func BenchmarkDeclare1000(b *testing.B) {
	c := plannedMesh(b, 1000, 4, 40)
	ctx := context.Background()
	st, err := c.stores(ctx)
	if err != nil {
		b.Fatal(err)
	}
	inv := st.Inventory
	key, err := st.Identity.SigningKey(ctx)
	if err != nil {
		b.Fatal(err)
	}
	d := &declarer{inv: inv, sec: st.Secrets, lic: st.Licences, ids: st.Identity, key: key, now: time.Now, notSent: "benchmark"}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		snap, err := inv.Snapshot(ctx)
		if err != nil {
			b.Fatal(err)
		}
		for _, p := range d.declare(ctx, snap, snap.NodeNames) {
			if p.Problem != "" {
				b.Fatal(p.Problem)
			}
		}
	}
}

// BenchmarkDeclare10000 is a change that touches every node of a mesh of
// 10,000 (a roll-out --together, a mesh-wide setting): every plan made,
// signed and kept in one push, not sent; it reports the parts.
//
//	go test -run '^$' -bench Declare10000 -benchtime 3x ./app/
func BenchmarkDeclare10000(b *testing.B) {
	c := plannedMesh(b, 10000, 1, 40)
	ctx := context.Background()
	st, err := c.stores(ctx)
	if err != nil {
		b.Fatal(err)
	}
	key, err := st.Identity.SigningKey(ctx)
	if err != nil {
		b.Fatal(err)
	}
	d := &declarer{inv: st.Inventory, sec: st.Secrets, lic: st.Licences, ids: st.Identity, key: key, now: time.Now, notSent: "benchmark"}
	var sum DeclareTimes
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		snap, err := st.Inventory.Snapshot(ctx)
		if err != nil {
			b.Fatal(err)
		}
		for _, p := range d.declare(ctx, snap, snap.NodeNames) {
			if p.Problem != "" {
				b.Fatal(p.Problem)
			}
		}
		sum.Plan += d.took.Plan
		sum.Sign += d.took.Sign
		sum.Store += d.took.Store
	}
	n := float64(b.N)
	b.ReportMetric(sum.Plan.Seconds()*1000/n, "plan-ms")
	b.ReportMetric(sum.Sign.Seconds()*1000/n, "sign-ms")
	b.ReportMetric(sum.Store.Seconds()*1000/n, "store-ms")
}

// A node the mesh owns a filter on is declared with its rendered ruleset,
// or not planned at all without one (declared without, its host would
// remove the filter); adopted again, it is declared with none.
func TestPlan_Filter(t *testing.T) {
	c := plannedMesh(t, 2, 1, 2)
	ctx := context.Background()
	st, err := c.stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inv := st.Inventory
	if err := inv.Converge(ctx, "n1", &inventory.Filter{Kind: inventory.FilterNftables, Since: time.Now()}, 0); err != nil {
		t.Fatal(err)
	}
	planOf := func(rs string) plan.Plan {
		t.Helper()
		snap, err := inv.Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		pl := plan.New(snap, nil)
		if rs != "" {
			pl.WithFilter(func(body protocol.Declaration, f inventory.Filter) (string, error) {
				if body.Node != "n1" || len(body.Modules) == 0 || f.Kind != inventory.FilterNftables {
					return "", fmt.Errorf("rendered from %+v, %+v", body, f)
				}
				return rs, nil
			})
		}
		p, err := pl.Plan("n1")
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if p := planOf(""); len(p.Problems) != 1 || !strings.Contains(p.Problems[0], "n1 owns the nftables filter: none was rendered for it") {
		t.Fatalf("no ruleset: %v", p.Problems)
	}
	rs := "table inet mesh {\n}\n"
	p := planOf(rs)
	if len(p.Problems) != 0 || p.Body.Filter == nil || *p.Body.Filter != (protocol.DeclaredFilter{Kind: "nftables", Ruleset: rs}) || p.Body.Mode != "converged" {
		t.Fatalf("with a ruleset: %+v %v", p.Body.Filter, p.Problems)
	}
	if err := inv.Adopt(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	if p := planOf(rs); len(p.Problems) != 0 || p.Body.Filter != nil || p.Body.Mode != "adopted" {
		t.Fatalf("adopted: %+v %v", p.Body.Filter, p.Problems)
	}
}
