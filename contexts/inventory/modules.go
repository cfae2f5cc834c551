package inventory

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"golang.org/x/mod/semver"

	"mesh-controller/embedded/sqlite"
)

var (
	// ErrModuleNotFound means no module of that name is registered.
	ErrModuleNotFound = sqlite.Refusal("is not registered")
	// ErrVersionConflict means a version is registered with a different manifest.
	ErrVersionConflict = sqlite.Refusal("is registered already with a different manifest")
	// ErrModuleHeld means a module cannot be forgotten: the mesh runs it or holds things for it.
	ErrModuleHeld = sqlite.Refusal("is still held")
)

// Module is a registered module: its current version and where it comes from.
type Module struct {
	Name           string
	CurrentVersion string
	Source         string
	// Commit is the source commit the current version was built from ("" if added by hand).
	Commit string
	// MovedCommit is a newer source commit recorded by module moved.
	MovedCommit string
	Versions    []string
	AddedAt     time.Time
	// Current is the current version's manifest.
	Current Manifest
}

// BehindSource says the source moved past what the mesh built.
func (m Module) BehindSource() bool { return m.MovedCommit != "" && m.MovedCommit != m.Commit }

// CompareVersions orders two semantic versions (-1, 0, 1).
func CompareVersions(a, b string) int { return semver.Compare("v"+a, "v"+b) }

// Added says what module add did.
type Added struct {
	// New is false when this exact version and manifest were registered already.
	New bool
	// Current is true when the added version is (now) the current one.
	Current bool
	// Previous is the current version before, "" for a new module.
	Previous string
	// Rebuilt is true when the version was registered already with the
	// same manifest and now holds another archive.
	Rebuilt bool
}

// AddModule registers a manifest's version, kept as canon: the manifest as
// canonical JSON (keys sorted, no white space), so that equal manifests are
// equal bytes. Every version is kept; a newer one becomes current. The same
// version with another manifest is refused.
func (s *Store) AddModule(ctx context.Context, m Manifest, canon []byte, source string, now time.Time) (_ Added, err error) {
	defer s.db.Failing(&err, "add module %s", m.Module)
	return s.AddBuilt(ctx, m, canon, Origin{Source: source}, now)
}

// Origin is where a registered version came from: its source, and when the
// mesh built it, the commit, the build and the archive it made.
type Origin struct {
	Source, Commit, BuildID string
	Archive                 Archive
}

// Archive is a built version's archive: its sha256 (hex), its size, and
// what it unpacks to (the sum of its regular files' sizes; 0 for one
// built before that was kept).
type Archive struct {
	Digest        string `json:"digest"`
	Bytes         int64  `json:"bytes"`
	UnpackedBytes int64  `json:"unpacked_bytes"`
}

