package app

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
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
func craft(t *testing.T, c *testApp, op *age.X25519Identity, change func(dir string, m *BackupManifest)) string {
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
		target := newTestApp(t, filepath.Join(t.TempDir(), "restored"), func(string) string { return "" })
		r, err := target.Restore(ctx, file, key)
		target.Close() // as the process that restored ends: what it left is opened again
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
		target := newTestApp(t, dir, func(string) string { return "" })
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
		target := newTestApp(t, filepath.Join(t.TempDir(), "restored"), func(k string) string {
			if k == "MESH_STORE_HEALTH" {
				return "/elsewhere/health.db"
			}
			return ""
		})
		r, err := target.Restore(ctx, craft(t, c, op, func(string, *BackupManifest) {}), key)
		if err != nil || !slices.Equal(r.Moved, []string{"MESH_STORE_HEALTH"}) {
			t.Fatalf("restored %+v, %v", r, err)
		}
	})
}
