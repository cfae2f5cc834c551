package builds

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func timeUnit(i int) time.Duration { return time.Duration(i) * time.Minute }

// chain is a plan a ← b ← c plus d, which stands on nothing.
func chain() Plan {
	return Plan{Kind: KindOn, Base: "base", Steps: []Step{
		{Module: "a", Repository: "/r/a"},
		{Module: "d", Repository: "/r/d"},
		{Module: "b", Repository: "/r/b", Bases: []string{"a"}},
		{Module: "c", Repository: "/r/c", Bases: []string{"a", "b"}},
	}}
}

// steps says each step's state, as "module:state".
func steps(p Plan) string {
	var out []string
	for _, s := range p.Steps {
		out = append(out, s.Module+":"+string(s.State))
	}
	return strings.Join(out, " ")
}

// build ends a step's ask as a builder and the controller would.
func build(t *testing.T, s *Store, id string, failed bool) {
	t.Helper()
	ctx := context.Background()
	must[Ask](t)(s.Take(ctx, id, "b1/builder", t0))
	must[Ask](t)(s.Finish(ctx, id, Outcome{Failed: failed, Why: map[bool]string{true: "go build: exit status 1"}[failed]}, t0))
	if !failed {
		must[Ask](t)(s.MarkRegistered(ctx, id))
	}
}

func stepAsk(p Plan, module string) string {
	for _, s := range p.Steps {
		if s.Module == module {
			return s.Ask
		}
	}
	return ""
}

func TestPlans_BasesFirst(t *testing.T) {
	s := open(t)
	ctx := context.Background()
	p := must[Plan](t)(s.MakePlan(ctx, chain(), t0))
	if got := steps(p); got != "a:asked d:asked b:waiting c:waiting" {
		t.Fatalf("made: %s", got)
	}
	q := must[[]Ask](t)(s.Queue(ctx))
	if len(q) != 2 || q[0].Plan != p.ID || q[0].Module == "" {
		t.Fatalf("queue: %+v", q)
	}
	build(t, s, stepAsk(p, "a"), false)
	must[[]string](t)(s.AdvancePlans(ctx, t0))
	p = must[Plan](t)(s.Plan(ctx, p.ID))
	// b's base is built; c waits for b too.
	if got := steps(p); got != "a:done d:asked b:asked c:waiting" {
		t.Fatalf("after a: %s", got)
	}
	build(t, s, stepAsk(p, "b"), false)
	build(t, s, stepAsk(p, "d"), false)
	must[[]string](t)(s.AdvancePlans(ctx, t0))
	p = must[Plan](t)(s.Plan(ctx, p.ID))
	if got := steps(p); got != "a:done d:done b:done c:asked" || p.State != PlanRunning {
		t.Fatalf("after b, d: %s %s", got, p.State)
	}
	build(t, s, stepAsk(p, "c"), false)
	lines := must[[]string](t)(s.AdvancePlans(ctx, t0))
	p = must[Plan](t)(s.Plan(ctx, p.ID))
	if p.State != PlanDone || p.EndedAt == nil || !strings.Contains(strings.Join(lines, "\n"), "plan "+p.ID+": done") {
		t.Fatalf("after c: %s %v", p.State, lines)
	}
}

// A failed step stops its dependants (and theirs), says so, and fails the
// plan once nothing else runs; retry asks the failed step again under a
// new ask and lets the stopped wait again.
func TestPlans_FailedStepStopsDependants(t *testing.T) {
	s := open(t)
	ctx := context.Background()
	p := must[Plan](t)(s.MakePlan(ctx, chain(), t0))
	build(t, s, stepAsk(p, "a"), true)
	must[[]string](t)(s.AdvancePlans(ctx, t0))
	p = must[Plan](t)(s.Plan(ctx, p.ID))
	if got := steps(p); got != "a:failed d:asked b:stopped c:stopped" || p.State != PlanRunning {
		t.Fatalf("after a failed: %s %s", got, p.State)
	}
	if !strings.Contains(p.Steps[0].Why, "go build: exit status 1") || !strings.Contains(p.Steps[3].Why, "its base a, b was not built") {
		t.Fatalf("whys: %+v", p.Steps)
	}
	if _, err := s.RetryPlan(ctx, p.ID, t0); !errors.Is(err, ErrPlanNotFailed) {
		t.Fatalf("retry while running: %v", err)
	}
	build(t, s, stepAsk(p, "d"), false)
	must[[]string](t)(s.AdvancePlans(ctx, t0))
	p = must[Plan](t)(s.Plan(ctx, p.ID))
	if p.State != PlanFailed || p.EndedAt == nil {
		t.Fatalf("plan: %s", p.State)
	}
	failedAsk := stepAsk(p, "a")
	p = must[Plan](t)(s.RetryPlan(ctx, p.ID, t0))
	if got := steps(p); got != "a:asked d:done b:waiting c:waiting" || p.State != PlanRunning || p.EndedAt != nil {
		t.Fatalf("retried: %s %s", got, p.State)
	}
	again := must[Ask](t)(s.Get(ctx, stepAsk(p, "a")))
	if again.ID == failedAsk || again.AgainOf != failedAsk || again.State != Waiting {
		t.Fatalf("asked again: %+v", again)
	}
	if _, err := s.ClosePlan(ctx, p.ID, "x", t0); !errors.Is(err, ErrPlanNotFailed) {
		t.Fatalf("close while running: %v", err)
	}
}

