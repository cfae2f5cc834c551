package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"mesh-controller/app/apptest"
	"mesh-controller/contexts/inventory"
)

// A node whose host's last beat said it was applying a declaration says
// so: node list beside what is applied, node show which declaration,
// since when and in which phase; once a beat says nothing of it, neither
// does either.
func TestNodeShow_Applying(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("MESH_DATA", filepath.Join(dir, "data"))
	t.Setenv("HOME", filepath.Join(dir, "home"))
	mc(t, "migrate")
	mc(t, "node", "add", "web1")
	since := time.Date(2026, 12, 3, 12, 0, 3, 0, time.UTC)
	beat := func(b inventory.Beat) {
		t.Helper()
		c := apptest.New(os.Getenv("MESH_DATA"))
		defer c.Close()
		st, err := c.Stores(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		b.Node, b.HeardAt, b.IntervalS = "web1", since.Add(time.Minute), 10
		if err := st.Inventory.RecordBeats(context.Background(), []inventory.Beat{b}); err != nil {
			t.Fatal(err)
		}
	}
	beat(inventory.Beat{Applying: &inventory.Applying{Serial: 7, Since: since, Phase: "archives"}})
	if out := mc(t, "node", "show", "web1"); !strings.Contains(out, "applying       7 since 2026-12-03 12:00:03Z (archives)\n") {
		t.Fatalf("node show:\n%s", out)
	}
	if out := mc(t, "node", "list"); !strings.Contains(out, ", applying 7  -\n") {
		t.Fatalf("node list:\n%s", out)
	}
	beat(inventory.Beat{SerialApplied: 7})
	if out := mc(t, "node", "show", "web1") + mc(t, "node", "list"); strings.Contains(out, "applying") {
		t.Fatalf("after the apply:\n%s", out)
	}
}
