package builds

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"

	"mesh-controller/embedded/sqlite"
)

// PlanState is where a build plan stands.
type PlanState string

// The states of a plan. Only a running plan asks for builds.
const (
	// PlanRunning: some step waits for its bases or for its build.
	PlanRunning PlanState = "running"
	// PlanDone: every step was built and registered.
	PlanDone PlanState = "done"
	// PlanFailed: a step failed and its dependants were stopped; nothing
	// more is asked until the plan is retried or closed.
	PlanFailed PlanState = "failed"
	// PlanStopped: ended by hand while it ran.
	PlanStopped PlanState = "stopped"
	// PlanClosed: a failed plan ended by hand, not to be retried.
	PlanClosed PlanState = "closed"
)

// StepState is where one step of a plan stands.
type StepState string

// The states of a step.
const (
	// StepWaiting: its bases are not all built yet.
	StepWaiting StepState = "waiting"
	// StepAsked: its build is asked (waiting, in flight).
	StepAsked StepState = "asked"
	// StepDone: built and registered (or superseded by a newer build).
	StepDone StepState = "done"
	// StepFailed: its build failed, died, or was cancelled or killed.
	StepFailed StepState = "failed"
	// StepStopped: not asked, because a base failed or the plan was
	// stopped.
	StepStopped StepState = "stopped"
)

// Plan kinds: what made it.
const (
	// KindBehind: build --behind, every module older than its source.
	KindBehind = "behind"
	// KindOn: build --on, every module standing on a base module.
	KindOn = "on"
)

// Plan is a build plan and its steps, bases first.
type Plan struct {
	ID   string `json:"id"`
	Kind string `json:"kind"`
	// Base is the module a plan on rebuilds the dependants of.
	Base    string     `json:"base,omitempty"`
	State   PlanState  `json:"state"`
	MadeAt  time.Time  `json:"made_at"`
	EndedAt *time.Time `json:"ended_at"`
	// Why a person stopped or closed it.
	Why   string `json:"why,omitempty"`
	Steps []Step `json:"steps"`
}

// Step is one module build of a plan.
type Step struct {
	Module     string `json:"module"`
	Repository string `json:"repository"`
	Ref        string `json:"ref"`
	// Bases are the modules of the plan it waits for.
	Bases []string  `json:"bases"`
	State StepState `json:"state"`
	// Ask is the build asking for it now, "" until asked.
	Ask string `json:"ask,omitempty"`
	// Why says why it failed or was stopped.
	Why string `json:"why,omitempty"`
}

var (
	// ErrPlanNotFound means no plan has that id.
	ErrPlanNotFound = sqlite.Refusal("no build plan has that id")
	// ErrPlanOrder means a plan's steps are not bases first.
	ErrPlanOrder = sqlite.Refusal("a step must come after its bases, and name each module once")
	// ErrPlanNotRunning means only a running plan may be stopped.
	ErrPlanNotRunning = sqlite.Refusal("it is not running")
	// ErrPlanNotFailed means only a failed plan may be retried or closed.
	ErrPlanNotFailed = sqlite.Refusal("it has not failed")
	// ErrEmptyPlan means a plan must have a step.
	ErrEmptyPlan = sqlite.Refusal("a build plan must build at least one module")
)

// NewPlanID makes a plan id, p-<unix-millis>-<random>.
func NewPlanID(now time.Time) string { return "p" + strings.TrimPrefix(NewID(now), "b") }

