package builds

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"strings"

	"mesh-controller/embedded/sqlite"
)

// Filter narrows List. Each field that is set adds its condition.
type Filter struct {
	// Module is one module's builds, "" for every module's.
	Module string
	// States are the states wanted, none for every state.
	States []State
	// Limit is how many of the newest are returned; 0 is DefaultListLimit,
	// and a negative limit returns them all.
	Limit int
}

// askColumns are an ask's columns in the order scanAsk reads them.
const askColumns = `id, repository, ref, module, dry_run, plan_id, again_of, allow_older, state, builder, asked_at, taken_at, finished_at,
	tries, last_try_at, late, source_commit, version, digest, bytes, unpacked_bytes, duration_ms, why, registered, commit_at`

// The reads whose speed the benchmark measures and whose query plans the
// tests check use their indexes.
const (
	// queueQuery is every open ask, oldest asked first (index asks_state).
	queueQuery = `SELECT ` + askColumns + ` FROM asks WHERE state IN ('waiting', 'in-flight', 'dead') ORDER BY asked_at, id`
	// waitingQuery is the waiting asks, oldest first (index asks_state).
	waitingQuery = `SELECT ` + askColumns + ` FROM asks WHERE state = 'waiting' ORDER BY asked_at, id LIMIT ?`
	// counted are the states of a build that came to an outcome of its
	// own: the latest of a module is one of these, never a dry run.
	counted = `state IN ('done', 'failed', 'superseded') AND dry_run = 0`
	// latestQuery is the latest counted build of each module: one probe
	// of asks_module, newest first, per module (whose distinct names are
	// read from the same index).
	latestQuery = `SELECT ` + askColumns + ` FROM asks WHERE id IN (
		SELECT (SELECT b.id FROM asks b WHERE b.module = m.module AND ` + counted + ` ORDER BY b.asked_at DESC, b.id DESC LIMIT 1)
		FROM (SELECT DISTINCT module FROM asks WHERE module <> '') m
	) ORDER BY module`
)

// Get returns one ask, or ErrNotFound.
func (s *Store) Get(ctx context.Context, id string) (_ Ask, err error) {
	defer s.db.Failing(&err, "read build %s", id)
	a, err := getAsk(ctx, s.db.Reader, id)
	if err != nil {
		return Ask{}, s.said(err, "read build %s", id)
	}
	return a, nil
}

