package builds

import (
	"context"
	"time"

	"mesh-controller/embedded/sqlite"
)

// pruneBatch is how many asks one prune transaction deletes: small, so
// each write is short beside the daemon's (lessons.md: reports kept for a
// window are deleted in small batches).
const pruneBatch = 500

// pruneQuery deletes up to a batch of ended asks that are beyond the
// newest keep of their module (asks that never learned their module are
// grouped by repository), ended before a time, and neither their module's
// latest counted build (LatestByModule, which build.failed reads) nor its
// latest registered one. Dead asks are not ended: they wait in the queue
// for a person or the healer.
const pruneQuery = `WITH ranked AS (
	SELECT id, finished_at, row_number() OVER (
		PARTITION BY CASE module WHEN '' THEN 'repository ' || repository ELSE module END
		ORDER BY asked_at DESC, id DESC) AS n
	FROM asks WHERE state IN ('done', 'failed', 'superseded', 'cancelled', 'killed')
), modules AS (
	SELECT DISTINCT module FROM asks WHERE module <> ''
), kept AS (
	SELECT (SELECT b.id FROM asks b WHERE b.module = m.module AND ` + counted + ` ORDER BY b.asked_at DESC, b.id DESC LIMIT 1) AS id FROM modules m
	UNION
	SELECT (SELECT b.id FROM asks b WHERE b.module = m.module AND b.registered = 1 ORDER BY b.asked_at DESC, b.id DESC LIMIT 1) FROM modules m
)
DELETE FROM asks WHERE id IN (
	SELECT id FROM ranked WHERE n > ? AND finished_at < ? AND id NOT IN (SELECT id FROM kept WHERE id IS NOT NULL) LIMIT ?
)`

// Prune deletes ended builds (done, failed, superseded, cancelled, killed)
// beyond the newest keep of each module that ended before olderThan, and
// returns how many went. It never deletes an ask waiting, in flight or
// dead, the newest ended ask of a module (keep is at least 1), the latest
// build LatestByModule reports, or a module's latest registered build.
// It deletes in batches, each its own transaction.
func (s *Store) Prune(ctx context.Context, keep int, olderThan time.Time) (_ int, err error) {
	defer s.db.Failing(&err, "prune builds")
	keep = max(keep, 1)
	before := sqlite.FormatTime(olderThan)
	total := 0
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, err := s.execCount(ctx, pruneQuery, keep, before, pruneBatch)
		if err != nil {
			return total, err
		}
		total += n
		if n < pruneBatch {
			return total, nil
		}
	}
}