// A dead ask re-asked by the healer is followed; a dead one not re-asked
// fails its step.
func TestPlans_DeadAskFollowed(t *testing.T) {
	s := open(t)
	ctx := context.Background()
	p := must[Plan](t)(s.MakePlan(ctx, Plan{Kind: KindBehind, Steps: []Step{{Module: "a", Repository: "/r/a"}}}, t0))
	first := stepAsk(p, "a")
	if _, err := s.ExpireWaiting(ctx, 0, t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	again := must[Ask](t)(s.Enqueue(ctx, Ask{Repository: "/r/a", Module: "a", AgainOf: first}, t0))
	must[[]string](t)(s.AdvancePlans(ctx, t0))
	p = must[Plan](t)(s.Plan(ctx, p.ID))
	if p.Steps[0].State != StepAsked || p.Steps[0].Ask != again.ID {
		t.Fatalf("the ask again not followed: %+v", p.Steps[0])
	}
	if _, err := s.ExpireWaiting(ctx, 0, t0.Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	must[[]string](t)(s.AdvancePlans(ctx, t0))
	p = must[Plan](t)(s.Plan(ctx, p.ID))
	if p.Steps[0].State != StepFailed || p.State != PlanFailed {
		t.Fatalf("dead, not asked again: %+v %s", p.Steps[0], p.State)
	}
	p = must[Plan](t)(s.ClosePlan(ctx, p.ID, "the repository is gone", t0))
	if p.State != PlanClosed || p.Why != "the repository is gone" {
		t.Fatalf("closed: %+v", p)
	}
}

// Stop cancels the asks still waiting, leaves one in flight to be taken in,
// stops what was not asked, and is refused on a plan that is not running.
func TestPlans_Stop(t *testing.T) {
	s := open(t)
	ctx := context.Background()
	p := must[Plan](t)(s.MakePlan(ctx, chain(), t0))
	must[Ask](t)(s.Take(ctx, stepAsk(p, "a"), "b1/builder", t0))
	p, inFlight, err := s.StopPlan(ctx, p.ID, "wrong base", t0)
	if err != nil {
		t.Fatal(err)
	}
	if p.State != PlanStopped || len(inFlight) != 1 || inFlight[0] != stepAsk(p, "a") || steps(p) != "a:stopped d:stopped b:stopped c:stopped" {
		t.Fatalf("stopped: %s %s %v", p.State, steps(p), inFlight)
	}
	if d := must[Ask](t)(s.Get(ctx, stepAsk(p, "d"))); d.State != Cancelled {
		t.Fatalf("d's waiting ask: %s", d.State)
	}
	if a := must[Ask](t)(s.Get(ctx, stepAsk(p, "a"))); a.State != InFlight {
		t.Fatalf("a's ask in flight: %s", a.State)
	}
	if _, _, err := s.StopPlan(ctx, p.ID, "again", t0); !errors.Is(err, ErrPlanNotRunning) {
		t.Fatalf("stop again: %v", err)
	}
	if _, err := s.Plan(ctx, "p-1-x"); !errors.Is(err, ErrPlanNotFound) {
		t.Fatalf("unknown: %v", err)
	}
}

func TestPlans_Refused(t *testing.T) {
	s := open(t)
	ctx := context.Background()
	for name, p := range map[string]Plan{
		"empty":        {Kind: KindBehind},
		"base after":   {Kind: KindOn, Steps: []Step{{Module: "b", Repository: "/r", Bases: []string{"a"}}, {Module: "a", Repository: "/r"}}},
		"twice":        {Kind: KindOn, Steps: []Step{{Module: "a", Repository: "/r"}, {Module: "a", Repository: "/r"}}},
		"unknown kind": {Kind: "sideways", Steps: []Step{{Module: "a", Repository: "/r"}}},
	} {
		if _, err := s.MakePlan(ctx, p, t0); err == nil {
			t.Errorf("%s: made", name)
		}
	}
	if ps := must[[]Plan](t)(s.Plans(ctx, 0)); len(ps) != 0 {
		t.Fatalf("a refused plan was kept: %+v", ps)
	}
}

// Plans lists running and failed plans whatever the limit, then the
// latest ended; PrunePlans deletes only ended plans beyond those kept.
func TestPlans_ListAndPrune(t *testing.T) {
	s := open(t)
	ctx := context.Background()
	one := Plan{Kind: KindBehind, Steps: []Step{{Module: "a", Repository: "/r/a"}}}
	running := must[Plan](t)(s.MakePlan(ctx, one, t0))
	var ended []string
	for i := range 3 {
		p := must[Plan](t)(s.MakePlan(ctx, one, t0.Add(1+timeUnit(i))))
		build(t, s, stepAsk(p, "a"), false)
		must[[]string](t)(s.AdvancePlans(ctx, t0))
		ended = append(ended, p.ID)
	}
	ps := must[[]Plan](t)(s.Plans(ctx, 1))
	if len(ps) != 2 || ps[0].ID != running.ID || ps[1].ID != ended[2] {
		t.Fatalf("plans: %v", ids(ps))
	}
	n := must[int](t)(s.PrunePlans(ctx, 1, t0.Add(timeUnit(10))))
	if n != 2 {
		t.Fatalf("pruned %d", n)
	}
	ps = must[[]Plan](t)(s.Plans(ctx, 10))
	if len(ps) != 2 || ps[0].ID != running.ID || ps[1].ID != ended[2] {
		t.Fatalf("after prune: %v", ids(ps))
	}
}

func ids(ps []Plan) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.ID+":"+string(p.State))
	}
	return out
}