// List returns the builds the filter asks for, newest asked first.
func (s *Store) List(ctx context.Context, f Filter) (_ []Ask, err error) {
	defer s.db.Failing(&err, "list builds")
	var where []string
	var args []any
	if f.Module != "" {
		where = append(where, "module = ?")
		args = append(args, f.Module)
	}
	if len(f.States) > 0 {
		where = append(where, "state IN ("+strings.TrimSuffix(strings.Repeat("?, ", len(f.States)), ", ")+")")
		for _, st := range f.States {
			args = append(args, string(st))
		}
	}
	query := `SELECT ` + askColumns + ` FROM asks`
	if len(where) > 0 {
		query += ` WHERE ` + strings.Join(where, " AND ")
	}
	limit := f.Limit
	if limit == 0 {
		limit = DefaultListLimit
	}
	query += ` ORDER BY asked_at DESC, id DESC LIMIT ?`
	if limit < 0 {
		limit = math.MaxInt64 // none: a negative limit is SQLite's alone
	}
	args = append(args, limit)
	out, err := queryAsks(ctx, s.db.Reader, query, args...)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Waiting returns up to limit waiting asks (all if limit <= 0), oldest
// asked first: the order they are offered to builders.
func (s *Store) Waiting(ctx context.Context, limit int) (_ []Ask, err error) {
	defer s.db.Failing(&err, "read waiting builds")
	if limit <= 0 {
		limit = math.MaxInt64
	}
	out, err := queryAsks(ctx, s.db.Reader, waitingQuery, limit)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Queue returns every ask in the queue, waiting, in flight or dead, oldest
// asked first.
func (s *Store) Queue(ctx context.Context) (_ []Ask, err error) {
	defer s.db.Failing(&err, "read the build queue")
	out, err := queryAsks(ctx, s.db.Reader, queueQuery)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// LatestByModule returns, for each module, its latest build (the newest
// asked) that came to an outcome of its own, done, failed or superseded,
// by module name. Dry runs, and asks cancelled, killed or dead, do not
// count: they say nothing of whether the module's source builds. The
// build.failed condition reads it.
func (s *Store) LatestByModule(ctx context.Context) (_ []Ask, err error) {
	defer s.db.Failing(&err, "read the latest build of each module")
	out, err := queryAsks(ctx, s.db.Reader, latestQuery)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// getAsk reads one ask with its details, or ErrNotFound.
func getAsk(ctx context.Context, q sqlite.Querier, id string) (Ask, error) {
	as, err := queryAsks(ctx, q, `SELECT `+askColumns+` FROM asks WHERE id = ?`, id)
	if err != nil {
		return Ask{}, err
	}
	if len(as) == 0 {
		return Ask{}, ErrNotFound
	}
	a := as[0]
	rows, err := q.QueryContext(ctx, `SELECT problems, log_tail, manifest FROM outcome_details WHERE id = ?`, id)
	if err != nil {
		return Ask{}, err
	}
	defer rows.Close()
	d := Details{Problems: []string{}, LogTail: []string{}}
	if rows.Next() {
		var problems, tail, manifest string
		if err := rows.Scan(&problems, &tail, &manifest); err != nil {
			return Ask{}, err
		}
		if err := json.Unmarshal([]byte(problems), &d.Problems); err != nil {
			return Ask{}, fmt.Errorf("build %s's problems: %w", id, err)
		}
		if err := json.Unmarshal([]byte(tail), &d.LogTail); err != nil {
			return Ask{}, fmt.Errorf("build %s's log tail: %w", id, err)
		}
		if manifest != "" {
			d.Manifest = json.RawMessage(manifest)
		}
	}
	a.Details = &d
	return a, rows.Err()
}

// queryAsks runs a query of askColumns; the asks have no Details.
func queryAsks(ctx context.Context, q sqlite.Querier, query string, args ...any) ([]Ask, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []Ask{}
	for rows.Next() {
		a, err := scanAsk(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

// scanAsk reads one row of askColumns.
func scanAsk(sc interface{ Scan(...any) error }) (Ask, error) {
	var a Ask
	var state, asked string
	var taken, finished, lastTry sql.NullString
	var commitAt string
	if err := sc.Scan(&a.ID, &a.Repository, &a.Ref, &a.Module, &a.DryRun, &a.Plan, &a.AgainOf, &a.AllowOlder, &state, &a.Builder, &asked, &taken, &finished,
		&a.Tries, &lastTry, &a.Late, &a.Commit, &a.Version, &a.Digest, &a.Bytes, &a.UnpackedBytes, &a.DurationMS, &a.Why, &a.Registered, &commitAt); err != nil {
		return Ask{}, err
	}
	if commitAt != "" {
		t, err := sqlite.ParseTime(commitAt)
		if err != nil {
			return Ask{}, err
		}
		a.CommitAt = &t
	}
	a.State = State(state)
	var err error
	if a.AskedAt, err = sqlite.ParseTime(asked); err != nil {
		return Ask{}, err
	}
	if a.TakenAt, err = sqlite.ParseNullTime(taken); err != nil {
		return Ask{}, err
	}
	if a.FinishedAt, err = sqlite.ParseNullTime(finished); err != nil {
		return Ask{}, err
	}
	if a.LastTryAt, err = sqlite.ParseNullTime(lastTry); err != nil {
		return Ask{}, err
	}
	return a, nil
}

// AskedAgain gives, for each ask asked again (rebuild, replay, the re-ask
// healer), the state of its newest ask again.
func (s *Store) AskedAgain(ctx context.Context) (_ map[string]State, err error) {
	defer s.db.Failing(&err, "read the builds asked again")
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT again_of, state FROM asks WHERE again_of != '' ORDER BY asked_at, id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]State{}
	for rows.Next() {
		var of string
		var st State
		if err := rows.Scan(&of, &st); err != nil {
			return nil, err
		}
		out[of] = st // the newest wins
	}
	return out, rows.Err()
}
