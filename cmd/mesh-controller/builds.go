package main

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"mesh-controller/app"
	"mesh-controller/cmd/clirun"
	"mesh-controller/contexts/builds"
)

// BuildCmd groups the build commands; alone (build REPOSITORY, build
// --behind, build --on MODULE) it builds.
type BuildCmd struct {
	Run     BuildRunCmd     `cmd:"" default:"withargs" hidden:"" help:"Have a holder of the build seat build a repository (or --behind, --on: a plan); wait for the outcome and register what it built."`
	List    BuildsCmd       `cmd:"" help:"What has been built lately, and what came of it."`
	Queue   QueueCmd        `cmd:"" help:"Every ask in the build queue: waiting, in flight (where, for how long), dead."`
	Cancel  CancelCmd       `cmd:"" help:"Drop a waiting or dead build ask (a hand act: --why)."`
	Clear   ClearCmd        `cmd:"" help:"Cancel every waiting build ask (--dead: and the dead); never one in flight (a hand act: --why)."`
	Rebuild RebuildCmd      `cmd:"" help:"Ask a module's source again, or a build's repository and ref, under a new id."`
	Replay  ReplayCmd       `cmd:"" help:"Build a build's commit again: a dry run, or --register (--older) it (a hand act)."`
	Kill    KillCmd         `cmd:"" help:"End a build where it runs; recorded killed by hand (--why)."`
	Pause   PauseCmd        `cmd:"" help:"The build seat's holder on a node (or every holder) takes nothing new (a hand act: --why)."`
	Resume  ResumeCmd       `cmd:"" help:"A paused builder (or every one) takes asks again."`
	Plans   PlansCmd        `cmd:"" help:"Build plans and their steps (retry, stop, close)."`
	Issue   BuilderIssueCmd `cmd:"" help:"A broker user for a build machine on a node, scoped to build work; prints a .creds document."`
}

// BuildRunCmd is build REPOSITORY (and --behind, --on).
type BuildRunCmd struct {
	Repository string `arg:"" optional:"" help:"The module's source: a git repository URL or path, with mesh.json at its root (never a credential in it: a private repository's goes to the builder, as its git-credentials secret)."`
	Ref        string `help:"A branch, tag or commit (default: the repository's default branch)."`
	Behind     bool   `help:"Build every module the mesh holds older than its source ('module moved'), bases first: a build plan."`
	On         string `placeholder:"MODULE" help:"Rebuild every module that stands on this one, bases first: a build plan."`
	NoWait     bool   `help:"Queue the ask (or make the plan) and return; 'mesh-controller build list' and 'mesh-controller build plans' show what came of it."`
}

