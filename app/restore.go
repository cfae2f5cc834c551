package app

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"filippo.io/age"
	"github.com/klauspost/compress/zstd"

	"mesh-controller/contexts/identity"
	"mesh-controller/embedded/sqlite"
	"mesh-controller/migrations"
)

// ErrBackupNewer means a backup was made by a newer mesh-controller: a
// format or a context this binary does not know. It is, and reads as,
// sqlite.ErrSchemaNewer, as a newer store is; only what to do differs.
var ErrBackupNewer error = backupNewer{}

type backupNewer struct{}

func (backupNewer) Error() string { return sqlite.ErrSchemaNewer.Error() }
func (backupNewer) Unwrap() error { return sqlite.ErrSchemaNewer }

// Restored is what a restore put where.
type Restored struct {
	// Dir is the data dir restored into.
	Dir string
	// MadeAt is when the backup was made.
	MadeAt time.Time
	Stores []RestoredStore
	// Fingerprint is the signing key's: the one joined hosts trust.
	Fingerprint string
	// Hosts counts the joined hosts, which need not join again.
	Hosts int
	// Lease is the lease the backup recorded, given back: the process that
	// held it served the lost stores, not these.
	Lease *identity.Lease
	// Missing names the contexts this binary knows that the backup does not
	// hold (made by an older binary): migrate makes them, empty.
	Missing []string
	// Moved names the variables set now that move a context's store away
	// from Dir: serve would read that store, not the restored one.
	Moved []string
	// Elsewhere are the contexts the backup skipped, as on PostgreSQL when
	// it was made: their databases are restored by PostgreSQL's own tools.
	Elsewhere []ElsewhereStore
	// OnPostgres are the contexts whose variable names a PostgreSQL
	// database now: nothing is restored into it here.
	OnPostgres []ElsewhereStore
}

// RestoredStore is one context's store restored.
type RestoredStore struct {
	Context string
	File    string
	Bytes   int64
	// SchemaVersion is the store's; Known is this binary's. A store behind
	// is restored as it is, for migrate to bring up to date.
	SchemaVersion int
	Known         int
}

// Behind says the store needs 'migrate' before serve.
func (s RestoredStore) Behind() bool { return s.SchemaVersion < s.Known }

// Restore opens a backup with the operator key and writes its stores into
// the controller's data dir, which must be new or empty. Every store is
// checked (its bytes against the manifest, SQLite's integrity, its schema
// against this binary's) before any lands in the data dir; on any failure
// the data dir is left as it was. It reads no existing store: the mesh that
// made the backup may be gone.
func (c *Controller) Restore(ctx context.Context, file, keyFile string) (Restored, error) {
	dir := c.DataDir
	exists, err := emptyOrMissing(dir)
	if err != nil {
		return Restored{}, err
	}
	ids, err := readOperatorKey(keyFile)
	if err != nil {
		return Restored{}, err
	}
	f, err := os.Open(file)
	if err != nil {
		return Restored{}, err
	}
	defer f.Close()
	if !exists {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return Restored{}, err
		}
	}
	done := false
	defer func() {
		if !done && !exists {
			os.Remove(dir)
		}
	}()
	// Everything lands in a staging directory inside dir first, and moves in
	// only once all of it is checked.
	stage, err := os.MkdirTemp(dir, ".restore-*")
	if err != nil {
		return Restored{}, err
	}
	defer os.RemoveAll(stage)

	m, err := readArchive(f, file, keyFile, ids, stage)
	if err != nil {
		return Restored{}, err
	}
	r := Restored{Dir: dir, MadeAt: m.MadeAt, Elsewhere: m.Elsewhere}
	for _, s := range m.Stores {
		rs, err := checkRestored(ctx, &r, s, filepath.Join(stage, s.File))
		if err != nil {
			return Restored{}, fmt.Errorf("%s in %s: %w", s.File, file, err)
		}
		r.Stores = append(r.Stores, rs)
	}
	if err := moveIn(stage, dir); err != nil {
		return Restored{}, err
	}
	done = true
	for _, n := range Contexts {
		if !slices.ContainsFunc(r.Stores, func(s RestoredStore) bool { return s.Context == n }) &&
			!slices.ContainsFunc(r.Elsewhere, func(s ElsewhereStore) bool { return s.Context == n }) {
			r.Missing = append(r.Missing, n)
		}
		loc, err := sqlite.Locate(n, dir, c.Getenv)
		switch {
		case err == nil && loc.Postgres():
			r.OnPostgres = append(r.OnPostgres, ElsewhereStore{Context: n, Store: loc.Shown(), Var: loc.Var})
		case err != nil || loc.From != "data dir":
			r.Moved = append(r.Moved, sqlite.EnvVar(n))
		}
	}
	return r, nil
}

