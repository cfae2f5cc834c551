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

// BuildCmd is build.
type BuildCmd struct {
	Repository string `arg:"" help:"The module's source: a git repository URL or path, with mesh.json at its root."`
	Ref        string `help:"A branch, tag or commit (default: the repository's default branch)."`
	NoWait     bool   `help:"Queue the ask and return; 'mesh-controller builds' shows what came of it."`
}

// Run queues the ask and follows it.
func (c *BuildCmd) Run(env *Env) error {
	a, err := env.App.Build(env.Ctx, app.BuildRequest{Repository: c.Repository, Ref: c.Ref, NoWait: c.NoWait,
		Progress: func(line string) { fmt.Fprintln(env.Stderr, line) }})
	if err != nil {
		return err
	}
	if c.NoWait {
		fmt.Fprintf(env.Stdout, "%s queued\n", a.ID)
		fmt.Fprintf(env.Stderr, "a serving controller asks a builder for it; see 'mesh-controller queue' and 'mesh-controller builds'\n")
		return nil
	}
	fmt.Fprintf(env.Stdout, "%s %s registered from %s at %s (build %s, archive %s, %s)\n", a.Module, a.Version, a.Repository, app.ShortID(a.Commit),
		a.ID, app.ShortID(a.Digest), app.Plural(a.Bytes, "byte"))
	fmt.Fprintf(env.Stderr, "next: put it on a node with 'mesh-controller assign NODE %s', or roll it out with 'mesh-controller upgrade %s roll-out'\n", a.Module, a.Module)
	return nil
}

// BuildsCmd is builds.
type BuildsCmd struct {
	Module Name `arg:"" optional:"" help:"Only this module's builds."`
	JSON   bool `name:"json" help:"Print one JSON array."`
}

// Run lists the latest builds, newest first.
func (c *BuildsCmd) Run(env *Env) error {
	as, err := env.App.BuildsList(env.Ctx, string(c.Module))
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, nonNil(as))
	}
	return printAsks(env, as, "no builds yet: 'mesh-controller build REPOSITORY' asks for one")
}

// QueueCmd is queue.
type QueueCmd struct {
	JSON bool `name:"json" help:"Print one JSON array."`
}

// Run lists the asks waiting, in flight and dead.
func (c *QueueCmd) Run(env *Env) error {
	as, err := env.App.BuildQueue(env.Ctx)
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

// CancelCmd is cancel.
type CancelCmd struct {
	ID  string `arg:"" help:"The build's id (b-…)."`
	Why string `required:"" help:"Why, for the hand-act log."`
}

// Run cancels a waiting or dead ask.
func (c *CancelCmd) Run(env *Env) error {
	a, err := env.App.BuildCancel(env.Ctx, c.ID, c.Why)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "%s cancelled (%s)\n", a.ID, a.Repository)
	return nil
}

// ClearCmd is clear.
type ClearCmd struct {
	Dead bool   `help:"Cancel the dead asks too."`
	Why  string `required:"" help:"Why, for the hand-act log."`
}

// Run cancels every waiting ask (and the dead).
func (c *ClearCmd) Run(env *Env) error {
	n, err := env.App.BuildClear(env.Ctx, c.Dead, c.Why)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "%s cancelled; none in flight is touched\n", app.Plural(n, "ask"))
	return nil
}

// RebuildCmd is rebuild.
type RebuildCmd struct {
	Target string `arg:"" help:"A module (its source is asked again) or a build's id (its repository and ref)."`
	NoWait bool   `help:"Queue the ask and return."`
}

// Run asks again and follows the ask as build does.
func (c *RebuildCmd) Run(env *Env) error {
	a, err := env.App.Rebuild(env.Ctx, c.Target, app.BuildRequest{NoWait: c.NoWait, Progress: func(line string) { fmt.Fprintln(env.Stderr, line) }})
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

// KillCmd is kill.
type KillCmd struct {
	ID  string `arg:"" help:"The build in flight (b-…)."`
	Why string `required:"" help:"Why, for the hand-act log."`
}

// Run ends the build where it runs.
func (c *KillCmd) Run(env *Env) error {
	a, told, err := env.App.BuildKill(env.Ctx, c.ID, c.Why)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "%s killed (it ran on %s)\n", a.ID, a.Builder)
	if !told {
		fmt.Fprintf(env.Stderr, "its builder could not be told now (no controller serving): its outcome, if it comes, is refused as ended\n")
	}
	return nil
}

// PauseCmd is pause.
type PauseCmd struct {
	Node Name   `arg:"" optional:"" help:"The node whose builder takes nothing new; every builder if none."`
	Why  string `required:"" help:"Why, for the hand-act log."`
}

// Run pauses.
func (c *PauseCmd) Run(env *Env) error {
	p, added, err := env.App.BuildPause(env.Ctx, string(c.Node), c.Why)
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
	fmt.Fprintf(env.Stderr, "undo with 'mesh-controller resume%s'\n", map[bool]string{true: " " + string(c.Node), false: ""}[c.Node != ""])
	return nil
}

// ResumeCmd is resume.
type ResumeCmd struct {
	Node Name `arg:"" optional:"" help:"The node whose builder takes asks again; every builder if none."`
}

// Run resumes.
func (c *ResumeCmd) Run(env *Env) error {
	ps, err := env.App.BuildResume(env.Ctx, string(c.Node))
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

// BuilderCmd groups builder commands.
type BuilderCmd struct {
	Issue BuilderIssueCmd `cmd:"" help:"A broker user for a build machine on a node, scoped to build work; prints a .creds document."`
}

// BuilderIssueCmd is builder issue.
type BuilderIssueCmd struct {
	Node Name `arg:"" help:"The node the build machine is."`
}

// Run prints the .creds document.
func (c *BuilderIssueCmd) Run(env *Env) error {
	creds, err := env.App.BuilderIssue(env.Ctx, string(c.Node))
	if err != nil {
		return err
	}
	fmt.Fprint(env.Stdout, creds)
	fmt.Fprintf(env.Stderr, "a builder's broker user on %s: it holds a private key, keep it as a secret (0600); run 'mesh-builder --creds FILE --node %s' with it\n", c.Node, c.Node)
	return nil
}

// ReplayCmd is replay.
type ReplayCmd struct {
	ID       string `arg:"" help:"The build whose commit is built again (b-…)."`
	Register bool   `help:"Register what it builds (a hand act: --why); without it, a dry run, looked at and never taken in."`
	Older    bool   `help:"With --register: allow a version older than the module's current one."`
	Why      string `help:"Why, for the hand-act log (with --register)."`
	NoWait   bool   `help:"Queue the ask and return."`
}

// Run builds the commit again.
func (c *ReplayCmd) Run(env *Env) error {
	if c.Older && !c.Register {
		return clirun.UsageError{Msg: "--older goes with --register"}
	}
	if c.Register && c.Why == "" {
		return clirun.UsageError{Msg: "--register is a hand act: add --why"}
	}
	a, err := env.App.Replay(env.Ctx, c.ID, c.Register, c.Older, c.Why, app.BuildRequest{NoWait: c.NoWait,
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
