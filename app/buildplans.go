package app

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"mesh-controller/contexts/builds"
	"mesh-controller/contexts/inventory"
)

var (
	// ErrStandsOnCycle means the modules' stands_on make a cycle: no
	// order builds bases first.
	ErrStandsOnCycle = errors.New("stands_on makes a cycle")
	// ErrPlanFailed means a plan ended without every step built.
	ErrPlanFailed = errors.New("the build plan did not build every module")
	// ErrPlanProblems means a plan could not be made; the error lists
	// every problem.
	ErrPlanProblems = errors.New("refused")
)

// PlanRequest asks for a build plan: every module behind its source
// (Behind), or every module that stands on On.
type PlanRequest struct {
	Behind bool
	On     string
	// NoWait returns once the plan is made.
	NoWait bool
	// Progress is told each step's changes.
	Progress func(string)
}

// BuildPlan makes a build plan and, unless NoWait, follows it until it
// ends: nil only when every step was built. A plan with nothing to build
// is not made: its Steps are empty and the error nil.
//
// build --behind builds each module whose source moved past what the mesh
// built, at the commit module moved recorded; build --on rebuilds every
// module that stands on a module, directly or through others, at the
// commit the mesh built it from (its default branch if none). Either way a
// module that stands on another in the plan waits for it; a cycle is
// refused, naming it, and so is a module with no source to build.
func (c *Builds) BuildPlan(ctx context.Context, r PlanRequest) (builds.Plan, error) {
	if r.Progress == nil {
		r.Progress = func(string) {}
	}
	if r.Behind == (r.On != "") {
		return builds.Plan{}, errors.New("a plan builds the modules behind their source (--behind) or those standing on one module (--on), one of them")
	}
	st, err := c.stores(ctx)
	if err != nil {
		return builds.Plan{}, err
	}
	mods, err := st.Inventory.Modules(ctx)
	if err != nil {
		return builds.Plan{}, err
	}
	byName := map[string]inventory.Module{}
	for _, m := range mods {
		byName[m.Name] = m
	}
	plan := builds.Plan{Kind: builds.KindBehind}
	var chosen []string
	if r.Behind {
		for _, m := range mods {
			if m.BehindSource() {
				chosen = append(chosen, m.Name)
			}
		}
	} else {
		if err := CheckName(r.On); err != nil {
			return builds.Plan{}, err
		}
		if _, ok := byName[r.On]; !ok {
			_, err := st.Inventory.Module(ctx, r.On) // its refusal, as every command says it
			return builds.Plan{}, err
		}
		plan.Kind, plan.Base = builds.KindOn, r.On
		chosen = standingOn(mods, r.On)
	}
	if len(chosen) == 0 {
		return plan, nil
	}
	steps, err := orderSteps(byName, chosen, plan.Kind)
	if err != nil {
		return builds.Plan{}, err
	}
	plan.Steps = steps
	p, err := st.Builds.MakePlan(ctx, plan, c.Now())
	if err != nil {
		return builds.Plan{}, err
	}
	for _, s := range p.Steps {
		r.Progress(StepLine(s))
	}
	if c.noBuildSeatHolder(ctx, st) {
		if r.NoWait {
			r.Progress("no module holds the build seat yet: the plan's builds wait until one does")
			return p, nil
		}
		return p, fmt.Errorf("plan %s is made, and %w", p.ID, ErrNoBuilder)
	}
	c.kickBuilds(ctx, st)
	if r.NoWait {
		return p, nil
	}
	return c.followPlan(ctx, p, r.Progress)
}