// emptyOrMissing refuses a data dir that holds anything; it says whether
// the directory exists.
func emptyOrMissing(dir string) (bool, error) {
	d, err := os.Open(dir)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer d.Close()
	names, err := d.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("restore into %s: %w", dir, err)
	}
	return true, fmt.Errorf("%s %w (it holds %s)", dir, ErrRestoreNotEmpty, names[0])
}

const ageMagic = "age-encryption.org/v1\n"

// failedReader remembers the error its reader gave, so that a failure
// further up (zstd, tar) can be told from the sealed bytes not authenticating.
type failedReader struct {
	r   io.Reader
	err error
}

func (f *failedReader) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if err != nil && err != io.EOF {
		f.err = err
	}
	return n, err
}

// readArchive opens a backup and writes its stores into stage (0600 each),
// checking each against the manifest. A file that is not age, or whose
// plaintext is not a backup, is ErrNotABackup; sealed bytes that do not
// authenticate (flipped, cut short) or stores that differ from the manifest
// are ErrBackupDamaged.
func readArchive(r io.Reader, file, keyFile string, ids []age.Identity, stage string) (BackupManifest, error) {
	br := bufio.NewReader(r)
	if head, _ := br.Peek(len(ageMagic)); string(head) != ageMagic {
		return BackupManifest{}, fmt.Errorf("%s %w: it is not sealed with age", file, ErrNotABackup)
	}
	plain, err := age.Decrypt(br, ids...)
	var noMatch *age.NoIdentityMatchError
	if errors.As(err, &noMatch) {
		return BackupManifest{}, fmt.Errorf("%s %w", filepath.Base(keyFile), ErrBackupOtherKey)
	}
	if err != nil {
		return BackupManifest{}, fmt.Errorf("%s %w: %v", file, ErrBackupDamaged, err)
	}
	sealed := &failedReader{r: plain}
	fail := func(what string, args ...any) error {
		if sealed.err != nil {
			return fmt.Errorf("%s %w: %v", file, ErrBackupDamaged, sealed.err)
		}
		return fmt.Errorf("%s %w: %s", file, ErrNotABackup, fmt.Sprintf(what, args...))
	}
	zr, err := zstd.NewReader(sealed, zstd.WithDecoderConcurrency(1))
	if err != nil {
		return BackupManifest{}, err
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	hdr, err := tr.Next()
	if err != nil || hdr.Name != manifestName || hdr.Size > 1<<20 {
		return BackupManifest{}, fail("no manifest first (%v)", err)
	}
	var m BackupManifest
	if err := json.NewDecoder(tr).Decode(&m); err != nil || m.Kind != backupKind {
		return BackupManifest{}, fail("its manifest is not one (%v)", err)
	}
	if m.Format != backupFormat {
		return BackupManifest{}, fmt.Errorf("%s is a backup of format %d; this binary reads format %d: %w", file, m.Format, backupFormat, ErrBackupNewer)
	}
	want := map[string]BackedUpStore{}
	for _, s := range m.Stores {
		if !slices.Contains(Contexts, s.Context) {
			return BackupManifest{}, fmt.Errorf("%s holds the %s store, which this binary does not know: %w", file, s.Context, ErrBackupNewer)
		}
		if _, twice := want[s.File]; twice || s.File != s.Context+".db" {
			return BackupManifest{}, fail("its manifest lists %s as %q", s.Context, s.File)
		}
		want[s.File] = s
	}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return BackupManifest{}, fail("%v", err)
		}
		s, ok := want[hdr.Name]
		if !ok || hdr.Typeflag != tar.TypeReg {
			return BackupManifest{}, fail("it holds %q, which its manifest does not list", hdr.Name)
		}
		delete(want, hdr.Name)
		if err := extract(tr, filepath.Join(stage, s.File), s); err != nil {
			if sealed.err != nil {
				return BackupManifest{}, fail("")
			}
			return BackupManifest{}, fmt.Errorf("%s %w: %v", file, ErrBackupDamaged, err)
		}
	}
	for name := range want {
		return BackupManifest{}, fmt.Errorf("%s %w: its manifest lists %s, which it does not hold", file, ErrBackupDamaged, name)
	}
	// Read the sealed stream to its end: age authenticates the last chunk,
	// so a backup cut short after the tar's end is caught too.
	if _, err := io.Copy(io.Discard, zr); err != nil {
		return BackupManifest{}, fail("%v", err)
	}
	return m, nil
}

