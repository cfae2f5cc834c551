package app

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/klauspost/compress/zstd"

	"mesh-controller/embedded/sqlite"
	"mesh-controller/migrations"
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
		if backupName.MatchString(e.Name()) {
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
	after := "mesh-backup-" + time.Now().UTC().Add(time.Second).Format(backupTimeLayout) + ".age"
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

	c := New(filepath.Join(t.TempDir(), "restored"))
	c.Getenv = func(string) string { return "" }
	r, err := c.Restore(ctx, archive, writeKey(t, m.operator))
	if err != nil {
		t.Fatal(err)
	}
	if r.Fingerprint != original.Fingerprint || r.Hosts != 1 || len(r.Stores) != len(Contexts) || len(r.Missing) != 0 {
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
	c := New(filepath.Join(t.TempDir(), "restored"))
	if _, err := c.Restore(context.Background(), kept[1], writeKey(t, m.operator)); err != nil {
		t.Fatal(err)
	}

	m.start()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	checkFor(t, settle, m.logSays("msg=\"backup failed\" err="))
}

// The archive holds the signing key and the broker seeds, sealed: none of
// their bytes is in it in plain, while the plaintext inside it has them. Its
// plaintext copies are gone once it is written, and when it fails.
func TestBackup_NothingInPlain(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	ctx := context.Background()
	c, st := migrated(t)
	op := withOperator(t, c)
	var keys [][]byte
	for _, q := range []string{`SELECT private_key FROM signing_keys`, `SELECT seed FROM broker_keys`} {
		rows, err := st.DB("identity").Reader.Query(q)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var b []byte
			rows.Scan(&b)
			keys = append(keys, b)
		}
		rows.Close()
	}
	if len(keys) != 4 {
		t.Fatalf("%d keys", len(keys))
	}

	out := filepath.Join(t.TempDir(), "b.age")
	made, err := c.Backup(ctx, out)
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if made.Bytes != int64(len(sealed)) || len(made.Manifest.Stores) != len(Contexts) {
		t.Fatalf("made %+v", made)
	}
	plain := openBackup(t, sealed, op)
	for _, k := range keys {
		if bytes.Contains(sealed, k) || bytes.Contains(sealed, k[:32]) {
			t.Fatal("a private key is in the backup in plain")
		}
		if !bytes.Contains(plain["identity.db"], k) {
			t.Fatal("the backup does not hold a key it must")
		}
	}
	if entries, _ := os.ReadDir(tmp); len(entries) != 0 {
		t.Fatalf("left in the temporary directory: %v", entries)
	}

	// Failing once the copies are made (nowhere to write the archive).
	if _, err := c.Backup(ctx, filepath.Join(t.TempDir(), "gone", "b.age")); err == nil {
		t.Fatal("wrote into a missing directory")
	}
	if entries, _ := os.ReadDir(tmp); len(entries) != 0 {
		t.Fatalf("left in the temporary directory after a failure: %v", entries)
	}
}

// openBackup opens a backup as a person could by hand (age, zstd, tar) and
// returns its entries by name, checking the manifest comes first.
func openBackup(t *testing.T, sealed []byte, op *age.X25519Identity) map[string][]byte {
	t.Helper()
	r, err := age.Decrypt(bytes.NewReader(sealed), op)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := zstd.NewReader(r)
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	out := map[string][]byte{}
	var order []string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		out[h.Name] = b
		order = append(order, h.Name)
	}
	if order[0] != manifestName {
		t.Fatalf("entries %v: the manifest is not first", order)
	}
	return out
}

// craft writes a backup of c's stores whose copies or manifest change has
// altered first (resum makes the manifest agree with altered copies).
func craft(t *testing.T, c *Controller, op *age.X25519Identity, change func(dir string, m *BackupManifest)) string {
	t.Helper()
	ctx := context.Background()
	st, err := c.stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	m := BackupManifest{Kind: backupKind, Format: backupFormat, MadeAt: time.Now().UTC().Truncate(time.Second)}
	for _, n := range Contexts {
		cp, err := st.DB(n).CopyInto(ctx, filepath.Join(dir, n+".db"))
		if err != nil {
			t.Fatal(err)
		}
		m.Stores = append(m.Stores, BackedUpStore{Context: n, File: n + ".db", SchemaVersion: cp.SchemaVersion})
	}
	resum(t, dir, &m)
	change(dir, &m)
	out := filepath.Join(t.TempDir(), "b.age")
	if _, err := writeArchive(out, op.Recipient(), m, dir); err != nil {
		t.Fatal(err)
	}
	return out
}

func resum(t *testing.T, dir string, m *BackupManifest) {
	t.Helper()
	for i, s := range m.Stores {
		sum, err := fileSHA256(filepath.Join(dir, s.File))
		if err != nil {
			t.Fatal(err)
		}
		fi, _ := os.Stat(filepath.Join(dir, s.File))
		m.Stores[i].SHA256, m.Stores[i].Bytes = sum, fi.Size()
	}
}

// exec runs one statement on a copy, as a newer binary or a hand edit would
// have left it.
func execOn(t *testing.T, path, stmt string) {
	t.Helper()
	db, err := sqlite.Open(context.Background(), sqlite.Location{Context: "test", DSN: path}, false)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Writer.Exec(stmt); err != nil {
		t.Fatal(err)
	}
}

