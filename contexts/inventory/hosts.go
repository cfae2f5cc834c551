package inventory

import (
	"context"
	"database/sql"
	"errors"
	"sort"
	"time"

	"golang.org/x/mod/semver"

	"mesh-controller/embedded/sqlite"
)

// HostRelease is a mesh-host binary the controller keeps, packed as an
// archive in the broker's archive store (its digest), that nodes may be
// declared to run.
type HostRelease struct {
	Version string  `json:"version"`
	Archive Archive `json:"archive"`
	// OS and Arch are what the binary was built for, as it records.
	OS      string    `json:"os,omitempty"`
	Arch    string    `json:"arch,omitempty"`
	AddedAt time.Time `json:"added_at"`
	Who     string    `json:"who,omitempty"`
}

// NodeHostRelease declares a node a host release: Version "" declares
// none (its host is left on what it runs).
type NodeHostRelease struct {
	Node    string
	Version string
}

// ErrHostReleaseExists means a release of that version is kept with
// another binary: a version names one binary.
var ErrHostReleaseExists = sqlite.Refusal("a host release of that version is kept already, of another binary")

// ErrNoHostRelease means no host release of that version is kept.
var ErrNoHostRelease = sqlite.Refusal("no host release of that version is kept")

// AddHostRelease records a host release; the same release again is no
// change (added false), one of its version with another archive is
// refused (ErrHostReleaseExists).
func (s *Store) AddHostRelease(ctx context.Context, r HostRelease, now time.Time) (added bool, err error) {
	defer s.db.Failing(&err, "record the host release %s", r.Version)
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		var digest string
		err := tx.QueryRowContext(ctx, `SELECT digest FROM host_releases WHERE version = ?`, r.Version).Scan(&digest)
		switch {
		case err == nil && digest == r.Archive.Digest:
			return nil
		case err == nil:
			return ErrHostReleaseExists
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		added = true
		_, err = tx.ExecContext(ctx, `INSERT INTO host_releases (version, digest, bytes, unpacked_bytes, os, arch, added_at, who) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
			r.Version, r.Archive.Digest, r.Archive.Bytes, r.Archive.UnpackedBytes, r.OS, r.Arch, sqlite.FormatTime(now), r.Who)
		return err
	})
	return added, err
}

// HostReleases are the host releases kept, newest version first.
func (s *Store) HostReleases(ctx context.Context) (_ []HostRelease, err error) {
	defer s.db.Failing(&err, "read the host releases")
	return hostReleases(ctx, s.db.Reader)
}

func hostReleases(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}) ([]HostRelease, error) {
	rows, err := q.QueryContext(ctx, `SELECT version, digest, bytes, unpacked_bytes, os, arch, added_at, who FROM host_releases`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []HostRelease{}
	for rows.Next() {
		var r HostRelease
		var added string
		if err := rows.Scan(&r.Version, &r.Archive.Digest, &r.Archive.Bytes, &r.Archive.UnpackedBytes, &r.OS, &r.Arch, &added, &r.Who); err != nil {
			return nil, err
		}
		if r.AddedAt, err = sqlite.ParseTime(added); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	sortHostReleases(out)
	return out, nil
}

// sortHostReleases puts the newest first: by version where both are
// semantic versions (v0.3.0), else by when they were added.
func sortHostReleases(rs []HostRelease) {
	sort.SliceStable(rs, func(i, j int) bool {
		a, b := rs[i].Version, rs[j].Version
		if semver.IsValid(a) && semver.IsValid(b) && semver.Compare(a, b) != 0 {
			return semver.Compare(a, b) > 0
		}
		return rs[i].AddedAt.After(rs[j].AddedAt)
	})
}
