package builds

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"mesh-controller/embedded/sqlite"
)

// Enqueue asks for a build: the ask is kept waiting, asked now. Its id is
// made by NewID unless the ask carries one (which must be a build id no
// other ask has); its repository, ref, module, dry run, plan and again-of
// are kept, anything else it carries is not. It returns the ask as kept.
func (s *Store) Enqueue(ctx context.Context, a Ask, now time.Time) (_ Ask, err error) {
	defer s.db.Failing(&err, "enqueue build")
	if a.Repository == "" {
		return Ask{}, ErrNoRepository
	}
	if a.ID == "" {
		a.ID = NewID(now)
	} else if _, err := IDTime(a.ID); err != nil {
		return Ask{}, fmt.Errorf("enqueue build: %w", err)
	}
	var out Ask
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		// Asked in the transaction rather than left to the primary key, so
		// that a clash is known by its sentinel, not by the driver's message.
		if _, err := getAsk(ctx, tx, a.ID); err == nil {
			return ErrExists
		} else if !errors.Is(err, ErrNotFound) {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO asks (id, repository, ref, module, dry_run, plan_id, again_of, allow_older, state, asked_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			a.ID, a.Repository, a.Ref, a.Module, a.DryRun, a.Plan, a.AgainOf, a.AllowOlder, Waiting, sqlite.FormatTime(now)); err != nil {
			return err
		}
		var err error
		out, err = getAsk(ctx, tx, a.ID)
		return err
	})
	if err != nil {
		return Ask{}, s.said(err, "enqueue build %s", a.ID)
	}
	return out, nil
}

// Take records that a builder (node/module) took a waiting ask now; any
// other ask is ErrNotWaiting, saying where it stands. Whether the builder
// is paused is the caller's to ask before it offers the ask: a builder that
// already said it took one is recorded as having it.
func (s *Store) Take(ctx context.Context, id, builder string, now time.Time) (_ Ask, err error) {
	defer s.db.Failing(&err, "take build %s", id)
	return s.act(ctx, "take", id, func(tx *sql.Tx, a Ask) error {
		if a.State != Waiting {
			return refuse(ErrNotWaiting, a)
		}
		_, err := tx.ExecContext(ctx, `UPDATE asks SET state = ?, builder = ?, taken_at = ? WHERE id = ?`,
			InFlight, builder, sqlite.FormatTime(now), id)
		return err
	})
}

