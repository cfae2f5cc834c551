package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"mesh-controller/app"
	"mesh-controller/cmd/clirun"
)

// ConvergeCmd is converge.
type ConvergeCmd struct {
	Node     Name   `arg:"" predictor:"node" help:"The node to make converged (the mesh's whole)."`
	Filter   string `enum:",nftables" default:"" help:"The packet filter the mesh is to own there: nftables (a table of its own)."`
	CloseSSH bool   `name:"close-ssh" help:"Close the SSH port its host reports too (kept open otherwise, so that no one is locked out)."`
	Yes      string `placeholder:"DIGEST" help:"Converge exactly as the preview with this digest showed (refused if it changed since)."`
	JSON     bool   `name:"json" help:"Print one JSON object: the preview (and, with --yes, what was declared)."`
}

// Run previews, or converges.
func (c *ConvergeCmd) Run(env *Env, md *app.Modules) error {
	again := "mesh-controller converge " + string(c.Node)
	if c.Filter != "" {
		again += " --filter " + c.Filter
	}
	if c.CloseSSH {
		if c.Filter == "" {
			return clirun.UsageError{Msg: app.ErrCloseSSHWithoutFilter.Error()}
		}
		again += " --close-ssh"
	}
	if c.Yes != "" && !takeDigestRule.MatchString(c.Yes) {
		return clirun.UsageError{Msg: fmt.Sprintf("--yes %q is not a digest: give the hex digest '%s' printed", c.Yes, again)}
	}
	p, done, err := md.Converge(env.Ctx, app.ConvergeRequest{Node: string(c.Node), Filter: c.Filter, CloseSSH: c.CloseSSH, Yes: c.Yes})
	if err != nil {
		return err
	}
	if c.JSON {
		if done != nil {
			return printJSON(env.Stdout, done)
		}
		return printJSON(env.Stdout, p)
	}
	w := env.Stdout
	if done == nil {
		fmt.Fprintf(w, "converge %s: a preview; nothing is done yet\n", p.Node)
	} else {
		fmt.Fprintf(w, "converged %s, as previewed (%s)\n", p.Node, p.Digest)
	}
	fmt.Fprintf(w, "now: %s, %s\n", p.Mode, filterSaid(p.Filter, p.CloseSSH))
	fmt.Fprintf(w, "to be: converged, %s\n", filterSaid(p.ToFilter, p.ToCloseSSH))
	fmt.Fprintf(w, "what runs there, as its host reported at %s:\n", p.FactsAt.Format(time.RFC3339))
	fmt.Fprintln(w, "  declared by its modules (kept):")
	lines(w, p.Kept)
	fmt.Fprintln(w, "  no module declares (not kept):")
	var unmanaged, loopback []string
	for _, l := range p.Unmanaged {
		unmanaged = append(unmanaged, listenerSaid(l))
	}
	lines(w, unmanaged)
	fmt.Fprintln(w, "  on loopback only (reachable from the machine alone; left as they are):")
	for _, l := range p.Loopback {
		loopback = append(loopback, listenerSaid(l))
	}
	lines(w, loopback)
	fmt.Fprintln(w, "  active services beside the mesh:")
	lines(w, p.Units)
	fmt.Fprintln(w, "converging will:")
	for i, d := range p.Does {
		fmt.Fprintf(w, "  %d. %s\n", i+1, d)
	}
	if p.Ruleset != "" {
		fmt.Fprintf(w, "the filter (%s), as its host will apply it:\n", p.ToFilter)
		for line := range strings.Lines(p.Ruleset) {
			fmt.Fprintf(w, "  %s", line)
		}
		if !strings.HasSuffix(p.Ruleset, "\n") {
			fmt.Fprintln(w)
		}
	}
	fmt.Fprintf(w, "digest: %s\n", p.Digest)
	if done == nil {
		fmt.Fprintf(w, "to converge exactly so: %s --yes %s\n", again, p.Digest)
		return nil
	}
	printPushed(env, []app.Pushed{done.Pushed})
	return nil
}

// filterSaid says which packet filter the mesh owns on a node.
func filterSaid(kind string, closeSSH bool) string {
	switch {
	case kind == "":
		return "no packet filter of the mesh's"
	case closeSSH:
		return "the mesh's " + kind + " filter, SSH closed"
	}
	return "the mesh's " + kind + " filter, SSH kept open"
}

// listenerSaid is one listener, as converge shows it.
func listenerSaid(l app.Listener) string {
	return fmt.Sprintf("%s at %s (%s)", l.Name, strings.Join(l.Addresses, " "), app.HeldBy(l.Commands))
}

// lines prints each line indented, or "none".
func lines(w io.Writer, ls []string) {
	if len(ls) == 0 {
		fmt.Fprintln(w, "    none")
	}
	for _, l := range ls {
		fmt.Fprintf(w, "    %s\n", l)
	}
}
