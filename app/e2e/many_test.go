package e2e

import (
	"context"
	"errors"
	"fmt"
	"mesh-controller/app"
	"strings"
	"testing"
)

// assign --nodes on real hosts: five nodes given a module in one act, each
// sent one declaration and applying it; a refusal on any node records
// nothing on any; unassign --nodes takes it off them all; push --all sends
// every node its declaration. Progress is told each stage.
func TestMany_AssignUnassignPushAll(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	ctx := context.Background()
	var nodes []string
	for i := 1; i <= 5; i++ {
		name := fmt.Sprintf("web%d", i)
		m.join(name)
		nodes = append(nodes, name)
	}
	m.addModule(writeManifest(t, `{"module": "fan", "version": "1.0.0", "data": [{"name": "d", "path": "/srv/fan", "precious": "rebuildable"}]}`))
	m.addModule(writeManifest(t, `{"module": "other", "version": "1.0.0", "ports": [{"name": "p", "port": 7001}]}`))
	m.addModule(writeManifest(t, `{"module": "clash", "version": "1.0.0", "ports": [{"name": "p", "port": 7001}]}`))
	if _, err := m.c.Assign(ctx, "web3", []string{"clash"}); err != nil {
		t.Fatal(err)
	}
	applied := func(what string) {
		t.Helper()
		checkFor(t, settle, func() error {
			for _, n := range nodes {
				if d := m.node(n); d.SerialApplied == 0 || d.SerialApplied < d.SerialDeclared {
					return fmt.Errorf("not %s: %s applied %d of %d%s", what, n, d.SerialApplied, d.SerialDeclared, applyFailure(d))
				}
			}
			return nil
		})
	}
	// push --all: every node its declaration (those given nothing yet too).
	pushed, err := m.c.Push(ctx, app.PushRequest{})
	if err != nil || len(pushed) != 5 {
		t.Fatalf("push --all: %+v %v", pushed, err)
	}
	applied("every node applied its first declaration")
	before := map[string]int64{}
	for _, n := range nodes {
		before[n] = m.node(n).SerialDeclared
	}

	// Refused on web3 (a port clash) and for web9 (not known): nothing on any.
	_, err = m.c.AssignMany(ctx, app.ManyRequest{Nodes: append(nodes, "web9"), Modules: []string{"fan", "other"}})
	var pe *app.ProblemsError
	if !errors.As(err, &pe) || len(pe.Problems) != 2 || !strings.Contains(err.Error(), "to 6 nodes refused") {
		t.Fatalf("refusal: %v", err)
	}
	for _, n := range nodes {
		if got := m.node(n).SerialDeclared; got != before[n] {
			t.Fatalf("%s was declared again (%d, was %d) by a refused act", n, got, before[n])
		}
	}

	var stages []string
	r, err := m.c.AssignMany(ctx, app.ManyRequest{Nodes: nodes, Modules: []string{"fan"}, Progress: func(stage string, done, total int) {
		if len(stages) == 0 || stages[len(stages)-1] != stage {
			stages = append(stages, stage)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Nodes) != 5 || len(r.Pushed) != 5 || strings.Join(stages, ",") != "judged,planned,signed and kept,sent" {
		t.Fatalf("assigned %d, pushed %d, stages %v", len(r.Nodes), len(r.Pushed), stages)
	}
	for _, p := range r.Pushed {
		if !p.Sent || p.Serial != before[p.Node]+1 {
			t.Fatalf("%s: %+v (one declaration each, sent)", p.Node, p)
		}
	}
	applied("every node applied the assign")
	for _, n := range nodes {
		if pl, _ := m.c.PlanShow(ctx, n); !strings.Contains(fmt.Sprintf("%+v", pl), "fan") {
			t.Fatalf("%s's plan has no fan: %+v", n, pl)
		}
	}

	u, err := m.c.UnassignMany(ctx, app.ManyRequest{Nodes: nodes, Modules: []string{"fan"}})
	if err != nil || len(u.Nodes) != 5 || len(u.Nodes[0].Retirements) != 1 || u.Nodes[0].Retirements[0].State != "dropped" {
		t.Fatalf("unassign --nodes: %+v %v", u, err)
	}
	applied("every node applied the unassign")
}

// BenchmarkAssignMany10000 puts one module on every node of a mesh of
// 10,000 in one act (judged, recorded, declared, not sent).
//
//	go test -run '^$' -bench AssignMany10000 -benchtime 1x ./app/
func BenchmarkAssignMany10000(b *testing.B) {
	c := plannedMesh(b, 10000, 1, 40)
	ctx := context.Background()
	st, _ := c.Stores(ctx)
	snap, err := st.Inventory.Snapshot(ctx)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		module := fmt.Sprintf("extra%d", i)
		b.StopTimer()
		if _, err := c.ModuleAdd(ctx, writeManifest(b, `{"module": "`+module+`", "version": "1.0.0"}`), ""); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if _, err := c.AssignMany(ctx, app.ManyRequest{Nodes: snap.NodeNames, Modules: []string{module}}); err != nil {
			b.Fatal(err)
		}
	}
}