// Finish records a builder's outcome: an ask in flight becomes done, or
// failed if the outcome says so. An outcome for an ask that is waiting
// again or dead (its builder answered after its bound) is recorded all the
// same, marked late: the build happened. So is one from a builder other
// than the one that has the ask in flight now (it took an earlier try). An ask that ended already
// (cancelled, killed, or finished by an earlier outcome) refuses it with
// ErrEnded, saying how it ended. The outcome is bounded as it is kept:
// its why one line, its log tail the last LogTailLines lines.
func (s *Store) Finish(ctx context.Context, id string, o Outcome, now time.Time) (_ Ask, err error) {
	defer s.db.Failing(&err, "finish build %s", id)
	manifest := ""
	if len(o.Manifest) > 0 {
		var b bytes.Buffer
		if err := json.Compact(&b, o.Manifest); err != nil {
			return Ask{}, fmt.Errorf("the outcome's manifest is not JSON: %w", err)
		}
		manifest = b.String()
	}
	problems, err := json.Marshal(bounded(o.Problems, MaxProblems, false))
	if err != nil {
		return Ask{}, err
	}
	tail, err := json.Marshal(bounded(o.LogTail, LogTailLines, true))
	if err != nil {
		return Ask{}, err
	}
	return s.act(ctx, "finish", id, func(tx *sql.Tx, a Ask) error {
		late := false
		switch a.State {
		case InFlight:
			// Another builder took it again after this one's bound: this
			// answer is for the earlier try.
			late = o.On != "" && a.Builder != "" && o.On != a.Builder
		case Waiting, Dead:
			late = true
		default:
			return refuse(ErrEnded, a)
		}
		state, builder, module := Done, a.Builder, a.Module
		if o.Failed {
			state = Failed
		}
		if o.On != "" {
			builder = o.On
		}
		// The module built is the truth of what the archive holds, even
		// when the ask named another.
		if o.Module != "" {
			module = o.Module
		}
		commitAt := ""
		if !o.CommitAt.IsZero() {
			commitAt = sqlite.FormatTime(o.CommitAt)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE asks SET state = ?, builder = ?, module = ?, finished_at = ?, late = ?,
			source_commit = ?, commit_at = ?, version = ?, digest = ?, bytes = ?, unpacked_bytes = ?, duration_ms = ?, why = ? WHERE id = ?`,
			state, builder, module, sqlite.FormatTime(now), late,
			o.Commit, commitAt, o.Version, o.Digest, o.Bytes, o.UnpackedBytes, o.DurationMS, oneLine(o.Why, MaxWhyBytes), id); err != nil {
			return err
		}
		// An ask takes one outcome (an ended one refuses the next), so
		// there is no earlier row to replace.
		_, err := tx.ExecContext(ctx, `INSERT INTO outcome_details (id, problems, log_tail, manifest) VALUES (?, ?, ?, ?)`,
			id, string(problems), string(tail), manifest)
		return err
	})
}

// MarkRegistered records that a done build's module version was taken in.
// A dry run is ErrDryRun; a build that is not done is ErrNotDone. Marking
// a registered build again changes nothing, so a take-in that is retried
// after a crash does not fail on its own earlier half.
func (s *Store) MarkRegistered(ctx context.Context, id string) (_ Ask, err error) {
	defer s.db.Failing(&err, "mark build %s registered", id)
	return s.act(ctx, "register", id, func(tx *sql.Tx, a Ask) error {
		if a.DryRun {
			return refuse(ErrDryRun, a)
		}
		if a.State != Done {
			return refuse(ErrNotDone, a)
		}
		_, err := tx.ExecContext(ctx, `UPDATE asks SET registered = 1 WHERE id = ?`, id)
		return err
	})
}

// MarkSuperseded records that a done build was not registered because the
// mesh holds a newer commit of its module; why says which. Only a done
// build that is not registered may be superseded (ErrNotDone, ErrRegistered).
func (s *Store) MarkSuperseded(ctx context.Context, id, why string) (_ Ask, err error) {
	defer s.db.Failing(&err, "mark build %s superseded", id)
	return s.act(ctx, "supersede", id, func(tx *sql.Tx, a Ask) error {
		if a.State != Done {
			return refuse(ErrNotDone, a)
		}
		if a.Registered {
			return refuse(ErrRegistered, a)
		}
		_, err := tx.ExecContext(ctx, `UPDATE asks SET state = ?, why = ? WHERE id = ?`, Superseded, oneLine(why, MaxWhyBytes), id)
		return err
	})
}

// Cancel drops a waiting or dead ask by hand: it is cancelled. One in
// flight is ErrInFlight, naming where it runs (kill ends it there); one
// that ended is ErrEnded.
func (s *Store) Cancel(ctx context.Context, id string, now time.Time) (_ Ask, err error) {
	defer s.db.Failing(&err, "cancel build %s", id)
	return s.act(ctx, "cancel", id, func(tx *sql.Tx, a Ask) error {
		switch a.State {
		case Waiting, Dead:
		case InFlight:
			return refuse(ErrInFlight, a)
		default:
			return refuse(ErrEnded, a)
		}
		_, err := tx.ExecContext(ctx, `UPDATE asks SET state = ?, finished_at = ?, why = 'cancelled by hand' WHERE id = ?`,
			Cancelled, sqlite.FormatTime(now), id)
		return err
	})
}

// Clear cancels every waiting ask, and with includeDead every dead one,
// and returns how many. An ask in flight is never touched.
func (s *Store) Clear(ctx context.Context, includeDead bool, now time.Time) (_ int, err error) {
	defer s.db.Failing(&err, "clear the build queue")
	query := `UPDATE asks SET state = 'cancelled', finished_at = ?, why = 'cleared by hand' WHERE state = 'waiting'`
	if includeDead {
		query = `UPDATE asks SET state = 'cancelled', finished_at = ?, why = 'cleared by hand' WHERE state IN ('waiting', 'dead')`
	}
	n, err := s.execCount(ctx, query, sqlite.FormatTime(now))
	if err != nil {
		return 0, err
	}
	return n, nil
}

// execCount runs one statement in its own transaction and says how many
// rows it changed.
func (s *Store) execCount(ctx context.Context, query string, args ...any) (int, error) {
	var n int64
	err := s.db.Write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, query, args...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return int(n), err
}

// Kill records that an ask in flight was ended by hand where it runs: it
// is killed, and an outcome that comes after is refused. The returned ask
// names its builder, where the kill is to be sent. Any other ask is
// ErrNotInFlight.
func (s *Store) Kill(ctx context.Context, id string, now time.Time) (_ Ask, err error) {
	defer s.db.Failing(&err, "kill build %s", id)
	return s.act(ctx, "kill", id, func(tx *sql.Tx, a Ask) error {
		if a.State != InFlight {
			return refuse(ErrNotInFlight, a)
		}
		_, err := tx.ExecContext(ctx, `UPDATE asks SET state = ?, finished_at = ?, why = 'killed by hand' WHERE id = ?`,
			Killed, sqlite.FormatTime(now), id)
		return err
	})
}

// Requeue gives up an ask's try in flight (its builder did not answer in
// time): it waits again, one try more, its waiting bound counted from now.
// Any other ask is ErrNotInFlight. ExpireInFlight does this for every ask
// past its bound.
func (s *Store) Requeue(ctx context.Context, id string, now time.Time) (_ Ask, err error) {
	defer s.db.Failing(&err, "requeue build %s", id)
	return s.act(ctx, "requeue", id, func(tx *sql.Tx, a Ask) error {
		if a.State != InFlight {
			return refuse(ErrNotInFlight, a)
		}
		_, err := tx.ExecContext(ctx, `UPDATE asks SET state = ?, tries = tries + 1, last_try_at = ? WHERE id = ?`,
			Waiting, sqlite.FormatTime(now), id)
		return err
	})
}

// ExpireInFlight gives up every try in flight taken more than bound before
// now: the ask waits again with one try more, or, once it has been tried
// maxTries times (at least once), is dead. It returns the asks as they now
// stand, each list oldest asked first.
func (s *Store) ExpireInFlight(ctx context.Context, bound time.Duration, maxTries int, now time.Time) (requeued, dead []Ask, err error) {
	defer s.db.Failing(&err, "expire builds in flight")
	cutoff := sqlite.FormatTime(now.Add(-bound))
	at := sqlite.FormatTime(now)
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		requeued, dead = nil, nil
		expired, err := queryAsks(ctx, tx, `SELECT `+askColumns+` FROM asks WHERE state = 'in-flight' AND taken_at < ? ORDER BY asked_at, id`, cutoff)
		if err != nil {
			return err
		}
		for _, a := range expired {
			if a.Tries+1 >= maxTries {
				why := fmt.Sprintf("no outcome within %v, %d tries", bound, a.Tries+1)
				if _, err := tx.ExecContext(ctx, `UPDATE asks SET state = ?, tries = tries + 1, last_try_at = ?, finished_at = ?, why = ? WHERE id = ?`,
					Dead, at, at, why, a.ID); err != nil {
					return err
				}
			} else if _, err := tx.ExecContext(ctx, `UPDATE asks SET state = ?, tries = tries + 1, last_try_at = ? WHERE id = ?`,
				Waiting, at, a.ID); err != nil {
				return err
			}
			b, err := getAsk(ctx, tx, a.ID)
			if err != nil {
				return err
			}
			if b.State == Dead {
				dead = append(dead, b)
			} else {
				requeued = append(requeued, b)
			}
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return requeued, dead, nil
}

// ExpireWaiting makes dead every ask that waited more than bound before now
// (counted from when it was asked, or from its last try given up) with no
// builder taking it, and returns them, oldest asked first.
func (s *Store) ExpireWaiting(ctx context.Context, bound time.Duration, now time.Time) (_ []Ask, err error) {
	defer s.db.Failing(&err, "expire waiting builds")
	cutoff := sqlite.FormatTime(now.Add(-bound))
	at := sqlite.FormatTime(now)
	var dead []Ask
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		dead = nil
		expired, err := queryAsks(ctx, tx, `SELECT `+askColumns+` FROM asks WHERE state = 'waiting' AND coalesce(last_try_at, asked_at) < ? ORDER BY asked_at, id`, cutoff)
		if err != nil {
			return err
		}
		for _, a := range expired {
			why := fmt.Sprintf("no builder took it within %v", bound)
			if _, err := tx.ExecContext(ctx, `UPDATE asks SET state = ?, finished_at = ?, why = ? WHERE id = ?`, Dead, at, why, a.ID); err != nil {
				return err
			}
			b, err := getAsk(ctx, tx, a.ID)
			if err != nil {
				return err
			}
			dead = append(dead, b)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return dead, nil
}

// act runs one act on one ask in its own write transaction: fn reads the
// ask as it stands, refuses or changes it, and the ask is returned as it
// then stands. doing names the act in the error.
func (s *Store) act(ctx context.Context, doing, id string, fn func(tx *sql.Tx, a Ask) error) (Ask, error) {
	var out Ask
	err := s.db.Write(ctx, func(tx *sql.Tx) error {
		a, err := getAsk(ctx, tx, id)
		if err != nil {
			return err
		}
		if err := fn(tx, a); err != nil {
			return err
		}
		out, err = getAsk(ctx, tx, id)
		return err
	})
	if err != nil {
		return Ask{}, s.said(err, "%s build %s", doing, id)
	}
	return out, nil
}

// refuse is a sentinel refusal saying where the ask stands.
func refuse(sentinel error, a Ask) error {
	if sentinel == ErrInFlight {
		// describe would say "in flight" a second time.
		return fmt.Errorf("%w on %s since %s", ErrInFlight, a.Builder, sqlite.FormatTime(*a.TakenAt))
	}
	return fmt.Errorf("%w: %s", sentinel, describe(a))
}

// bounded keeps at most n lines (the last ones when last, else the first),
// each cut to MaxLineBytes.
func bounded(lines []string, n int, last bool) []string {
	if len(lines) > n {
		if last {
			lines = lines[len(lines)-n:]
		} else {
			lines = lines[:n]
		}
	}
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = cut(l, MaxLineBytes)
	}
	return out
}

// oneLine is s on one line, its white space runs made single spaces, cut to max bytes.
func oneLine(s string, max int) string {
	return cut(strings.Join(strings.Fields(s), " "), max)
}

// cut shortens s to at most max bytes, never inside a UTF-8 sequence.
func cut(s string, max int) string {
	if len(s) <= max {
		return s
	}
	i := max
	for i > 0 && s[i]&0xc0 == 0x80 {
		i--
	}
	return s[:i]
}
