package main

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"mesh-controller/app"
	"mesh-controller/cmd/clirun"
)

// HostCmd is host: the hosts' own releases and upgrades.
type HostCmd struct {
	Release HostReleaseCmd `cmd:"" help:"mesh-host binaries the controller keeps for hosts to upgrade themselves to (add, list)."`
	Upgrade HostUpgradeCmd `cmd:"" help:"The hosts upgrading themselves: show (default), roll a release out (--to: canary, batches, health-gated, rolled back on failure), or roll the last roll-out back (rollback --why)."`
}

// HostReleaseCmd is host release.
type HostReleaseCmd struct {
	Add  HostReleaseAddCmd  `cmd:"" help:"Keep a mesh-host binary as a host release: its version read from it, packed as an archive, put in the broker's archive store (a controller must serve)."`
	List HostReleaseListCmd `cmd:"" help:"The host releases kept, newest first, with the nodes that run each and those it is declared to."`
}

// HostReleaseAddCmd is host release add.
type HostReleaseAddCmd struct {
	File string `arg:"" type:"existingfile" placeholder:"FILE" help:"The mesh-host binary (make build writes bin/mesh-host)."`
	// As is not --version: that is the binary's own flag.
	As   string `placeholder:"VERSION" help:"Its version, when it cannot say it here (built for another machine); when it can, it must say this one."`
	JSON bool   `name:"json" help:"Print the release as one JSON object."`
}

// Run keeps the release.
func (c *HostReleaseAddCmd) Run(env *Env, md *app.Modules) error {
	v, err := md.HostReleaseAdd(env.Ctx, app.HostReleaseRequest{File: c.File, Version: c.As})
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, v)
	}
	what := "added"
	if !v.Added {
		what = "kept already"
	}
	fmt.Fprintf(env.Stdout, "host release %s %s: archive %s (%s), %s/%s\n", shown(v.Version), what, v.Archive.Digest, app.Plural(v.Archive.Bytes, "byte"), v.OS, v.Arch)
	fmt.Fprintf(env.Stderr, "next: 'mesh-controller host upgrade --to %s' rolls it out, a canary host first\n", shown(v.Version))
	return nil
}

// HostReleaseListCmd is host release list.
type HostReleaseListCmd struct {
	JSON bool `name:"json" help:"Print one JSON array."`
}

// Run lists the releases.
func (c *HostReleaseListCmd) Run(env *Env, md *app.Modules) error {
	rels, err := md.HostReleases(env.Ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, rels)
	}
	if len(rels) == 0 {
		fmt.Fprintln(env.Stderr, "no host release kept yet; add one with 'mesh-controller host release add FILE'")
		return nil
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "VERSION\tFOR\tARCHIVE\tADDED\tRUN ON\tDECLARED TO")
	for _, r := range rels {
		fmt.Fprintf(tw, "%s\t%s/%s\t%.12s\t%s\t%s\t%s\n", shown(r.Version), r.OS, r.Arch, r.Archive.Digest, r.AddedAt.Format(timeShown),
			orDash(strings.Join(r.RunOn, ", ")), orDash(strings.Join(r.DeclaredTo, ", ")))
	}
	return tw.Flush()
}

// orDash is s, or - when empty.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// HostUpgradeCmd is host upgrade.
type HostUpgradeCmd struct {
	Action      string        `arg:"" optional:"" enum:"show,rollback" default:"show" help:"show (default, or with --to: roll the release out); rollback: return the hosts the last roll-out moved to the versions they ran (--why)."`
	To          string        `placeholder:"VERSION" help:"Roll this host release out: a canary host first, then batches, each waited for until its hosts run it, beat, and their modules are ready with the same pids, and through the soak; every host moved goes back past --max-failures."`
	Nodes       []string      `sep:"," placeholder:"NODE,..." help:"With --to: only these nodes (default: every joined node whose host runs another version)."`
	Canary      int           `default:"1" help:"With --to: how many hosts upgrade first, on their own."`
	Batch       string        `default:"1" help:"With --to: how many hosts upgrade together after the canary: N hosts or P% of those to upgrade."`
	Wait        time.Duration `default:"2m" help:"With --to: how long to wait for each batch's hosts to come back on the release (and a rollback's to be back)."`
	Soak        time.Duration `default:"10s" help:"With --to: how long a batch must stay up, its modules unrestarted, before the next upgrades."`
	MaxFailures int           `default:"0" help:"With --to: how many hosts may fail before the roll-out stops and every host it moved goes back."`
	Why         string        `help:"With rollback: why (required)."`
	JSON        bool          `name:"json" help:"Print the hosts and the last roll-out's state as JSON."`
	Verbose     bool          `short:"v" help:"With --to and rollback: a line a host as it goes, on a terminal too (elsewhere always so), in place of one running line."`
}