// AddBuilt registers a module version as AddModule does, with where it came
// from. A version registered already with the same manifest, built again
// (another archive or commit), takes the new archive, commit and build
// (Rebuilt when the archive changed); whether that build is newer is the
// caller's to judge. Otherwise such a version is left as it
// was (its archive too): a version's contents never change.
func (s *Store) AddBuilt(ctx context.Context, m Manifest, canon []byte, o Origin, now time.Time) (_ Added, err error) {
	defer s.db.Failing(&err, "add module %s", m.Module)
	source := o.Source
	if source == "" {
		source = m.Source
	}
	if err := CheckRepository(source); err != nil {
		return Added{}, err
	}
	var a Added
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		// An act: judged acts committing after it are judged again.
		if err := moveRevision(ctx, tx, 0); err != nil {
			return err
		}
		var current string
		err := tx.QueryRowContext(ctx, `SELECT current_version FROM modules WHERE name = ?`, m.Module).Scan(&current)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			if _, err := tx.ExecContext(ctx, `INSERT INTO modules (name, current_version, source, added_at) VALUES (?, ?, ?, ?)`,
				m.Module, m.Version, source, sqlite.FormatTime(now)); err != nil {
				return err
			}
		case err != nil:
			return err
		}
		a.Previous = current
		var existing, digest, commit string
		err = tx.QueryRowContext(ctx, `SELECT manifest, archive_digest, commit_id FROM module_versions WHERE module = ? AND version = ?`,
			m.Module, m.Version).Scan(&existing, &digest, &commit)
		switch {
		case err == nil && existing == string(canon):
			a.Current = current == m.Version
			if o.Archive.Digest == "" || o.Archive.Digest == digest && o.Commit == commit {
				return nil
			}
			// Built again (its bases moved, or a newer commit of the same
			// version): the version runs from the new archive, and is
			// known built from that commit (it is no longer behind it).
			a.Rebuilt = o.Archive.Digest != digest
			if _, err := tx.ExecContext(ctx, `UPDATE module_versions SET source = ?, commit_id = ?, build_id = ?, archive_digest = ?, archive_bytes = ?,
				archive_unpacked_bytes = ? WHERE module = ? AND version = ?`, source, o.Commit, o.BuildID, o.Archive.Digest, o.Archive.Bytes,
				o.Archive.UnpackedBytes, m.Module, m.Version); err != nil {
				return err
			}
			if !a.Rebuilt {
				return nil
			}
			// The nodes that run it run the old archive until sent the new:
			// recorded behind, as upgrade record does (push --behind or a
			// roll-out sends it; the catch-up does not, so a rebuild never
			// rolls out by itself).
			_, err := tx.ExecContext(ctx, `UPDATE assignments SET pending_version = version WHERE module = ? AND version = ? AND pending_version IS NULL`,
				m.Module, m.Version)
			return err
		case err == nil:
			return fmt.Errorf("%s %s %w", m.Module, m.Version, ErrVersionConflict)
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		a.New = true
		if _, err := tx.ExecContext(ctx, `INSERT INTO module_versions (module, version, manifest, source, commit_id, build_id, archive_digest, archive_bytes,
			archive_unpacked_bytes, added_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			m.Module, m.Version, string(canon), source, o.Commit, o.BuildID, o.Archive.Digest, o.Archive.Bytes, o.Archive.UnpackedBytes, sqlite.FormatTime(now)); err != nil {
			return err
		}
		if current == "" || CompareVersions(m.Version, current) > 0 {
			a.Current = true
			_, err := tx.ExecContext(ctx, `UPDATE modules SET current_version = ?, source = ? WHERE name = ?`, m.Version, source, m.Module)
			return err
		}
		return nil
	})
	if err != nil {
		return Added{}, err
	}
	return a, nil
}

// Modules returns every registered module, by name, with its current manifest.
func (s *Store) Modules(ctx context.Context) (_ []Module, err error) {
	defer s.db.Failing(&err, "list modules")
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT m.name, m.current_version, m.source, m.moved_commit, m.added_at, v.commit_id, v.manifest,
		(SELECT string_agg(version, ' ') FROM module_versions WHERE module = m.name)
		FROM modules m JOIN module_versions v ON v.module = m.name AND v.version = m.current_version ORDER BY m.name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	mods := []Module{}
	for rows.Next() {
		var m Module
		var added, manifest, versions string
		if err := rows.Scan(&m.Name, &m.CurrentVersion, &m.Source, &m.MovedCommit, &added, &m.Commit, &manifest, &versions); err != nil {
			return nil, err
		}
		if m.AddedAt, err = sqlite.ParseTime(added); err != nil {
			return nil, err
		}
		if err := json.Unmarshal([]byte(manifest), &m.Current); err != nil {
			return nil, fmt.Errorf("module %s: stored manifest: %w", m.Name, err)
		}
		m.Versions = strings.Fields(versions)
		sort.Slice(m.Versions, func(i, j int) bool { return CompareVersions(m.Versions[i], m.Versions[j]) < 0 })
		mods = append(mods, m)
	}
	return mods, rows.Err()
}

// Module returns one module, or ErrModuleNotFound.
func (s *Store) Module(ctx context.Context, name string) (_ Module, err error) {
	defer s.db.Failing(&err, "read module %s", name)
	mods, err := s.Modules(ctx)
	if err != nil {
		return Module{}, err
	}
	for _, m := range mods {
		if m.Name == name {
			return m, nil
		}
	}
	return Module{}, fmt.Errorf("module %s %w", name, ErrModuleNotFound)
}

// MarkMoved records that the module's source has a commit newer than the mesh built.
func (s *Store) MarkMoved(ctx context.Context, name, commit string) (err error) {
	defer s.db.Failing(&err, "record %s moved", name)
	res, err := s.db.Exec(ctx, `UPDATE modules SET moved_commit = ? WHERE name = ?`, commit, name)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("module %s %w", name, ErrModuleNotFound)
	}
	return nil
}

// Holdings are what the mesh holds for a module: where it is assigned and
// which settings layers are kept for it.
type Holdings struct {
	Nodes    []string
	Settings []string // "mesh" or a node name
}

// Empty says nothing is held.
func (h Holdings) Empty() bool { return len(h.Nodes) == 0 && len(h.Settings) == 0 }

func holdings(ctx context.Context, tx *sql.Tx, module string) (Holdings, error) {
	var h Holdings
	var err error
	if h.Nodes, err = sqlite.Strings(ctx, tx, `SELECT node FROM assignments WHERE module = ? ORDER BY node`, module); err != nil {
		return h, err
	}
	h.Settings, err = sqlite.Strings(ctx, tx, `SELECT CASE node WHEN '' THEN 'mesh' ELSE node END FROM settings_layers WHERE module = ? ORDER BY node`, module)
	return h, err
}

// ForgetModule removes a module and every version of it. It is refused
// while the module is assigned; held settings are refused too unless
// andHeld discards them. The holdings are returned either way.
func (s *Store) ForgetModule(ctx context.Context, name string, andHeld bool) (_ Holdings, err error) {
	defer s.db.Failing(&err, "forget module %s", name)
	var h Holdings
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		// An act: judged acts committing after it are judged again.
		if err := moveRevision(ctx, tx, 0); err != nil {
			return err
		}
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM modules WHERE name = ?`, name).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("module %s %w", name, ErrModuleNotFound)
		}
		var err error
		if h, err = holdings(ctx, tx, name); err != nil {
			return err
		}
		if len(h.Nodes) > 0 || (!andHeld && !h.Empty()) {
			return ErrModuleHeld
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM modules WHERE name = ?`, name)
		return err
	})
	return h, err
}

// ModuleHoldings tells what the mesh holds for a module, or ErrModuleNotFound.
func (s *Store) ModuleHoldings(ctx context.Context, name string) (_ Holdings, err error) {
	defer s.db.Failing(&err, "read what the mesh holds for module %s", name)
	tx, err := s.db.Reader.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return Holdings{}, err
	}
	defer tx.Rollback()
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM modules WHERE name = ?`, name).Scan(&n); err != nil {
		return Holdings{}, err
	}
	if n == 0 {
		return Holdings{}, fmt.Errorf("module %s %w", name, ErrModuleNotFound)
	}
	return holdings(ctx, tx, name)
}

