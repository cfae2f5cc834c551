package app

// A backup is one file holding a consistent copy of every context's store.
// Format 1, from the outside in:
//
//	age (binary, X25519) sealed to the operator key set when it was made
//	  zstd
//	    tar (USTAR/PAX), regular files only, in this order:
//	      manifest.json     BackupManifest: kind, format, made_at, and per store
//	                        its context, file, schema_version, bytes, sha256
//	      <context>.db      one per store, as the manifest lists them: a
//	                        standalone SQLite file (rollback mode, no WAL)
//
// Standard layers, so that a person can open one without mesh-controller:
// age -d -i KEYFILE FILE | zstd -d | tar -x. The identity store holds the
// controller's signing key and broker keys, so the archive is never written
// unsealed and its plaintext copies live only in a 0700 temporary directory,
// removed whatever happens. Compression comes before sealing, since sealed
// bytes do not compress; SQLite pages compress several times over, and the
// daemon keeps several backups.

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"filippo.io/age"
	"github.com/klauspost/compress/zstd"

	"mesh-controller/contexts/secrets"
	"mesh-controller/embedded/sqlite"
)

const (
	backupKind   = "mesh-controller backup"
	backupFormat = 1
	manifestName = "manifest.json"
	// partialInfix marks the temporary file a backup is written to, beside
	// where it goes: .<name>.partial-<random>.
	partialInfix = ".partial-"
)

// Why a backup or a restore refuses.
var (
	// ErrNotABackup means the file is not one a backup wrote.
	ErrNotABackup = errors.New("is not a mesh-controller backup")
	// ErrBackupDamaged means the file is a backup, but not all of it reads back as written.
	ErrBackupDamaged = errors.New("is damaged")
	// ErrBackupOtherKey means the key given does not open the backup.
	ErrBackupOtherKey = errors.New("does not open this backup: it is sealed to another operator key")
	// ErrRestoreNotEmpty means the data dir to restore into holds something already.
	ErrRestoreNotEmpty = errors.New("is not empty: a backup is restored only into a new or empty data dir")
)

// BackupManifest is a backup's first entry: what it holds.
type BackupManifest struct {
	Kind   string          `json:"kind"`
	Format int             `json:"format"`
	MadeAt time.Time       `json:"made_at"`
	Stores []BackedUpStore `json:"stores"`
	// Elsewhere are the contexts whose store is on PostgreSQL: a backup
	// holds no copy of them; each is its database's own to back up
	// (pg_dump), beside this file.
	Elsewhere []ElsewhereStore `json:"elsewhere,omitempty"`
}

// ElsewhereStore is a context whose store a backup skips: a database on
// PostgreSQL, backed up by its own tools.
type ElsewhereStore struct {
	Context string `json:"context"`
	// Store is its URL, as output may show it (no password).
	Store string `json:"store"`
	// Var is the variable that names it.
	Var string `json:"variable"`
}

// BackedUpStore is one context's store in a backup.
type BackedUpStore struct {
	Context string `json:"context"`
	// File is the tar entry's name, <context>.db.
	File string `json:"file"`
	// SchemaVersion is the highest migration the copy records.
	SchemaVersion int    `json:"schema_version"`
	Bytes         int64  `json:"bytes"`
	SHA256        string `json:"sha256"`
}

// BackupMade is what a backup wrote.
type BackupMade struct {
	File string
	// Bytes is the archive's size.
	Bytes int64
	// Recipient is the operator key it is sealed to.
	Recipient string
	Manifest  BackupManifest
	// Took is how long it took, copies and sealing together.
	Took time.Duration
}

// Backup writes a consistent copy of every context's store, taken while
// serve may be running, sealed to the operator key, to out (created 0600,
// never overwritten, never left half-written). A store on PostgreSQL is
// skipped and listed as such (Manifest.Elsewhere): its database is backed
// up by PostgreSQL's own tools, which a person runs beside this.
func (c *Copies) Backup(ctx context.Context, out string) (BackupMade, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return BackupMade{}, err
	}
	return backupStores(ctx, st.dbs, out, c.Now())
}