// standingOn are the modules that stand on base, directly or through
// other modules, by name.
func standingOn(mods []inventory.Module, base string) []string {
	on := map[string]bool{base: true}
	for grew := true; grew; {
		grew = false
		for _, m := range mods {
			if on[m.Name] {
				continue
			}
			for _, b := range m.Current.StandsOn {
				if on[b] {
					on[m.Name], grew = true, true
					break
				}
			}
		}
	}
	delete(on, base)
	out := make([]string, 0, len(on))
	for name := range on {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// orderSteps puts the chosen modules bases first: each waits for every
// chosen module it stands on, directly or through modules not chosen. It
// refuses a cycle (naming it) and modules with no source, listing each.
func orderSteps(byName map[string]inventory.Module, chosen []string, kind string) ([]builds.Step, error) {
	if cycle := standsOnCycle(byName, chosen); cycle != nil {
		return nil, fmt.Errorf("%w: %s: no order builds bases first", ErrStandsOnCycle, strings.Join(cycle, " → "))
	}
	in := map[string]bool{}
	for _, name := range chosen {
		in[name] = true
	}
	var problems []string
	bases := map[string][]string{}
	for _, name := range chosen {
		if byName[name].Source == "" {
			problems = append(problems, fmt.Sprintf("module %s names no source to build it from (module add it with a source, or from a build)", name))
		} else if err := inventory.CheckRepository(byName[name].Source); err != nil {
			problems = append(problems, fmt.Sprintf("module %s: %v", name, err))
		}
		// Every chosen module reachable by stands_on, through any module.
		seen := map[string]bool{name: true}
		for queue := slices.Clone(byName[name].Current.StandsOn); len(queue) > 0; queue = queue[1:] {
			b := queue[0]
			if seen[b] {
				continue
			}
			seen[b] = true
			if in[b] {
				bases[name] = append(bases[name], b)
			}
			queue = append(queue, byName[b].Current.StandsOn...)
		}
		sort.Strings(bases[name])
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%w: %s", ErrPlanProblems, strings.Join(problems, "; "))
	}
	// Kahn's order, by name among the ready, so that a plan reads the
	// same every time.
	done := map[string]bool{}
	var steps []builds.Step
	for len(steps) < len(chosen) {
		before := len(steps)
		for _, name := range chosen {
			if done[name] || slices.ContainsFunc(bases[name], func(b string) bool { return !done[b] }) {
				continue
			}
			m := byName[name]
			ref := m.Commit // on: the commit the mesh built, again on its new bases
			if kind == builds.KindBehind {
				ref = m.MovedCommit
			}
			steps = append(steps, builds.Step{Module: name, Repository: m.Source, Ref: ref, Bases: bases[name]})
			done[name] = true
			break
		}
		if len(steps) == before { // unreachable: standsOnCycle found none
			return nil, fmt.Errorf("%w among %s", ErrStandsOnCycle, strings.Join(chosen, ", "))
		}
	}
	return steps, nil
}

// standsOnCycle is a cycle of stands_on reachable from the chosen modules,
// as the names around it (the first again at the end), or nil.
func standsOnCycle(byName map[string]inventory.Module, chosen []string) []string {
	const (
		unseen = iota
		open
		closed
	)
	mark := map[string]int{}
	var path []string
	var visit func(string) []string
	visit = func(name string) []string {
		switch mark[name] {
		case open:
			i := slices.Index(path, name)
			return append(slices.Clone(path[i:]), name)
		case closed:
			return nil
		}
		mark[name] = open
		path = append(path, name)
		for _, b := range byName[name].Current.StandsOn {
			if c := visit(b); c != nil {
				return c
			}
		}
		path = path[:len(path)-1]
		mark[name] = closed
		return nil
	}
	for _, name := range chosen {
		if c := visit(name); c != nil {
			return c
		}
	}
	return nil
}

// StepLine says where a step stands, as plans shows it.
func StepLine(s builds.Step) string {
	line := fmt.Sprintf("  %s: %s", s.Module, s.State)
	switch {
	case s.State == builds.StepWaiting && len(s.Bases) > 0:
		line += " for " + strings.Join(s.Bases, ", ")
	case s.Ask != "":
		line += " (" + s.Ask + ")"
	}
	if s.Why != "" {
		line += ": " + s.Why
	}
	return line
}

// followPlan says each step's changes until the plan ends.
func (c uses) followPlan(ctx context.Context, p builds.Plan, progress func(string)) (builds.Plan, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return p, err
	}
	shown := map[string]string{}
	for _, s := range p.Steps {
		shown[s.Module] = StepLine(s)
	}
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for p.State == builds.PlanRunning {
		select {
		case <-ctx.Done():
			return p, fmt.Errorf("plan %s goes on without you: see 'mesh-controller build plans'", p.ID)
		case <-tick.C:
		}
		if p, err = st.Builds.Plan(ctx, p.ID); err != nil {
			return p, err
		}
		for _, s := range p.Steps {
			if l := StepLine(s); shown[s.Module] != l {
				shown[s.Module] = l
				progress(l)
			}
		}
	}
	if p.State != builds.PlanDone {
		return p, fmt.Errorf("%w: plan %s %s: %s", ErrPlanFailed, p.ID, p.State, planTrouble(p))
	}
	return p, nil
}

// planTrouble says which steps were not built and why, in one line.
func planTrouble(p builds.Plan) string {
	var out []string
	for _, s := range p.Steps {
		if s.State == builds.StepFailed || s.State == builds.StepStopped {
			out = append(out, fmt.Sprintf("%s %s (%s)", s.Module, s.State, s.Why))
		}
	}
	return strings.Join(out, "; ")
}

// BuildPlans is what plans shows: the running and failed plans, then the
// latest ended.
func (c *Builds) BuildPlans(ctx context.Context) ([]builds.Plan, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return nil, err
	}
	ps, err := st.Builds.Plans(ctx, 0)
	for i := range ps {
		ps[i] = shownPlan(ps[i])
	}
	return ps, err
}