// Run queues the ask and follows it, or makes a plan and follows that.
func (c *BuildRunCmd) Run(env *Env, bld *app.Builds) error {
	switch n := countTrue(c.Repository != "", c.Behind, c.On != ""); {
	case n != 1:
		return clirun.UsageError{Msg: "give a repository, --behind, or --on MODULE: one of them"}
	case c.Ref != "" && c.Repository == "":
		return clirun.UsageError{Msg: "--ref goes with a repository: a plan builds each module at the commit it says"}
	}
	progress := func(line string) { fmt.Fprintln(env.Stderr, line) }
	if c.Repository == "" {
		p, err := bld.BuildPlan(env.Ctx, app.PlanRequest{Behind: c.Behind, On: c.On, NoWait: c.NoWait, Progress: progress})
		if err != nil {
			return err
		}
		switch {
		case len(p.Steps) == 0 && c.Behind:
			fmt.Fprintln(env.Stdout, "every module is as new as its source: nothing to build ('mesh-controller module moved MODULE COMMIT' records that a source moved)")
		case len(p.Steps) == 0:
			fmt.Fprintf(env.Stdout, "no module stands on %s: nothing to build\n", c.On)
		case c.NoWait:
			fmt.Fprintf(env.Stdout, "plan %s made: %s\n", p.ID, app.Plural(len(p.Steps), "build"))
			fmt.Fprintln(env.Stderr, "a serving controller asks for each build once its bases are built; see 'mesh-controller build plans'")
		default:
			var superseded []string
			for _, st := range p.Steps {
				if strings.HasPrefix(st.Why, "superseded: ") {
					superseded = append(superseded, st.Module+" ("+st.Why+")")
				}
			}
			registered := len(p.Steps) - len(superseded)
			if len(superseded) == 0 {
				fmt.Fprintf(env.Stdout, "plan %s done: %s built and registered\n", p.ID, app.Plural(registered, "module"))
			} else {
				// A superseded step was built and not registered: said so.
				fmt.Fprintf(env.Stdout, "plan %s done: %s built and registered, %d built and not registered: %s\n", p.ID,
					app.Plural(registered, "module"), len(superseded), strings.Join(superseded, "; "))
			}
			fmt.Fprintln(env.Stderr, "next: send the new versions with 'mesh-controller upgrade MODULE roll-out', or rebuilt archives with 'mesh-controller push --behind'")
		}
		return nil
	}
	a, err := bld.Build(env.Ctx, app.BuildRequest{Repository: c.Repository, Ref: c.Ref, NoWait: c.NoWait, Progress: progress})
	if err != nil {
		return err
	}
	if c.NoWait {
		fmt.Fprintf(env.Stdout, "%s queued\n", a.ID)
		fmt.Fprintf(env.Stderr, "a serving controller asks a builder for it; see 'mesh-controller build queue' and 'mesh-controller build list'\n")
		return nil
	}
	fmt.Fprintf(env.Stdout, "%s %s registered from %s at %s (build %s, archive %s, %s)\n", a.Module, a.Version, a.Repository, app.ShortID(a.Commit),
		a.ID, app.ShortID(a.Digest), app.Plural(a.Bytes, "byte"))
	fmt.Fprintf(env.Stderr, "next: put it on a node with 'mesh-controller assign NODE %s', or roll it out with 'mesh-controller upgrade %s roll-out'\n", a.Module, a.Module)
	return nil
}

// countTrue counts the true ones.
func countTrue(bs ...bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

// PlansCmd is build plans.
type PlansCmd struct {
	List  PlansListCmd  `cmd:"" default:"withargs" hidden:"" help:"Build plans and their steps."`
	Retry PlansRetryCmd `cmd:"" help:"Ask a failed plan's failed builds again and carry the plan on."`
	Stop  PlansStopCmd  `cmd:"" help:"End a running plan by hand (a hand act: --why)."`
	Close PlansCloseCmd `cmd:"" help:"End a failed plan by hand, not to be retried (a hand act: --why)."`
}

// PlansListCmd is build plans.
type PlansListCmd struct {
	JSON bool `name:"json" help:"Print one JSON array."`
}

// Run lists the running and failed plans, then the latest ended.
func (c *PlansListCmd) Run(env *Env, bld *app.Builds) error {
	ps, err := bld.BuildPlans(env.Ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, ps)
	}
	if len(ps) == 0 {
		fmt.Fprintln(env.Stderr, "no build plans: 'mesh-controller build --behind' or 'mesh-controller build --on MODULE' makes one")
		return nil
	}
	for _, p := range ps {
		printPlan(env, p)
	}
	return nil
}

// printPlan prints a plan's line and one line per step.
func printPlan(env *Env, p builds.Plan) {
	line := fmt.Sprintf("%s  %s  %s, made %s", p.ID, p.State, app.PlanWhat(p), p.MadeAt.Format(timeShown))
	if p.Why != "" {
		line += ": " + p.Why
	}
	fmt.Fprintln(env.Stdout, line)
	for _, s := range p.Steps {
		fmt.Fprintln(env.Stdout, app.StepLine(s))
	}
}

// PlansRetryCmd is build plans retry.
type PlansRetryCmd struct {
	ID string `arg:"" help:"The plan's id (p-…)."`
}

