package main

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"mesh-controller/app"
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
	fmt.Fprintf(env.Stdout, "%s %s registered from %s at %s (build %s, archive %s, %s)\n", a.Module, a.Version, a.Repository, shortCommit(a.Commit),
		a.ID, shortCommit(a.Digest), app.Plural(a.Bytes, "byte"))
	fmt.Fprintf(env.Stderr, "next: put it on a node with 'mesh-controller assign NODE %s', or roll it out with 'mesh-controller upgrade %s roll-out'\n", a.Module, a.Module)
	return nil
}

func shortCommit(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
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
			result = strings.TrimSpace(fmt.Sprintf("%s %s at %s%s %s", a.Module, a.Version, shortCommit(a.Commit),
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