// BuiltVersion is a registered module version that holds an archive.
type BuiltVersion struct {
	Module, Version, Commit, BuildID string
	Archive                          Archive
	// Current says it is its module's current version; Previous, the
	// highest version below the current one.
	Current, Previous bool
	AddedAt           time.Time
}

// builtVersionsQuery reads one module's versions, or every module's. The
// WHERE clause is written per case: one statement for both (the module
// compared to the empty string in SQL) has one plan for both, and it scans
// every version even for one module.
func builtVersionsQuery(module string) (string, []any) {
	const columns = `SELECT v.module, v.version, v.commit_id, v.build_id, v.archive_digest, v.archive_bytes, v.archive_unpacked_bytes, v.added_at, m.current_version
		FROM module_versions v JOIN modules m ON m.name = v.module`
	if module == "" {
		return columns + ` ORDER BY v.module`, nil
	}
	return columns + ` WHERE v.module = ? ORDER BY v.module`, []any{module}
}

// BuiltVersions returns the registered versions that hold an archive, of
// one module or (module "") of every module, by module and version.
func (s *Store) BuiltVersions(ctx context.Context, module string) (_ []BuiltVersion, err error) {
	defer s.db.Failing(&err, "read built versions")
	query, args := builtVersionsQuery(module)
	rows, err := s.db.Reader.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var all []BuiltVersion
	for rows.Next() {
		var b BuiltVersion
		var added, current string
		if err := rows.Scan(&b.Module, &b.Version, &b.Commit, &b.BuildID, &b.Archive.Digest, &b.Archive.Bytes, &b.Archive.UnpackedBytes, &added, &current); err != nil {
			return nil, err
		}
		if b.AddedAt, err = sqlite.ParseTime(added); err != nil {
			return nil, err
		}
		b.Current = b.Version == current
		all = append(all, b)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	// Versions compare as versions, not as text; the previous version of
	// a module is the highest below its current one, archive or not.
	sort.SliceStable(all, func(i, j int) bool {
		if all[i].Module != all[j].Module {
			return all[i].Module < all[j].Module
		}
		return CompareVersions(all[i].Version, all[j].Version) < 0
	})
	out := []BuiltVersion{}
	for i, b := range all {
		if i+1 < len(all) && all[i+1].Module == b.Module && all[i+1].Current {
			b.Previous = true
		}
		if b.Archive.Digest != "" {
			out = append(out, b)
		}
	}
	return out, nil
}