// Restore checks every store before any lands in the data dir, and a refusal
// leaves the data dir as it was (here: not there).
func TestRestore_Checks(t *testing.T) {
	ctx := context.Background()
	c, _ := migrated(t)
	op := withOperator(t, c)
	key := writeKey(t, op)
	restore := func(file string) (Restored, string, error) {
		target := New(filepath.Join(t.TempDir(), "restored"))
		target.Getenv = func(string) string { return "" }
		r, err := target.Restore(ctx, file, key)
		return r, target.DataDir, err
	}
	refused := func(t *testing.T, file string, want error) {
		t.Helper()
		_, dir, err := restore(file)
		if !errors.Is(err, want) {
			t.Fatalf("got %v, want %v", err, want)
		}
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a refused restore left %s", dir)
		}
	}

	t.Run("damaged pages, their digest agreeing", func(t *testing.T) {
		refused(t, craft(t, c, op, func(dir string, m *BackupManifest) {
			p := filepath.Join(dir, "inventory.db")
			b, _ := os.ReadFile(p)
			for i := len(b) / 2; i < len(b)/2+8192; i++ {
				b[i] ^= 0x5a
			}
			os.WriteFile(p, b, 0o600)
			resum(t, dir, m)
		}), sqlite.ErrIntegrity)
	})
	t.Run("a store's digest disagreeing", func(t *testing.T) {
		refused(t, craft(t, c, op, func(dir string, m *BackupManifest) { m.Stores[0].SHA256 = strings.Repeat("0", 64) }), ErrBackupDamaged)
	})
	t.Run("a newer schema", func(t *testing.T) {
		refused(t, craft(t, c, op, func(dir string, m *BackupManifest) {
			execOn(t, filepath.Join(dir, "identity.db"), `INSERT INTO schema_migrations (version, name, checksum, applied_at) VALUES (99, '0099_future.sql', 'x', '2030-01-01T00:00:00Z')`)
			resum(t, dir, m)
		}), sqlite.ErrSchemaNewer)
	})
	t.Run("a changed migration", func(t *testing.T) {
		refused(t, craft(t, c, op, func(dir string, m *BackupManifest) {
			execOn(t, filepath.Join(dir, "health.db"), `UPDATE schema_migrations SET checksum = 'edited' WHERE version = 1`)
			resum(t, dir, m)
		}), sqlite.ErrMigrationChanged)
	})
	t.Run("a context this binary does not know", func(t *testing.T) {
		refused(t, craft(t, c, op, func(dir string, m *BackupManifest) {
			os.WriteFile(filepath.Join(dir, "ledger.db"), []byte("x"), 0o600)
			m.Stores = append(m.Stores, BackedUpStore{Context: "ledger", File: "ledger.db", Bytes: 1})
		}), sqlite.ErrSchemaNewer)
	})
	t.Run("cut short", func(t *testing.T) {
		file := craft(t, c, op, func(string, *BackupManifest) {})
		b, _ := os.ReadFile(file)
		for _, n := range []int{len(b) / 2, len(b) - 1} {
			os.WriteFile(file, b[:n], 0o600)
			refused(t, file, ErrBackupDamaged)
		}
	})
	t.Run("sealed to the key, but not a backup", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "x.age")
		var buf bytes.Buffer
		w, _ := age.Encrypt(&buf, op.Recipient())
		w.Write([]byte("a letter to the operator"))
		w.Close()
		os.WriteFile(file, buf.Bytes(), 0o600)
		refused(t, file, ErrNotABackup)
	})
	t.Run("a schema behind is restored, for migrate", func(t *testing.T) {
		r, dir, err := restore(craft(t, c, op, func(dir string, m *BackupManifest) {
			// An inventory store one migration behind, as an older binary left it.
			p := filepath.Join(dir, "inventory.db")
			os.Remove(p)
			db, err := sqlite.Open(ctx, sqlite.Location{Context: "inventory", DSN: p}, true)
			if err != nil {
				t.Fatal(err)
			}
			ms, _ := sqlite.LoadMigrations(migrations.For("inventory"))
			if _, _, err := db.Migrate(ctx, ms[:len(ms)-1], time.Now()); err != nil {
				t.Fatal(err)
			}
			db.Close()
			resum(t, dir, m)
		}))
		if err != nil {
			t.Fatal(err)
		}
		if !r.Stores[0].Behind() || r.Stores[1].Behind() {
			t.Fatalf("restored %+v", r.Stores)
		}
		// What restore left is what migrate takes up.
		target := New(dir)
		target.Getenv = func(string) string { return "" }
		ms, err := target.Migrate(ctx)
		if err != nil || ms[0].From != ms[0].To-1 {
			t.Fatalf("migrated %+v, %v", ms, err)
		}
	})
	t.Run("a backup an older binary made, lacking a store", func(t *testing.T) {
		r, _, err := restore(craft(t, c, op, func(dir string, m *BackupManifest) { m.Stores = m.Stores[:len(m.Stores)-1] }))
		if err != nil || !slices.Equal(r.Missing, []string{"health"}) {
			t.Fatalf("restored %+v, %v", r, err)
		}
	})
	t.Run("a variable moving a store is named", func(t *testing.T) {
		target := New(filepath.Join(t.TempDir(), "restored"))
		target.Getenv = func(k string) string {
			if k == "MESH_STORE_HEALTH" {
				return "/elsewhere/health.db"
			}
			return ""
		}
		r, err := target.Restore(ctx, craft(t, c, op, func(string, *BackupManifest) {}), key)
		if err != nil || !slices.Equal(r.Moved, []string{"MESH_STORE_HEALTH"}) {
			t.Fatalf("restored %+v, %v", r, err)
		}
	})
}

// A host that applied declarations the backup never saw is not stuck after a
// restore: the restored controller numbers its next declaration above the
// serial the host reports, instead of one the host would refuse as old.
func TestBackup_RestoreNumbersAboveWhatHostsApplied(t *testing.T) {
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

	c := New(filepath.Join(t.TempDir(), "restored"))
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
