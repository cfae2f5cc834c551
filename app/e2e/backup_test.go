package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"filippo.io/age"

	"mesh-controller/app"
)

// writeKey writes the operator key's private half to a file, as a person
// keeps it off the mesh.
func writeKey(t *testing.T, id *age.X25519Identity) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "op.key")
	if err := os.WriteFile(f, []byte(id.String()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// daemonBackups lists the daemon's backups in dir, oldest first.
func daemonBackups(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if app.BackupName.MatchString(e.Name()) {
			names = append(names, filepath.Join(dir, e.Name()))
		}
	}
	slices.Sort(names)
	return names
}

// The mesh is lost after a backup the daemon took while serving; restored
// into a new data dir and served on the same address, the controller is the
// one its hosts trust: the host reconnects by itself, its heartbeats are
// absorbed, and a new declaration reaches it and is applied. No host joins
// again.
func TestBackup_RestoreServesTheSameHosts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := newTestMesh(t)
	dir := filepath.Join(t.TempDir(), "backups")
	m.stop()
	m.opts.BackupEvery, m.opts.BackupDir = time.Second, dir
	m.start()
	h := m.join("web1")
	m.declare("web1", moduleBody("one", "/srv/one"))
	checkFor(t, settle, m.applied("web1", 1))
	beats := m.count.Beats.Load()
	checkFor(t, settle, m.beatsAbove(beats))
	original, err := m.c.IdentityShow(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// A backup begun after all that, taken through the daemon's own handles
	// while the host beats and its beats are written every 20 ms.
	after := "mesh-backup-" + time.Now().UTC().Add(time.Second).Format(app.BackupTimeLayout) + ".age"
	var archive string
	checkFor(t, settle, func() error {
		names := daemonBackups(t, dir)
		if len(names) > 0 && filepath.Base(names[len(names)-1]) >= after {
			archive = names[len(names)-1]
			return nil
		}
		return fmt.Errorf("no backup from %s on yet; written: %q", after, names)
	})
	m.stop() // the mesh is lost; the host keeps trying to reconnect

	c := newController(t, filepath.Join(t.TempDir(), "restored"))
	c.Getenv = func(string) string { return "" }
	r, err := c.Restore(ctx, archive, writeKey(t, m.operator))
	if err != nil {
		t.Fatal(err)
	}
	if r.Fingerprint != original.Fingerprint || r.Hosts != 1 || len(r.Stores) != len(app.Contexts) || len(r.Missing) != 0 {
		t.Fatalf("restored %+v; the original fingerprint is %s", r, original.Fingerprint)
	}
	if r.Lease == nil {
		t.Fatal("the backup was taken while serving, so it recorded a lease to give back")
	}

	restored := &testMesh{t: t, c: c, listen: m.listen, logs: &syncBuffer{}, operator: m.operator}
	restored.start()
	t.Cleanup(restored.stop)
	checkFor(t, settle, restored.beatsAbove(0))
	// Above the serials the backup holds (the restored controller's catch-up
	// may have declared web1's plan first: its key moved it).
	d := restored.declare("web1", moduleBody("two", "/srv/two"))
	if !d.Sent || d.Serial < 2 {
		t.Fatalf("declared %+v", d)
	}
	checkFor(t, settle, restored.applied("web1", d.Serial))
	if _, err := os.Stat(filepath.Join(h.root, "etc/mesh/modules/two/module.json")); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(restored.logs.String(), "joined") {
		t.Fatalf("a host joined again:\n%s", restored.logs.String())
	}
}

// serve --backup-every keeps exactly the newest N of its own backups, each
// 0600 and sealed; it removes nothing else, and what a killed daemon left
// half-written goes at start. A failed backup is logged, and serving goes on.
func TestServe_BackupEveryKeepsTheNewest(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	dir := filepath.Join(t.TempDir(), "backups")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	others := []string{"notes.txt", "mesh-backup-old.age", "mesh-backup-20200101T000000Z.age.bak"}
	partial := ".mesh-backup-20200101T000000Z.age.partial-123"
	for _, n := range append(others, partial) {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("not the daemon's"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	m.stop()
	m.opts.BackupEvery, m.opts.BackupDir, m.opts.BackupKeep = time.Second, dir, 2
	m.start()
	checkFor(t, settle, func() error {
		if n := strings.Count(m.logs.String(), "msg=\"backup written\""); n < 4 {
			return fmt.Errorf("%d backups written, not 4 yet", n)
		}
		return nil
	})
	m.stop()

	var written []string
	for _, line := range strings.Split(m.logs.String(), "\n") {
		if _, rest, ok := strings.Cut(line, "msg=\"backup written\" file="); ok {
			written = append(written, strings.Fields(rest)[0])
		}
	}
	kept := daemonBackups(t, dir)
	if len(kept) != 2 || !slices.Equal(kept, written[len(written)-2:]) {
		t.Fatalf("kept %v; written %v", kept, written)
	}
	for _, k := range kept {
		if fi, err := os.Stat(k); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v", k, err)
		}
	}
	for _, n := range others {
		if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
			t.Errorf("%s, not of its naming, was removed", n)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, partial)); !errors.Is(err, os.ErrNotExist) {
		t.Error("the partial file a killed daemon left was kept")
	}
	c := newController(t, filepath.Join(t.TempDir(), "restored"))
	if _, err := c.Restore(context.Background(), kept[1], writeKey(t, m.operator)); err != nil {
		t.Fatal(err)
	}

	m.start()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	checkFor(t, settle, m.logSays("msg=\"backup failed\" err="))
}

// A host that applied declarations the backup never saw is not stuck after a
// restore: the restored controller numbers its next declaration above the
// serial the host reports, instead of one the host would refuse as old.
func TestBackup_RestoreNumbersAboveWhatHostsApplied(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := newTestMesh(t)
	m.join("web1")
	m.declare("web1", moduleBody("one", "/srv/one"))
	checkFor(t, settle, m.applied("web1", 1))
	archive := filepath.Join(t.TempDir(), "b.age")
	if _, err := m.c.Backup(ctx, archive); err != nil {
		t.Fatal(err)
	}
	m.declare("web1", moduleBody("two", "/srv/two")) // after the backup
	checkFor(t, settle, m.applied("web1", 2))
	m.stop()

	c := newController(t, filepath.Join(t.TempDir(), "restored"))
	c.Getenv = func(string) string { return "" }
	if _, err := c.Restore(ctx, archive, writeKey(t, m.operator)); err != nil {
		t.Fatal(err)
	}
	restored := &testMesh{t: t, c: c, listen: m.listen, logs: &syncBuffer{}, operator: m.operator}
	restored.start()
	t.Cleanup(restored.stop)
	checkFor(t, settle, restored.applied("web1", 2))
	d := restored.declare("web1", moduleBody("three", "/srv/three"))
	if d.Serial != 3 {
		t.Fatalf("the restored controller numbered %d; web1 applied 2 and refuses anything not above it", d.Serial)
	}
	checkFor(t, settle, restored.applied("web1", 3))
}
