package inventory

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"mesh-controller/embedded/sqlite"
)

// TakePreview is a take preview as it was shown: its digest, its node and
// module, and the preview itself (the application's JSON).
type TakePreview struct {
	Digest  string
	Node    string
	Module  string
	Preview string
	ShownAt time.Time
}

// TakePreviewsKept is how long a take preview is remembered: a digest
// older than this is refused as unknown, and the person previews again.
const TakePreviewsKept = 7 * 24 * time.Hour

// ShowTakePreview remembers a preview shown, and forgets those shown more
// than TakePreviewsKept ago.
func (s *Store) ShowTakePreview(ctx context.Context, p TakePreview) (err error) {
	defer s.db.Failing(&err, "record a shown take preview")
	return s.db.Write(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM take_previews WHERE shown_at < ?`, sqlite.FormatTime(p.ShownAt.Add(-TakePreviewsKept))); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO take_previews (digest, node, module, preview, shown_at) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (digest) DO UPDATE SET shown_at = excluded.shown_at`, p.Digest, p.Node, p.Module, p.Preview, sqlite.FormatTime(p.ShownAt))
		return err
	})
}

// ShownTakePreview is the preview shown with this digest, if it is
// remembered.
func (s *Store) ShownTakePreview(ctx context.Context, digest string) (_ TakePreview, _ bool, err error) {
	defer s.db.Failing(&err, "read a shown take preview")
	p := TakePreview{Digest: digest}
	var at string
	err = s.db.Reader.QueryRowContext(ctx, `SELECT node, module, preview, shown_at FROM take_previews WHERE digest = ?`, digest).
		Scan(&p.Node, &p.Module, &p.Preview, &at)
	if errors.Is(err, sql.ErrNoRows) {
		return p, false, nil
	}
	if err != nil {
		return p, false, err
	}
	p.ShownAt, err = sqlite.ParseTime(at)
	return p, err == nil, err
}