// Run shows, rolls out or rolls back.
func (c *HostUpgradeCmd) Run(env *Env, md *app.Modules) error {
	rollback := c.Action == "rollback"
	switch {
	case rollback && c.To != "":
		return clirun.UsageError{Msg: "rollback takes no --to: it returns the hosts the last roll-out moved"}
	case rollback && strings.TrimSpace(c.Why) == "":
		return clirun.UsageError{Msg: "rollback needs --why: say why the hosts go back"}
	case !rollback && c.Why != "":
		return clirun.UsageError{Msg: "--why goes with rollback"}
	case c.To == "" && len(c.Nodes) > 0:
		return clirun.UsageError{Msg: "--nodes goes with --to: say which release the nodes upgrade to"}
	}
	for _, n := range c.Nodes {
		if err := app.CheckName(n); err != nil {
			return clirun.UsageError{Msg: "--nodes: " + err.Error()}
		}
	}
	r := app.HostUpgradeRequest{To: c.To, Nodes: c.Nodes, Rollback: rollback, Why: c.Why, Canary: c.Canary, Batch: c.Batch,
		Wait: c.Wait, Soak: c.Soak, MaxFailures: c.MaxFailures}
	end := func() {}
	if !c.JSON {
		r.Progress, r.Tally, end = followRollOut(env, "mesh-host", c.Verbose)
	}
	if c.To != "" {
		if err := app.CheckRollOut(app.UpgradeRequest{Canary: c.Canary, Batch: c.Batch, Soak: c.Soak, MaxFailures: c.MaxFailures}); err != nil {
			return clirun.UsageError{Msg: err.Error()}
		}
	}
	v, err := md.HostUpgrade(env.Ctx, r)
	end()
	if c.JSON {
		if perr := printJSON(env.Stdout, v); perr != nil {
			return perr
		}
		return err
	}
	if err != nil {
		return err
	}
	switch {
	case rollback:
		fmt.Fprintf(env.Stdout, "the roll-out of mesh-host %s was rolled back\n", shown(v.RollOut.To))
	case c.To != "" && !v.Started:
		fmt.Fprintf(env.Stdout, "every host named runs mesh-host %s; nothing to do\n", shown(c.To))
	case c.To != "":
		ready, failed := 0, []string{}
		for _, n := range v.RollOut.Nodes {
			switch n.Result {
			case "ready":
				ready++
			case "failed":
				failed = append(failed, n.Node)
			}
		}
		fmt.Fprintf(env.Stdout, "mesh-host %s rolled out to %s of %d\n", shown(c.To), app.Plural(ready, "host"), len(v.RollOut.Nodes))
		if len(failed) > 0 {
			fmt.Fprintf(env.Stdout, "failed, within --max-failures (declared %s, and refusing it until it changes; 'mesh-controller host upgrade rollback --why ...' returns every host moved): %s\n",
				shown(c.To), strings.Join(failed, ", "))
		}
	default:
		showHosts(env, v)
	}
	return nil
}

// showHosts says what each host runs and is declared, and the last host
// roll-out node by node.
func showHosts(env *Env, v app.HostUpgradeView) {
	tw := tabwriter.NewWriter(env.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tRUNS\tDECLARED")
	for _, n := range v.Nodes {
		runs := shown(n.Runs)
		if !n.Joined {
			runs = "(not joined)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", n.Node, orDash(runs), orDash(shown(n.Declared)))
	}
	tw.Flush()
	if v.RollOut != nil {
		showRollOut(env, v.RollOut)
	}
	if len(v.Nodes) > 0 && v.RollOut == nil {
		fmt.Fprintln(env.Stderr, "a host upgrade rolls a host release out, a canary host first: 'mesh-controller host upgrade --to VERSION' ('mesh-controller host release list' shows those kept)")
	}
}