// backupStores is the backup itself. It needs only the open stores, so the
// daemon backs up through its own handles (one handle per store file in a
// process) and a person's command through its own.
func backupStores(ctx context.Context, dbs map[string]*sqlite.DB, out string, now time.Time) (BackupMade, error) {
	start := time.Now()
	if _, err := os.Lstat(out); err == nil {
		return BackupMade{}, fmt.Errorf("%s %w", out, errOutExists)
	}
	names := make([]string, 0, len(dbs))
	for _, n := range Contexts {
		if dbs[n] != nil {
			names = append(names, n)
		}
	}
	if len(names) != len(dbs) || dbs["secrets"] == nil {
		return BackupMade{}, fmt.Errorf("backup: the stores given are not this binary's contexts")
	}
	key, err := secrets.NewStore(dbs["secrets"]).OperatorKey(ctx)
	if err != nil {
		return BackupMade{}, fmt.Errorf("a backup is sealed to the operator key: %w", err)
	}
	recipient, err := age.ParseX25519Recipient(key.Recipient)
	if err != nil {
		return BackupMade{}, fmt.Errorf("the operator key: %w", err)
	}
	// The copies are plaintext (the identity store holds the signing key):
	// a 0700 directory of their own, removed on every path out.
	tmp, err := os.MkdirTemp("", "mesh-backup-*")
	if err != nil {
		return BackupMade{}, err
	}
	defer os.RemoveAll(tmp)
	m := BackupManifest{Kind: backupKind, Format: backupFormat, MadeAt: now.UTC().Truncate(time.Second)}
	for _, n := range names {
		if dbs[n].Postgres {
			m.Elsewhere = append(m.Elsewhere, ElsewhereStore{Context: n, Store: dbs[n].Location.Shown(), Var: sqlite.EnvVar(n)})
			continue
		}
		cp, err := dbs[n].CopyInto(ctx, filepath.Join(tmp, n+".db"))
		if err != nil {
			return BackupMade{}, fmt.Errorf("copy the %s store: %w", n, err)
		}
		sum, err := fileSHA256(cp.Path)
		if err != nil {
			return BackupMade{}, err
		}
		m.Stores = append(m.Stores, BackedUpStore{Context: n, File: n + ".db", SchemaVersion: cp.SchemaVersion, Bytes: cp.Bytes, SHA256: sum})
	}
	size, err := writeArchive(out, recipient, m, tmp)
	if err != nil {
		return BackupMade{}, err
	}
	return BackupMade{File: out, Bytes: size, Recipient: key.Recipient, Manifest: m, Took: time.Since(start)}, nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// writeArchive seals the manifest and the copies in dir into out. It writes
// a hidden temporary file beside out and links it into place only when it is
// whole and synced: out is never overwritten (link refuses an existing
// name) and never seen half-written, even if the process is killed.
func writeArchive(out string, recipient age.Recipient, m BackupManifest, dir string) (int64, error) {
	manifest, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return 0, err
	}
	f, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+partialInfix+"*")
	if err != nil {
		return 0, err
	}
	partial := f.Name()
	defer os.Remove(partial)
	defer f.Close()
	aw, err := age.Encrypt(f, recipient)
	if err != nil {
		return 0, err
	}
	zw, err := zstd.NewWriter(aw, zstd.WithEncoderConcurrency(1))
	if err != nil {
		return 0, err
	}
	tw := tar.NewWriter(zw)
	entry := func(name string, size int64, r io.Reader) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Size: size, Mode: 0o600, ModTime: m.MadeAt}); err != nil {
			return err
		}
		_, err := io.Copy(tw, r)
		return err
	}
	if err := entry(manifestName, int64(len(manifest)), bytes.NewReader(manifest)); err != nil {
		return 0, err
	}
	for _, s := range m.Stores {
		cp, err := os.Open(filepath.Join(dir, s.File))
		if err != nil {
			return 0, err
		}
		err = entry(s.File, s.Bytes, cp)
		cp.Close()
		if err != nil {
			return 0, fmt.Errorf("write %s: %w", out, err)
		}
	}
	for _, close := range []func() error{tw.Close, zw.Close, aw.Close, f.Sync} {
		if err := close(); err != nil {
			return 0, fmt.Errorf("write %s: %w", out, err)
		}
	}
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	if err := f.Close(); err != nil {
		return 0, err
	}
	if err := os.Link(partial, out); errors.Is(err, os.ErrExist) {
		return 0, fmt.Errorf("%s %w", out, errOutExists)
	} else if err != nil {
		return 0, err
	}
	syncDir(filepath.Dir(out))
	return fi.Size(), nil
}

// syncDir makes a new name in dir durable; failing to is not worth failing for.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}