// MakePlan keeps a new running plan and, in the same transaction, asks for
// the build of every step that has no base. Its steps must come bases
// first (ErrPlanOrder). It returns the plan as kept.
func (s *Store) MakePlan(ctx context.Context, p Plan, now time.Time) (_ Plan, err error) {
	defer s.db.Failing(&err, "make build plan")
	if len(p.Steps) == 0 {
		return Plan{}, ErrEmptyPlan
	}
	seen := map[string]bool{}
	for _, st := range p.Steps {
		for _, b := range st.Bases {
			if !seen[b] {
				return Plan{}, fmt.Errorf("%w: %s waits for %s, which comes after it or is not in the plan", ErrPlanOrder, st.Module, b)
			}
		}
		if seen[st.Module] || st.Repository == "" {
			return Plan{}, fmt.Errorf("%w: %s twice, or with no repository", ErrPlanOrder, st.Module)
		}
		seen[st.Module] = true
	}
	if p.ID == "" {
		p.ID = NewPlanID(now)
	}
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO plans (id, kind, base, state, made_at) VALUES (?, ?, ?, ?, ?)`,
			p.ID, p.Kind, p.Base, PlanRunning, sqlite.FormatTime(now)); err != nil {
			return err
		}
		for i, st := range p.Steps {
			bases, _ := json.Marshal(append([]string{}, st.Bases...))
			if _, err := tx.ExecContext(ctx, `INSERT INTO plan_steps (plan, position, module, repository, ref, bases, state) VALUES (?, ?, ?, ?, ?, ?, ?)`,
				p.ID, i, st.Module, st.Repository, st.Ref, string(bases), StepWaiting); err != nil {
				return err
			}
		}
		_, err := advance(ctx, tx, p.ID, now)
		return err
	})
	if err != nil {
		return Plan{}, err
	}
	return s.Plan(ctx, p.ID)
}

// AdvancePlans carries every running plan on: a step whose build ended is
// done or failed (a failed step stops its dependants), a step whose bases
// are all done is asked for, and a plan with nothing left to do ends,
// done or failed. One transaction per plan; it returns a line for each
// thing it did.
func (s *Store) AdvancePlans(ctx context.Context, now time.Time) (_ []string, err error) {
	defer s.db.Failing(&err, "carry build plans on")
	ids, err := sqlite.Strings(ctx, s.db.Reader, `SELECT id FROM plans WHERE state = 'running' ORDER BY made_at, id`)
	if err != nil {
		return nil, fmt.Errorf("read running plans: %w", err)
	}
	var lines []string
	for _, id := range ids {
		err := s.db.Write(ctx, func(tx *sql.Tx) error {
			l, err := advance(ctx, tx, id, now)
			lines = append(lines, l...)
			return err
		})
		if err != nil {
			return lines, s.said(err, "carry build plan %s on", id)
		}
	}
	return lines, nil
}

// advance carries one plan on inside tx (see AdvancePlans).
func advance(ctx context.Context, tx *sql.Tx, id string, now time.Time) ([]string, error) {
	p, err := readPlan(ctx, tx, id)
	if err != nil || p.State != PlanRunning {
		return nil, err
	}
	var lines []string
	set := func(i int, state StepState, ask, why string) error {
		p.Steps[i].State, p.Steps[i].Ask, p.Steps[i].Why = state, ask, why
		_, err := tx.ExecContext(ctx, `UPDATE plan_steps SET state = ?, ask = ?, why = ? WHERE plan = ? AND position = ?`, state, ask, oneLine(why, MaxWhyBytes), id, i)
		return err
	}
	// Steps come bases first, so one pass settles each step after its
	// bases were settled.
	state := map[string]StepState{}
	for i, st := range p.Steps {
		switch st.State {
		case StepAsked:
			a, err := followAgain(ctx, tx, st.Ask)
			if err != nil {
				return lines, err
			}
			switch {
			case a.State == Done && a.Registered, a.State == Superseded:
				why := ""
				if a.State == Superseded {
					why = "superseded: " + a.Why
				}
				if err := set(i, StepDone, a.ID, why); err != nil {
					return lines, err
				}
				lines = append(lines, fmt.Sprintf("plan %s: %s built (%s)", id, st.Module, a.ID))
			case a.State == Failed || a.State == Dead || a.State == Cancelled || a.State == Killed:
				why := fmt.Sprintf("build %s %s", a.ID, a.State)
				if a.Why != "" {
					why += ": " + a.Why
				}
				if err := set(i, StepFailed, a.ID, why); err != nil {
					return lines, err
				}
				lines = append(lines, fmt.Sprintf("plan %s: %s failed: %s", id, st.Module, why))
			case a.ID != st.Ask:
				if err := set(i, StepAsked, a.ID, ""); err != nil { // asked again: follow the new ask
					return lines, err
				}
			}
		case StepWaiting:
			var failed []string
			ready := true
			for _, b := range st.Bases {
				switch state[b] {
				case StepFailed, StepStopped:
					failed = append(failed, b)
				case StepDone:
				default:
					ready = false
				}
			}
			if len(failed) > 0 {
				if err := set(i, StepStopped, "", "not asked: its base "+strings.Join(failed, ", ")+" was not built"); err != nil {
					return lines, err
				}
				lines = append(lines, fmt.Sprintf("plan %s: %s stopped: its base %s was not built", id, st.Module, strings.Join(failed, ", ")))
				break
			}
			if !ready {
				break
			}
			a := Ask{ID: NewID(now), Repository: st.Repository, Ref: st.Ref, Module: st.Module, Plan: id}
			if err := insertAsk(ctx, tx, a, now); err != nil {
				return lines, err
			}
			if err := set(i, StepAsked, a.ID, ""); err != nil {
				return lines, err
			}
			lines = append(lines, fmt.Sprintf("plan %s: %s asked (%s)", id, st.Module, a.ID))
		}
		state[st.Module] = p.Steps[i].State
	}
	end := PlanDone
	for _, st := range p.Steps {
		switch st.State {
		case StepWaiting, StepAsked:
			return lines, nil // still running
		case StepFailed, StepStopped:
			end = PlanFailed
		}
	}
	if _, err := tx.ExecContext(ctx, `UPDATE plans SET state = ?, ended_at = ? WHERE id = ?`, end, sqlite.FormatTime(now), id); err != nil {
		return lines, err
	}
	return append(lines, fmt.Sprintf("plan %s: %s", id, end)), nil
}

// followAgain reads an ask and, if it died and was asked again (by the
// re-ask healer), the newest ask again in its place.
func followAgain(ctx context.Context, q sqlite.Querier, id string) (Ask, error) {
	a, err := getAsk(ctx, q, id)
	for err == nil && a.State == Dead {
		next, qerr := sqlite.Strings(ctx, q, `SELECT id FROM asks WHERE again_of = ? ORDER BY asked_at DESC, id DESC LIMIT 1`, a.ID)
		if qerr != nil || len(next) == 0 {
			return a, qerr
		}
		a, err = getAsk(ctx, q, next[0])
	}
	return a, err
}

// RetryPlan asks a failed plan's failed steps again (each under a new ask,
// asked again of the one that failed), lets its stopped steps wait for
// their bases again, and runs the plan on. Any plan but a failed one is
// ErrPlanNotFailed.
func (s *Store) RetryPlan(ctx context.Context, id string, now time.Time) (_ Plan, err error) {
	defer s.db.Failing(&err, "retry build plan %s", id)
	return s.planAct(ctx, "retry", id, PlanFailed, ErrPlanNotFailed, func(tx *sql.Tx, p Plan) error {
		for i, st := range p.Steps {
			switch st.State {
			case StepFailed:
				a := Ask{ID: NewID(now), Repository: st.Repository, Ref: st.Ref, Module: st.Module, Plan: id, AgainOf: st.Ask}
				if err := insertAsk(ctx, tx, a, now); err != nil {
					return err
				}
				if _, err := tx.ExecContext(ctx, `UPDATE plan_steps SET state = 'asked', ask = ?, why = '' WHERE plan = ? AND position = ?`, a.ID, id, i); err != nil {
					return err
				}
			case StepStopped:
				if _, err := tx.ExecContext(ctx, `UPDATE plan_steps SET state = 'waiting', ask = '', why = '' WHERE plan = ? AND position = ?`, id, i); err != nil {
					return err
				}
			}
		}
		_, err := tx.ExecContext(ctx, `UPDATE plans SET state = 'running', ended_at = NULL WHERE id = ?`, id)
		return err
	})
}

// StopPlan ends a running plan by hand: steps not yet asked are stopped,
// asks still waiting are cancelled, and a build in flight goes on (it is
// taken in when it ends, as any build) with its step stopped. It returns
// the plan and the builds left in flight. Any plan but a running one is
// ErrPlanNotRunning.
func (s *Store) StopPlan(ctx context.Context, id, why string, now time.Time) (_ Plan, _ []string, err error) {
	defer s.db.Failing(&err, "stop build plan %s", id)
	var inFlight []string
	p, err := s.planAct(ctx, "stop", id, PlanRunning, ErrPlanNotRunning, func(tx *sql.Tx, p Plan) error {
		stamp := sqlite.FormatTime(now)
		for i, st := range p.Steps {
			stepWhy := "stopped by hand"
			switch st.State {
			case StepWaiting:
			case StepAsked:
				a, err := getAsk(ctx, tx, st.Ask)
				if err != nil {
					return err
				}
				switch a.State {
				case InFlight:
					inFlight = append(inFlight, a.ID)
					stepWhy = "stopped by hand; its build " + a.ID + " was in flight and is taken in when it ends"
				case Waiting, Dead:
					if _, err := tx.ExecContext(ctx, `UPDATE asks SET state = 'cancelled', finished_at = ?, why = 'cancelled by hand: its plan was stopped' WHERE id = ?`, stamp, a.ID); err != nil {
						return err
					}
					stepWhy = "stopped by hand; its build " + a.ID + " was cancelled"
				}
			default:
				continue
			}
			if _, err := tx.ExecContext(ctx, `UPDATE plan_steps SET state = 'stopped', why = ? WHERE plan = ? AND position = ?`, stepWhy, id, i); err != nil {
				return err
			}
		}
		_, err := tx.ExecContext(ctx, `UPDATE plans SET state = 'stopped', ended_at = ?, why = ? WHERE id = ?`, stamp, oneLine(why, MaxWhyBytes), id)
		return err
	})
	return p, inFlight, err
}

// ClosePlan ends a failed plan by hand, not to be retried. Any plan but a
// failed one is ErrPlanNotFailed.
func (s *Store) ClosePlan(ctx context.Context, id, why string, now time.Time) (_ Plan, err error) {
	defer s.db.Failing(&err, "close build plan %s", id)
	return s.planAct(ctx, "close", id, PlanFailed, ErrPlanNotFailed, func(tx *sql.Tx, _ Plan) error {
		_, err := tx.ExecContext(ctx, `UPDATE plans SET state = 'closed', ended_at = ?, why = ? WHERE id = ?`, sqlite.FormatTime(now), oneLine(why, MaxWhyBytes), id)
		return err
	})
}

// planAct runs fn on plan id inside one transaction, once the plan is in
// state want (else the sentinel, saying where it stands), and returns the
// plan as it is after.
func (s *Store) planAct(ctx context.Context, doing, id string, want PlanState, sentinel error, fn func(tx *sql.Tx, p Plan) error) (Plan, error) {
	err := s.db.Write(ctx, func(tx *sql.Tx) error {
		p, err := readPlan(ctx, tx, id)
		if err != nil {
			return err
		}
		if p.State != want {
			return fmt.Errorf("plan %s %w (it is %s)", id, sentinel, p.State)
		}
		return fn(tx, p)
	})
	if err != nil {
		return Plan{}, s.said(err, "%s build plan", doing)
	}
	return s.Plan(ctx, id)
}

// insertAsk asks for a plan step's build, waiting from now.
func insertAsk(ctx context.Context, tx *sql.Tx, a Ask, now time.Time) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO asks (id, repository, ref, module, plan_id, again_of, state, asked_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
		a.ID, a.Repository, a.Ref, a.Module, a.Plan, a.AgainOf, Waiting, sqlite.FormatTime(now))
	return err
}

// Plan returns one plan with its steps, or ErrPlanNotFound.
func (s *Store) Plan(ctx context.Context, id string) (_ Plan, err error) {
	defer s.db.Failing(&err, "read build plan %s", id)
	p, err := readPlan(ctx, s.db.Reader, id)
	if err != nil {
		return Plan{}, s.said(err, "read build plan %s", id)
	}
	return p, nil
}

// DefaultPlanLimit is how many plans Plans returns: the running ones and
// the latest ended, not all of history.
const DefaultPlanLimit = 20

// Plans returns every running or failed plan (they wait for the builds or
// for a person), then the latest limit others (0 is DefaultPlanLimit),
// newest first, with their steps.
func (s *Store) Plans(ctx context.Context, limit int) (_ []Plan, err error) {
	defer s.db.Failing(&err, "list build plans")
	if limit <= 0 {
		limit = DefaultPlanLimit
	}
	ids, err := sqlite.Strings(ctx, s.db.Reader, `SELECT id FROM (
		SELECT id, made_at, 0 AS rank FROM plans WHERE state IN ('running', 'failed')
		UNION ALL
		SELECT id, made_at, 1 FROM (SELECT id, made_at FROM plans WHERE state NOT IN ('running', 'failed') ORDER BY made_at DESC, id DESC LIMIT ?) AS ended
	) AS listed ORDER BY rank, made_at DESC, id DESC`, limit)
	if err != nil {
		return nil, err
	}
	out := []Plan{}
	for _, id := range ids {
		p, err := readPlan(ctx, s.db.Reader, id)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// PrunePlans deletes ended plans (done, stopped, closed) beyond the newest
// keep that ended before olderThan, and returns how many went. Running and
// failed plans are never deleted: they wait for a person.
func (s *Store) PrunePlans(ctx context.Context, keep int, olderThan time.Time) (_ int, err error) {
	defer s.db.Failing(&err, "prune build plans")
	n, err := s.execCount(ctx, `DELETE FROM plans WHERE id IN (
		SELECT id FROM plans WHERE state IN ('done', 'stopped', 'closed') AND ended_at < ?
		ORDER BY made_at DESC, id DESC LIMIT ? OFFSET ?)`, sqlite.FormatTime(olderThan), int64(math.MaxInt64), max(keep, 0))
	if err != nil {
		return 0, err
	}
	return n, nil
}

// readPlan reads a plan and its steps.
func readPlan(ctx context.Context, q sqlite.Querier, id string) (Plan, error) {
	var p Plan
	var made string
	var ended sql.NullString
	head, err := q.QueryContext(ctx, `SELECT id, kind, base, state, made_at, ended_at, why FROM plans WHERE id = ?`, id)
	if err != nil {
		return Plan{}, err
	}
	found := head.Next()
	if found {
		err = head.Scan(&p.ID, &p.Kind, &p.Base, &p.State, &made, &ended, &p.Why)
	}
	head.Close()
	if err == nil {
		err = head.Err()
	}
	if err != nil {
		return Plan{}, err
	}
	if !found {
		return Plan{}, fmt.Errorf("%q: %w", id, ErrPlanNotFound)
	}
	if p.MadeAt, err = sqlite.ParseTime(made); err != nil {
		return Plan{}, err
	}
	if p.EndedAt, err = sqlite.ParseNullTime(ended); err != nil {
		return Plan{}, err
	}
	rows, err := q.QueryContext(ctx, `SELECT module, repository, ref, bases, state, ask, why FROM plan_steps WHERE plan = ? ORDER BY position`, id)
	if err != nil {
		return Plan{}, err
	}
	defer rows.Close()
	p.Steps = []Step{}
	for rows.Next() {
		var st Step
		var bases string
		if err := rows.Scan(&st.Module, &st.Repository, &st.Ref, &bases, &st.State, &st.Ask, &st.Why); err != nil {
			return Plan{}, err
		}
		if err := json.Unmarshal([]byte(bases), &st.Bases); err != nil {
			return Plan{}, fmt.Errorf("plan %s, step %s: bases: %w", id, st.Module, err)
		}
		p.Steps = append(p.Steps, st)
	}
	return p, rows.Err()
}
