package e2e

import (
	"context"
	"errors"
	"fmt"
	"mesh-controller/app"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// Removing a node revokes its broker users on the live broker: its host's
// and its modules' connections are closed and they cannot connect again,
// so its host user can no longer publish. What it kept on disk stays
// listed under the removal, with its size as last reported, and a node
// joining later under the same name is a fresh one the revocation does
// not touch.
func TestNodeRemove_ClosesItsConnections(t *testing.T) {
	t.Parallel()
	m, web1 := paperlessMesh(t)
	ctx := context.Background()
	letter := filepath.Join(web1.root, "var/lib/paperless/media/letter.pdf")
	if err := os.WriteFile(letter, []byte("a scanned letter"), 0o600); err != nil {
		t.Fatal(err)
	}
	m.push(t, "web1")
	checkFor(t, settle, func() error {
		if d := m.dataOf(t, "web1", "paperless", "media"); d.Bytes == nil || *d.Bytes != 16 {
			return fmt.Errorf("media's size is not 16 bytes: %s", jsonText(d))
		}
		return nil
	})

	// web1's host user, and its module's, each on a connection of its own.
	hostOpts, err := web1.state.ConnectOptions()
	if err != nil {
		t.Fatal(err)
	}
	hostOpts = append(hostOpts, nats.NoReconnect())
	hostConn, hostViolations := connectWith(t, m.url, hostOpts...)
	creds, err := m.c.ModuleIssue(ctx, "paperless", "web1")
	if err != nil {
		t.Fatal(err)
	}
	credsFile := filepath.Join(t.TempDir(), "paperless.creds")
	os.WriteFile(credsFile, []byte(creds), 0o600)
	moduleConn, _ := connectWith(t, m.url, nats.UserCredentials(credsFile), nats.NoReconnect())
	if err := hostConn.Publish("mesh.node.web1.x", []byte("{}")); err != nil || hostConn.Flush() != nil {
		t.Fatal("web1's host user cannot publish before its removal")
	}
	select {
	case v := <-hostViolations:
		t.Fatalf("before its removal: %s", v)
	default:
	}

	var pe *app.ProblemsError
	if _, err := m.c.NodeRemove(ctx, app.NodeRemoveRequest{Names: []string{"web1"}}); !errors.As(err, &pe) || !strings.Contains(pe.Problems[0], "web1 runs paperless") {
		t.Fatalf("without --and-unassign: %v", err)
	}
	r, err := m.c.NodeRemove(ctx, app.NodeRemoveRequest{Names: []string{"web1"}, AndUnassign: true, Why: "decommissioned"})
	// The module's user issued by hand ends with the unassign (its module
	// leaves the node), the host's with the node: one left to revoke here.
	if err != nil || r.Revoked != 1 || !r.Disconnected || len(r.Nodes) != 1 || r.Nodes[0].Unassigned == nil {
		t.Fatalf("remove: %+v, %v", r, err)
	}
	checkFor(t, settle, connClosed(hostConn, "the host's connection"))
	checkFor(t, settle, connClosed(moduleConn, "the module's connection"))
	for what, opts := range map[string][]nats.Option{"host": hostOpts, "module": {nats.UserCredentials(credsFile), nats.NoReconnect()}} {
		if nc, err := nats.Connect(m.url, opts...); err == nil {
			nc.Close()
			t.Fatalf("web1's revoked %s user connected again", what)
		} else if !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
			t.Fatalf("web1's %s user: %v", what, err)
		}
	}
	if !strings.Contains(m.logs.String(), "revoked users disconnected") {
		t.Fatalf("the daemon did not disconnect them:\n%s", m.logs.String())
	}

	// What web1 keeps on its disk: still there, and still listed, as last heard.
	if b, err := os.ReadFile(letter); err != nil || string(b) != "a scanned letter" {
		t.Fatalf("removing the node touched its data: %v", err)
	}
	var kept *app.DataView
	ds, _ := m.c.Data(ctx)
	for _, d := range ds {
		if d.Node == "web1" && d.Name == "media" {
			kept = &d
		}
	}
	if kept == nil || kept.State != "retired" || kept.NodeRemovedAt == nil || kept.Bytes == nil || *kept.Bytes != 16 {
		t.Fatalf("data: %+v", kept)
	}
	if _, err := m.c.NodeShow(ctx, "web1"); err == nil {
		t.Fatal("web1 is still a node")
	}

	// A new machine joins as web1: a fresh record, its host heard, the old
	// record still listed under its removal.
	m.join("web1")
	checkFor(t, settle, func() error {
		n, err := m.c.NodeShow(ctx, "web1")
		if err == nil && n.LastHeard == nil {
			err = fmt.Errorf("the new web1 has not been heard from (joined %v)", n.Joined)
		}
		return err
	})
	ds, _ = m.c.Data(ctx)
	if len(ds) != 3 { // db1's cluster, and web1's media and index under the removal
		t.Fatalf("data after web1 joined again: %+v", ds)
	}
	st, _ := m.c.Stores(ctx)
	acts, _ := st.Health.HandActs(ctx, time.Time{})
	if len(acts) != 1 || acts[0].What != "node remove web1 (and unassigned what ran on web1)" || acts[0].Why != "decommissioned" {
		t.Fatalf("hand acts: %+v", acts)
	}
}