// Run asks the failed builds again.
func (c *PlansRetryCmd) Run(env *Env, bld *app.Builds) error {
	p, err := bld.PlanRetry(env.Ctx, c.ID)
	if err != nil {
		return err
	}
	printPlan(env, p)
	fmt.Fprintf(env.Stderr, "a serving controller asks for each build; follow it with 'mesh-controller build plans'\n")
	return nil
}

// PlansStopCmd is build plans stop.
type PlansStopCmd struct {
	ID  string `arg:"" help:"The plan's id (p-…)."`
	Why string `required:"" help:"Why, for the hand-act log."`
}

// Run ends a running plan.
func (c *PlansStopCmd) Run(env *Env, bld *app.Builds) error {
	p, inFlight, err := bld.PlanStop(env.Ctx, c.ID, c.Why)
	if err != nil {
		return err
	}
	printPlan(env, p)
	for _, id := range inFlight {
		fmt.Fprintf(env.Stderr, "%s was in flight: it is taken in when it ends ('mesh-controller build kill %s --why ...' ends it now)\n", id, id)
	}
	return nil
}

// PlansCloseCmd is build plans close.
type PlansCloseCmd struct {
	ID  string `arg:"" help:"The plan's id (p-…)."`
	Why string `required:"" help:"Why, for the hand-act log."`
}

// Run ends a failed plan.
func (c *PlansCloseCmd) Run(env *Env, bld *app.Builds) error {
	p, err := bld.PlanClose(env.Ctx, c.ID, c.Why)
	if err != nil {
		return err
	}
	printPlan(env, p)
	return nil
}

// CollectionCmd is collection.
type CollectionCmd struct {
	JSON bool `name:"json" help:"Print one JSON object."`
}

// Run lists the kept archives and what the sweep may let go.
func (c *CollectionCmd) Run(env *Env, md *app.Modules) error {
	col, err := md.Collection(env.Ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, col)
	}
	if len(col.Archives) == 0 && len(col.Leftovers) == 0 {
		fmt.Fprintln(env.Stderr, "no archives are kept: a build keeps one")
		return nil
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ARCHIVE\tBYTES\tSTORED\tHELD BY\tRUN ON\tSWEEP")
	for _, k := range col.Archives {
		sweep := "kept: " + k.Why
		if k.MayGo {
			sweep = "may go: " + k.Why
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", app.ShortID(k.Digest), k.Bytes, k.StoredAt.Format(timeShown),
			dash(strings.Join(k.Held, " ")), dash(strings.Join(k.RunOn, " ")), sweep)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, l := range col.Leftovers {
		fmt.Fprintf(env.Stdout, "leftover of a put that never ended: %s, %s, last %s%s\n", l.Subject, app.Plural(int(l.Chunks), "chunk"),
			l.LastAt.Format(timeShown), map[bool]string{true: ": may go", false: ""}[l.MayGo])
	}
	fmt.Fprintf(env.Stdout, "%s kept, %s may go (unheld, run nowhere, older than %s, never a current or previous version); serve sweeps once a day\n",
		app.Plural(col.Bytes, "byte"), app.Plural(col.MayGoBytes, "byte"), time.Duration(col.CollectAfterHours*float64(time.Hour)))
	return nil
}

// BuildsCmd is build list.
type BuildsCmd struct {
	Module Name `arg:"" predictor:"module" optional:"" help:"Only this module's builds."`
	JSON   bool `name:"json" help:"Print one JSON array."`
}

// Run lists the latest builds, newest first.
func (c *BuildsCmd) Run(env *Env, bld *app.Builds) error {
	as, err := bld.BuildsList(env.Ctx, string(c.Module))
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, nonNil(as))
	}
	return printAsks(env, as, "no builds yet: 'mesh-controller build REPOSITORY' asks for one")
}

// QueueCmd is build queue.
type QueueCmd struct {
	JSON bool `name:"json" help:"Print one JSON array."`
}

// Run lists the asks waiting, in flight and dead.
func (c *QueueCmd) Run(env *Env, bld *app.Builds) error {
	as, err := bld.BuildQueue(env.Ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, nonNil(as))
	}
	return printAsks(env, as, "the build queue is empty")
}

