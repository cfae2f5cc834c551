package health

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"mesh-controller/embedded/sqlite"
)

// Histogram summarises many durations in constant space: a count, a sum, the
// maximum, and counts per bucket, bucket i holding durations up to 2^(i/4)
// ms (each bound 19 % above the one before), so a quantile read from it is
// within 19 % of the true one.
type Histogram struct {
	Count   int64         `json:"count"`
	SumMS   float64       `json:"sum_ms"`
	MaxMS   float64       `json:"max_ms"`
	Buckets map[int]int64 `json:"buckets"`
}

// bucketOf is the bucket a duration falls in.
func bucketOf(ms float64) int {
	if ms <= 1 {
		return 0
	}
	return int(math.Ceil(4 * math.Log2(ms)))
}

// bucketBound is the upper bound of bucket i, in ms.
func bucketBound(i int) float64 { return math.Pow(2, float64(i)/4) }

// Add counts one duration.
func (h *Histogram) Add(ms float64) {
	if h.Buckets == nil {
		h.Buckets = map[int]int64{}
	}
	h.Count++
	h.SumMS += ms
	h.MaxMS = max(h.MaxMS, ms)
	h.Buckets[bucketOf(ms)]++
}

// Merge adds another histogram's counts to this one.
func (h *Histogram) Merge(o Histogram) {
	if h.Buckets == nil {
		h.Buckets = map[int]int64{}
	}
	h.Count += o.Count
	h.SumMS += o.SumMS
	h.MaxMS = max(h.MaxMS, o.MaxMS)
	for b, n := range o.Buckets {
		h.Buckets[b] += n
	}
}

// Quantile is the q-th quantile (0 < q <= 1), read as the upper bound of the
// bucket holding it, never above the maximum seen.
func (h Histogram) Quantile(q float64) float64 {
	if h.Count == 0 {
		return 0
	}
	keys := make([]int, 0, len(h.Buckets))
	for b := range h.Buckets {
		keys = append(keys, b)
	}
	sort.Ints(keys)
	rank := int64(math.Ceil(q * float64(h.Count)))
	var seen int64
	for _, b := range keys {
		seen += h.Buckets[b]
		if seen >= rank {
			return min(bucketBound(b), h.MaxMS)
		}
	}
	return h.MaxMS
}

// hourOf is the hour a time falls in, as heartbeat_hours keys it.
func hourOf(t time.Time) string { return t.UTC().Format("2006-01-02T15") }

// HourKey names one node's heartbeats in one hour.
type HourKey struct {
	Node string
	Hour time.Time
}

