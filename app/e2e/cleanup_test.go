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
)

// dataOf is one data set as data lists it now, nil if it is not listed.
func (m *testMesh) dataOf(t *testing.T, node, module, name string) *app.DataView {
	t.Helper()
	ds, err := m.c.Data(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		if d.Node == node && d.Module == module && d.Name == name && d.NodeRemovedAt == nil {
			return &d
		}
	}
	return nil
}

func (m *testMesh) cleanable(t *testing.T, node, module, target string) *app.Cleanable {
	t.Helper()
	cls, err := m.c.Cleanup(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range cls {
		if cl.Node == node && cl.Module == module && cl.Target == target && !cl.OnRemovedNode() {
			return &cl
		}
	}
	return nil
}

// push sends a node its declaration again and waits until its host applied
// it: a host reports its data after each apply.
func (m *testMesh) push(t *testing.T, node string) {
	t.Helper()
	ps, err := m.c.Push(context.Background(), app.PushRequest{Node: node})
	if err != nil || len(ps) != 1 || !ps[0].Sent {
		t.Fatalf("push %s: %+v, %v", node, ps, err)
	}
	checkFor(t, settle, m.appliedFrom(node, ps[0].Serial))
}

// Irreplaceable data never backed up is deleted by its real host only
// after a person gives the digest of its preview as it is now: without it,
// or with the digest of a preview its host's report has since changed,
// nothing is asked and the files stay.
func TestCleanup_HostDeletesOnlyWithTheDigest(t *testing.T) {
	t.Parallel()
	m, web1 := paperlessMesh(t)
	media := filepath.Join(web1.root, "var/lib/paperless/media")
	letter := filepath.Join(media, "letter.pdf")
	if err := os.WriteFile(letter, []byte("a scanned letter"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := m.c.Unassign(ctx, "web1", []string{"paperless"}); err != nil {
		t.Fatal(err)
	}
	m.settled(t, "web1")
	checkFor(t, settle, func() error {
		if d := m.dataOf(t, "web1", "paperless", "media"); d == nil || d.State != "retired" || d.Bytes == nil || *d.Bytes != 16 {
			return fmt.Errorf("media is not retired with 16 bytes: %s", jsonText(d))
		}
		return nil
	})

	asked := app.CleanupRequest{Node: "web1", Module: "paperless", Target: "media", Why: "scanned elsewhere"}
	r, err := m.c.CleanupDelete(ctx, asked)
	if !errors.Is(err, app.ErrNeedsDigest) || len(r.Preview) != 1 || r.Deleted != nil {
		t.Fatalf("without a digest: %+v, %v", r, err)
	}
	first := r.Preview[0]
	if first.LastBackup != nil || first.Cadence != "daily" || *first.Bytes != 16 || len(first.Digest) != 12 {
		t.Fatalf("preview: %+v", first)
	}

	// More is written; its host reports the new size after its next apply.
	if err := os.WriteFile(filepath.Join(media, "invoice.pdf"), []byte("an invoice"), 0o600); err != nil {
		t.Fatal(err)
	}
	m.push(t, "web1")
	checkFor(t, settle, func() error {
		if d := m.dataOf(t, "web1", "paperless", "media"); *d.Bytes != 26 {
			return fmt.Errorf("media's size is %d, not 26 yet", *d.Bytes)
		}
		return nil
	})
	asked.Yes = first.Digest
	r, err = m.c.CleanupDelete(ctx, asked)
	if !errors.Is(err, app.ErrDigestChanged) || len(r.Preview) != 1 || r.Preview[0].Digest == first.Digest || *r.Preview[0].Bytes != 26 {
		t.Fatalf("with the old digest: %+v, %v", r, err)
	}
	plan, _ := m.c.PlanShow(ctx, "web1")
	if len(plan.Plan.Body.Delete) != 0 {
		t.Fatalf("a deletion was asked: %+v", plan.Plan.Body.Delete)
	}
	m.push(t, "web1")
	if _, err := os.Stat(letter); err != nil {
		t.Fatalf("refused, yet the host deleted: %v", err)
	}

	asked.Yes = r.Preview[0].Digest
	if r, err = m.c.CleanupDelete(ctx, asked); err != nil || len(r.Deleted) != 1 {
		t.Fatalf("with the digest: %+v, %v", r, err)
	}
	checkFor(t, settle, func() error {
		if _, err := os.Stat(media); !os.IsNotExist(err) {
			return fmt.Errorf("the host has not deleted media: %v", err)
		}
		if cl := m.cleanable(t, "web1", "paperless", "media"); cl != nil {
			return fmt.Errorf("media is still cleanable: %s", jsonText(cl))
		}
		return nil
	})
	if m.dataOf(t, "web1", "paperless", "media") != nil {
		t.Fatal("deleted data still listed")
	}
	st, _ := m.c.Stores(ctx)
	acts, _ := st.Health.HandActs(ctx, time.Time{})
	if len(acts) != 1 || acts[0].What != "cleanup delete web1/paperless media (data, irreplaceable, 26 bytes): without backup, confirmed by digest "+asked.Yes {
		t.Fatalf("hand acts: %+v", acts)
	}
}

// A rebuildable set dropped on unassign stays on the host's disk and in
// its reports, so data and cleanup list it until cleanup delete has the
// host remove it, with no digest; assigning its module back makes it its
// own again.
func TestCleanup_DroppedDataStaysUntilCleaned(t *testing.T) {
	t.Parallel()
	m, web1 := paperlessMesh(t)
	index := filepath.Join(web1.root, "var/lib/paperless/index")
	if err := os.WriteFile(filepath.Join(index, "terms"), []byte("words"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	u, err := m.c.Unassign(ctx, "web1", []string{"paperless"})
	if err != nil {
		t.Fatal(err)
	}
	dropped := false
	for _, r := range u.Retirements {
		dropped = dropped || (r.DataSet == "index" && r.State == "dropped")
	}
	if !dropped {
		t.Fatalf("unassign: %+v", u.Retirements)
	}
	m.settled(t, "web1")
	m.push(t, "web1") // a later apply: the host still reports what it no longer declares
	checkFor(t, settle, func() error {
		if d := m.dataOf(t, "web1", "paperless", "index"); d == nil || d.State != "dropped" || d.Bytes == nil || *d.Bytes != 5 || d.Since == nil {
			return fmt.Errorf("data does not list the index dropped since a time, with 5 bytes: %s", jsonText(d))
		}
		return nil
	})
	cl := m.cleanable(t, "web1", "paperless", "index")
	if cl == nil || cl.Kind != "data" || cl.Precious != "rebuildable" || cl.State != "dropped" || cl.NeedsDigest || *cl.Bytes != 5 {
		t.Fatalf("cleanup: %+v", cl)
	}

	// Assigned back, it is the module's own again.
	m.assign(t, "web1", "paperless")
	m.settled(t, "web1")
	if d := m.dataOf(t, "web1", "paperless", "index"); d == nil || d.State != "active" {
		t.Fatalf("assigned back: %+v", d)
	}
	if m.cleanable(t, "web1", "paperless", "index") != nil {
		t.Fatal("an active data set is listed by cleanup")
	}
	if b, err := os.ReadFile(filepath.Join(index, "terms")); err != nil || string(b) != "words" {
		t.Fatalf("the index was not kept: %v", err)
	}

	if _, err := m.c.Unassign(ctx, "web1", []string{"paperless"}); err != nil {
		t.Fatal(err)
	}
	r, err := m.c.CleanupDelete(ctx, app.CleanupRequest{Node: "web1", Module: "paperless", Target: "index", Why: "rebuilt elsewhere"})
	if err != nil || len(r.Deleted) != 1 {
		t.Fatalf("cleanup delete: %+v, %v", r, err)
	}
	checkFor(t, settle, func() error {
		if _, err := os.Stat(index); !os.IsNotExist(err) {
			return fmt.Errorf("the host has not deleted the index: %v", err)
		}
		if cl := m.cleanable(t, "web1", "paperless", "index"); cl != nil {
			return fmt.Errorf("the index is still cleanable: %s", jsonText(cl))
		}
		if d := m.dataOf(t, "web1", "paperless", "index"); d != nil {
			return fmt.Errorf("data still lists the index: %s", jsonText(d))
		}
		return nil
	})
	if _, err := os.Stat(filepath.Join(web1.root, "var/lib/paperless/media")); err != nil {
		t.Fatal("cleanup deleted what it was not asked to")
	}
	st, _ := m.c.Stores(ctx)
	acts, _ := st.Health.HandActs(ctx, time.Time{})
	if len(acts) != 1 || !strings.HasSuffix(acts[0].What, "(data, rebuildable, 5 bytes): needs no backup") {
		t.Fatalf("hand acts: %+v", acts)
	}
}