// extract writes one store (0600, a new file) and checks its size and digest.
func extract(r io.Reader, path string, s BackedUpStore) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(r, s.Bytes+1))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if sum := hex.EncodeToString(h.Sum(nil)); n != s.Bytes || sum != s.SHA256 {
		return fmt.Errorf("%s is %d bytes with sha256 %s; its manifest says %d bytes, %s", s.File, n, sum, s.Bytes, s.SHA256)
	}
	return nil
}

// checkRestored opens one restored store as serve would, checks its
// integrity and its schema against this binary's, and, for the identity
// store, reads what the hosts trust and gives back the recorded lease.
func checkRestored(ctx context.Context, r *Restored, s BackedUpStore, path string) (RestoredStore, error) {
	ms, err := sqlite.LoadMigrations(migrations.For(s.Context))
	if err != nil {
		return RestoredStore{}, err
	}
	db, err := sqlite.Open(ctx, sqlite.Location{Context: s.Context, DSN: path}, false)
	if err != nil {
		return RestoredStore{}, err
	}
	defer db.Close()
	if err := db.Check(ctx); err != nil {
		return RestoredStore{}, err
	}
	v, err := db.Version(ctx, ms)
	if err != nil && !errors.Is(err, sqlite.ErrBehind) {
		return RestoredStore{}, err
	}
	// A store behind this binary is read once migrate has brought it up to
	// date; its recorded lease expires by itself meanwhile.
	if s.Context == "identity" && v == len(ms) {
		ids := identity.NewStore(db)
		key, err := ids.SigningKey(ctx)
		if err != nil {
			return RestoredStore{}, err
		}
		r.Fingerprint = key.Fingerprint()
		hosts, err := ids.Hosts(ctx)
		if err != nil {
			return RestoredStore{}, err
		}
		r.Hosts = len(hosts)
		if r.Lease, err = ids.Lease(ctx); err != nil {
			return RestoredStore{}, err
		}
		if r.Lease != nil {
			if err := ids.ReleaseLease(ctx, r.Lease.Holder); err != nil {
				return RestoredStore{}, err
			}
		}
	}
	return RestoredStore{Context: s.Context, File: s.File, Bytes: s.Bytes, SchemaVersion: v, Known: len(ms)}, nil
}

// moveIn moves everything staged into dir, linking so that nothing there
// is ever replaced; on failure what was moved is taken back out.
func moveIn(stage, dir string) error {
	entries, err := os.ReadDir(stage)
	if err != nil {
		return err
	}
	var moved []string
	for _, e := range entries {
		to := filepath.Join(dir, e.Name())
		if err := os.Link(filepath.Join(stage, e.Name()), to); err != nil {
			for _, m := range moved {
				os.Remove(m)
			}
			return fmt.Errorf("restore into %s: %w", dir, err)
		}
		moved = append(moved, to)
	}
	syncDir(dir)
	return nil
}