// Nodes whose modules provide to each other cannot be unassigned one by
// one: node remove --and-unassign refuses them before changing anything.
func TestNodeRemove_RefusesProvidersOfEachOther(t *testing.T) {
	t.Parallel()
	c := newController(t, t.TempDir())
	c.Getenv = func(string) string { return "" }
	ctx := context.Background()
	if _, err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{
		`{"module": "a", "version": "1.0.0", "provides": [{"provision": "pa", "port": 5001}], "needs": [{"provision": "pb"}]}`,
		`{"module": "b", "version": "1.0.0", "provides": [{"provision": "pb", "port": 5002}], "needs": [{"provision": "pa"}]}`,
	} {
		if _, err := c.ModuleAdd(ctx, writeManifest(t, body), ""); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"n1", "n2"} {
		if _, err := c.NodeAdd(ctx, n, false); err != nil {
			t.Fatal(err)
		}
	}
	// n1/a needs pb from n2/b, which needs pa from n1/a.
	for _, step := range []func() error{
		func() error { _, err := c.Assign(ctx, "n1", []string{"a", "b"}); return err },
		func() error { _, err := c.Assign(ctx, "n2", []string{"b"}); return err },
		func() error { _, err := c.Unassign(ctx, "n1", []string{"b"}); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	_, err := c.NodeRemove(ctx, app.NodeRemoveRequest{Names: []string{"n1", "n2"}, AndUnassign: true})
	var pe *app.ProblemsError
	if !errors.As(err, &pe) || len(pe.Problems) != 1 || pe.Problems[0] != "n1, n2 provide to each other: unassign one side first with 'mesh-controller unassign'" {
		t.Fatalf("got %v", err)
	}
	// and one of them alone may not leave the other's consumer without it
	_, err = c.NodeRemove(ctx, app.NodeRemoveRequest{Names: []string{"n1"}, AndUnassign: true})
	if !errors.As(err, &pe) || !strings.HasPrefix(pe.Problems[0], "n2/b needs pa, which only n1/a provides") {
		t.Fatalf("got %v", err)
	}
	nodes, _ := c.NodeList(ctx)
	st, _ := c.Stores(ctx)
	snap, _ := st.Inventory.Snapshot(ctx)
	if len(nodes) != 2 || len(snap.Assignments) != 2 {
		t.Fatalf("a refused removal changed the mesh: %d nodes, %+v", len(nodes), snap.Assignments)
	}
}