func nonNil(as []builds.Ask) []builds.Ask {
	if as == nil {
		return []builds.Ask{}
	}
	return as
}

// printAsks prints one line per ask: id, state, where and since when, what
// it built or why not.
func printAsks(env *Env, as []builds.Ask, none string) error {
	if len(as) == 0 {
		fmt.Fprintln(env.Stderr, none)
		return nil
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tREPOSITORY\tREF\tBUILDER\tASKED\tRESULT")
	for _, a := range as {
		result := a.Why
		if a.Version != "" {
			result = strings.TrimSpace(fmt.Sprintf("%s %s at %s%s %s", a.Module, a.Version, app.ShortID(a.Commit),
				map[bool]string{true: ", registered", false: ""}[a.Registered], a.Why))
		}
		builder := a.Builder
		if a.State == builds.InFlight && a.TakenAt != nil {
			builder += fmt.Sprintf(" (for %s)", time.Since(*a.TakenAt).Round(time.Second))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.ID, a.State, a.Repository, dash(a.Ref), dash(builder), a.AskedAt.Format(timeShown), dash(result))
	}
	return tw.Flush()
}

// CancelCmd is build cancel.
type CancelCmd struct {
	ID  string `arg:"" help:"The build's id (b-…)."`
	Why string `required:"" help:"Why, for the hand-act log."`
}

// Run cancels a waiting or dead ask.
func (c *CancelCmd) Run(env *Env, bld *app.Builds) error {
	a, err := bld.BuildCancel(env.Ctx, c.ID, c.Why)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "%s cancelled (%s)\n", a.ID, a.Repository)
	return nil
}

// ClearCmd is build clear.
type ClearCmd struct {
	Dead bool   `help:"Cancel the dead asks too."`
	Why  string `required:"" help:"Why, for the hand-act log."`
}

// Run cancels every waiting ask (and the dead).
func (c *ClearCmd) Run(env *Env, bld *app.Builds) error {
	n, err := bld.BuildClear(env.Ctx, c.Dead, c.Why)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "%s cancelled; none in flight is touched\n", app.Plural(n, "ask"))
	return nil
}

// RebuildCmd is build rebuild.
type RebuildCmd struct {
	Target string `arg:"" help:"A module (its source is asked again) or a build's id (its repository and ref)."`
	NoWait bool   `help:"Queue the ask and return."`
}

// Run asks again and follows the ask as build does.
func (c *RebuildCmd) Run(env *Env, bld *app.Builds) error {
	a, err := bld.Rebuild(env.Ctx, c.Target, app.BuildRequest{NoWait: c.NoWait, Progress: func(line string) { fmt.Fprintln(env.Stderr, line) }})
	if err != nil {
		return err
	}
	if c.NoWait {
		fmt.Fprintf(env.Stdout, "%s queued\n", a.ID)
		return nil
	}
	fmt.Fprintf(env.Stdout, "%s %s registered from %s at %s (build %s)\n", a.Module, a.Version, a.Repository, app.ShortID(a.Commit), a.ID)
	return nil
}

// KillCmd is build kill.
type KillCmd struct {
	ID  string `arg:"" help:"The build in flight (b-…)."`
	Why string `required:"" help:"Why, for the hand-act log."`
}

// Run ends the build where it runs.
func (c *KillCmd) Run(env *Env, bld *app.Builds) error {
	a, told, err := bld.BuildKill(env.Ctx, c.ID, c.Why)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "%s killed (it ran on %s)\n", a.ID, a.Builder)
	if !told {
		fmt.Fprintf(env.Stderr, "its builder could not be told now (no controller serving): its outcome, if it comes, is refused as ended\n")
	}
	return nil
}

// PauseCmd is build pause.
type PauseCmd struct {
	Node Name   `arg:"" predictor:"node" optional:"" help:"The node whose builder takes nothing new; every builder if none."`
	Why  string `required:"" help:"Why, for the hand-act log."`
}