// shownPlan is a plan as the mesh prints it: each step's repository and
// why redacted (a plan made before credentials were refused in repository
// URLs may hold one).
func shownPlan(p builds.Plan) builds.Plan {
	p.Steps = slices.Clone(p.Steps)
	for i := range p.Steps {
		p.Steps[i].Repository, p.Steps[i].Why = inventory.RedactRepository(p.Steps[i].Repository), inventory.RedactText(p.Steps[i].Why)
	}
	return p
}

// PlanRetry asks a failed plan's failed builds again and carries it on.
func (c *Builds) PlanRetry(ctx context.Context, id string) (builds.Plan, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return builds.Plan{}, err
	}
	p, err := st.Builds.RetryPlan(ctx, id, c.Now())
	if err == nil {
		c.kickBuilds(ctx, st)
	}
	return shownPlan(p), err
}

// PlanStop ends a running plan by hand (a hand act): what was not asked is
// not, what waits is cancelled, a build in flight is taken in when it ends.
func (c *Builds) PlanStop(ctx context.Context, id, why string) (builds.Plan, []string, error) {
	if strings.TrimSpace(why) == "" {
		return builds.Plan{}, nil, errBuildWhy
	}
	st, err := c.stores(ctx)
	if err != nil {
		return builds.Plan{}, nil, err
	}
	p, inFlight, err := st.Builds.StopPlan(ctx, id, why, c.Now())
	if p = shownPlan(p); err != nil {
		return p, nil, err
	}
	return p, inFlight, c.recordHand(ctx, fmt.Sprintf("stop build plan %s (%s)", p.ID, PlanWhat(p)), why, "build", "")
}

// PlanClose ends a failed plan by hand, not to be retried (a hand act).
func (c *Builds) PlanClose(ctx context.Context, id, why string) (builds.Plan, error) {
	if strings.TrimSpace(why) == "" {
		return builds.Plan{}, errBuildWhy
	}
	st, err := c.stores(ctx)
	if err != nil {
		return builds.Plan{}, err
	}
	p, err := st.Builds.ClosePlan(ctx, id, why, c.Now())
	if p = shownPlan(p); err != nil {
		return p, err
	}
	return p, c.recordHand(ctx, fmt.Sprintf("close build plan %s (%s)", p.ID, PlanWhat(p)), why, "build", "")
}

// PlanWhat says what a plan builds: "modules behind their source" or
// "modules standing on X".
func PlanWhat(p builds.Plan) string {
	if p.Kind == builds.KindOn {
		return "modules standing on " + p.Base
	}
	return "modules behind their source"
}
