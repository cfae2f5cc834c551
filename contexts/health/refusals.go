package health

import (
	"context"
	"time"

	"mesh-controller/embedded/sqlite"
)

// JoinRefusals counts the joins refused from one source for one reason
// within a window.
type JoinRefusals struct {
	Source  string    `json:"source"`
	Reason  string    `json:"reason"`
	Count   int64     `json:"count"`
	FirstAt time.Time `json:"first_at"` // the minute of the first
	LastAt  time.Time `json:"last_at"`
}

// CountJoinRefusals adds n joins refused from source for reason, in the
// minute of now.
func (s *Store) CountJoinRefusals(ctx context.Context, source, reason string, n int64, now time.Time) (err error) {
	defer s.db.Failing(&err, "count refused joins")
	_, err = s.db.Exec(ctx, `INSERT INTO join_refusals (source, reason, minute, count, last_at) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (source, reason, minute) DO UPDATE SET count = join_refusals.count + excluded.count, last_at = excluded.last_at`,
		source, reason, sqlite.FormatTime(now.UTC().Truncate(time.Minute)), n, sqlite.FormatTime(now))
	if err != nil {
		return err
	}
	return nil
}

// JoinRefusalsSince returns, per source and reason, the joins refused in
// the minutes from since's on.
func (s *Store) JoinRefusalsSince(ctx context.Context, since time.Time) (_ []JoinRefusals, err error) {
	defer s.db.Failing(&err, "read refused joins")
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT source, reason, sum(count), min(minute), max(last_at) FROM join_refusals
		WHERE minute >= ? GROUP BY source, reason ORDER BY source, reason`, sqlite.FormatTime(since.UTC().Truncate(time.Minute)))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []JoinRefusals
	for rows.Next() {
		var r JoinRefusals
		var first, last string
		if err := rows.Scan(&r.Source, &r.Reason, &r.Count, &first, &last); err != nil {
			return nil, err
		}
		if r.FirstAt, err = sqlite.ParseTime(first); err != nil {
			return nil, err
		}
		if r.LastAt, err = sqlite.ParseTime(last); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}
