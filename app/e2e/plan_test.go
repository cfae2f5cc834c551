package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"mesh-controller/app/apptest"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/inventory"
)

// plannedMesh makes a mesh of nodes with modules assigned in its stores (no
// daemon): nodes x perNode assignments over a pool of modules.
func plannedMesh(t testing.TB, nodes, perNode, modules int) *apptest.Mesh {
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