// RecordHeartbeats adds histograms to each node's hourly aggregate, in one
// transaction: a row per node and hour, however often it beats.
func (s *Store) RecordHeartbeats(ctx context.Context, hs map[HourKey]Histogram) (err error) {
	defer s.db.Failing(&err, "record heartbeats")
	if len(hs) == 0 {
		return nil
	}
	return s.db.Write(ctx, func(tx *sql.Tx) error {
		for k, h := range hs {
			hour := hourOf(k.Hour)
			var stored Histogram
			var buckets string
			err := tx.QueryRowContext(ctx, `SELECT count, sum_ms, max_ms, buckets FROM heartbeat_hours WHERE node = ? AND hour = ?`, k.Node, hour).
				Scan(&stored.Count, &stored.SumMS, &stored.MaxMS, &buckets)
			switch {
			case err == nil:
				if err := json.Unmarshal([]byte(buckets), &stored.Buckets); err != nil {
					return fmt.Errorf("heartbeats of %s at %s: %w", k.Node, hour, err)
				}
			case err != sql.ErrNoRows:
				return err
			}
			stored.Merge(h)
			// Merge leaves Buckets a map, never nil: written as {}, never null.
			// encoding/json writes int keys as sorted strings ({"1":5,"10":3,"2":1}).
			b, err := json.Marshal(stored.Buckets)
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO heartbeat_hours (node, hour, count, sum_ms, max_ms, buckets) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (node, hour) DO UPDATE SET count = excluded.count, sum_ms = excluded.sum_ms, max_ms = excluded.max_ms, buckets = excluded.buckets`,
				k.Node, hour, stored.Count, stored.SumMS, stored.MaxMS, string(b)); err != nil {
				return err
			}
		}
		return nil
	})
}

// Heartbeats merges each node's hourly aggregates since a time.
func (s *Store) Heartbeats(ctx context.Context, since time.Time) (_ map[string]Histogram, err error) {
	defer s.db.Failing(&err, "read heartbeat aggregates")
	out := map[string]Histogram{}
	err = s.eachHour(ctx, "", []any{hourOf(since)}, func(h HourHistogram) {
		all := out[h.Node]
		all.Merge(h.Histogram)
		out[h.Node] = all
	})
	return out, err
}

// HourHistogram is one node's heartbeat intervals in one hour.
type HourHistogram struct {
	HourKey
	Histogram
}

// HeartbeatHours returns the hourly aggregates of the nodes named since a
// time, by node then hour: what the board draws a day of intervals from.
func (s *Store) HeartbeatHours(ctx context.Context, since time.Time, nodes []string) (_ []HourHistogram, err error) {
	defer s.db.Failing(&err, "read heartbeat hours")
	out := []HourHistogram{}
	sorted := slices.Sorted(slices.Values(nodes))
	err = sqlite.InChunks(sorted, func(marks string, args []any) error {
		return s.eachHour(ctx, `node IN (`+marks+`) AND `, append(args, hourOf(since)), func(h HourHistogram) { out = append(out, h) })
	})
	return out, err
}

// HeartbeatLongest is each node's longest interval since a time, read in
// the store: a node's every hour is not brought out to find it.
func (s *Store) HeartbeatLongest(ctx context.Context, since time.Time) (_ map[string]float64, err error) {
	defer s.db.Failing(&err, "read the longest heartbeat intervals")
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT node, max(max_ms) FROM heartbeat_hours WHERE hour >= ? GROUP BY node`, hourOf(since))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]float64{}
	for rows.Next() {
		var node string
		var ms float64
		if err := rows.Scan(&node, &ms); err != nil {
			return nil, err
		}
		out[node] = ms
	}
	return out, rows.Err()
}

// eachHour calls f with every hourly aggregate since a time, by node then
// hour; where is ANDed before the hour's bound, with its arguments first.
func (s *Store) eachHour(ctx context.Context, where string, args []any, f func(HourHistogram)) error {
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT node, hour, count, sum_ms, max_ms, buckets FROM heartbeat_hours WHERE `+where+`hour >= ? ORDER BY node, hour`, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var hour, buckets string
		var h HourHistogram
		if err := rows.Scan(&h.Node, &hour, &h.Count, &h.SumMS, &h.MaxMS, &buckets); err != nil {
			return err
		}
		if h.Hour, err = time.Parse("2006-01-02T15", hour); err != nil {
			return fmt.Errorf("heartbeats of %s: hour %q: %w", h.Node, hour, err)
		}
		if err := json.Unmarshal([]byte(buckets), &h.Buckets); err != nil {
			return fmt.Errorf("heartbeats of %s at %s: %w", h.Node, hour, err)
		}
		f(h)
	}
	return rows.Err()
}

// PruneMeasurements deletes every duration and refused join older than
// before and every heartbeat aggregate older than heartbeatsBefore, and
// PruneHistory every condition history entry and healer act older than a
// time; each in batches of batch rows until none is left, returning how
// many went. Small batches keep each write short beside the daemon's.
func (s *Store) PruneMeasurements(ctx context.Context, before, heartbeatsBefore time.Time, batch int) (_ int, err error) {
	defer s.db.Failing(&err, "prune measurements")
	return s.prune(ctx, batch,
		prune{`DELETE FROM durations WHERE id IN (SELECT id FROM durations WHERE at < ? LIMIT ?)`, sqlite.FormatTime(before)},
		prune{`DELETE FROM heartbeat_hours WHERE (node, hour) IN (SELECT node, hour FROM heartbeat_hours WHERE hour < ? LIMIT ?)`, hourOf(heartbeatsBefore)},
		prune{`DELETE FROM join_refusals WHERE (source, reason, minute) IN (SELECT source, reason, minute FROM join_refusals WHERE minute < ? LIMIT ?)`, sqlite.FormatTime(before.UTC().Truncate(time.Minute))})
}

// PruneHistory: see PruneMeasurements.
func (s *Store) PruneHistory(ctx context.Context, before time.Time, batch int) (_ int, err error) {
	defer s.db.Failing(&err, "prune history")
	return s.prune(ctx, batch,
		prune{`DELETE FROM condition_history WHERE id IN (SELECT id FROM condition_history WHERE at < ? LIMIT ?)`, sqlite.FormatTime(before)},
		prune{`DELETE FROM healer_acts WHERE id IN (SELECT id FROM healer_acts WHERE at < ? LIMIT ?)`, sqlite.FormatTime(before)})
}

type prune struct{ query, before string }

func (s *Store) prune(ctx context.Context, batch int, ps ...prune) (int, error) {
	total := 0
	for _, p := range ps {
		for {
			if err := ctx.Err(); err != nil {
				return total, err
			}
			res, err := s.db.Exec(ctx, p.query, p.before, batch)
			if err != nil {
				return total, err
			}
			n, _ := res.RowsAffected()
			total += int(n)
			if int(n) < batch {
				break
			}
		}
	}
	return total, nil
}