// Run pauses.
func (c *PauseCmd) Run(env *Env, bld *app.Builds) error {
	p, added, err := bld.BuildPause(env.Ctx, string(c.Node), c.Why)
	if err != nil {
		return err
	}
	who := "every builder"
	if c.Node != "" {
		who = "the builder on " + string(c.Node)
	}
	if !added {
		fmt.Fprintf(env.Stdout, "%s was paused already (since %s: %s)\n", who, p.Since.Format(timeShown), p.Why)
		return nil
	}
	fmt.Fprintf(env.Stdout, "%s takes nothing new; a build in flight goes on\n", who)
	fmt.Fprintf(env.Stderr, "undo with 'mesh-controller build resume%s'\n", map[bool]string{true: " " + string(c.Node), false: ""}[c.Node != ""])
	return nil
}

// ResumeCmd is build resume.
type ResumeCmd struct {
	Node Name `arg:"" predictor:"node" optional:"" help:"The node whose builder takes asks again; every builder if none."`
}

// Run resumes.
func (c *ResumeCmd) Run(env *Env, bld *app.Builds) error {
	ps, err := bld.BuildResume(env.Ctx, string(c.Node))
	if err != nil {
		return err
	}
	for _, p := range ps {
		who := "every builder"
		if p.Holder != builds.Every {
			who = "the builder on " + p.Holder
		}
		fmt.Fprintf(env.Stdout, "%s takes asks again (paused since %s)\n", who, p.Since.Format(timeShown))
	}
	return nil
}

// BuilderCmd is builder, the former group of build issue.
type BuilderCmd struct {
	Issue BuilderIssueCmd `cmd:"" help:"The former spelling of build issue."`
}

// BuilderIssueCmd is build issue.
type BuilderIssueCmd struct {
	Node Name `arg:"" predictor:"node" help:"The node the build machine is."`
}

// Run prints the .creds document.
func (c *BuilderIssueCmd) Run(env *Env, bld *app.Builds) error {
	creds, err := bld.BuilderIssue(env.Ctx, string(c.Node))
	if err != nil {
		return err
	}
	fmt.Fprint(env.Stdout, creds)
	fmt.Fprintf(env.Stderr, "a builder's broker user on %s: it holds a private key, keep it as a secret (0600); run 'mesh-builder --creds FILE --node %s' with it\n", c.Node, c.Node)
	return nil
}

// ReplayCmd is build replay.
type ReplayCmd struct {
	ID       string `arg:"" help:"The build whose commit is built again (b-…)."`
	Register bool   `help:"Register what it builds (a hand act: --why); without it, a dry run, looked at and never taken in."`
	Older    bool   `help:"With --register: allow a version older than the module's current one."`
	Why      string `help:"Why, for the hand-act log (with --register)."`
	NoWait   bool   `help:"Queue the ask and return."`
}

// Run builds the commit again.
func (c *ReplayCmd) Run(env *Env, bld *app.Builds) error {
	if c.Older && !c.Register {
		return clirun.UsageError{Msg: "--older goes with --register"}
	}
	if c.Register && c.Why == "" {
		return clirun.UsageError{Msg: "--register is a hand act: add --why"}
	}
	a, err := bld.Replay(env.Ctx, c.ID, c.Register, c.Older, c.Why, app.BuildRequest{NoWait: c.NoWait,
		Progress: func(line string) { fmt.Fprintln(env.Stderr, line) }})
	if err != nil {
		return err
	}
	switch {
	case c.NoWait:
		fmt.Fprintf(env.Stdout, "%s queued (%s)\n", a.ID, map[bool]string{true: "to register", false: "a dry run"}[c.Register])
	case a.DryRun:
		fmt.Fprintf(env.Stdout, "%s: a dry run of %s at %s built %s %s (archive %s, %s); looked at, not registered\n", a.ID, a.Repository,
			app.ShortID(a.Commit), a.Module, a.Version, app.ShortID(a.Digest), app.Plural(a.Bytes, "byte"))
	default:
		fmt.Fprintf(env.Stdout, "%s %s registered from %s at %s (build %s)\n", a.Module, a.Version, a.Repository, app.ShortID(a.Commit), a.ID)
	}
	return nil
}
