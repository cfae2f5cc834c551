package main

import (
	"fmt"
	"regexp"
	"strings"

	"mesh-controller/app"
	"mesh-controller/cmd/clirun"
)

// TakeCmd is take.
type TakeCmd struct {
	Node   Name   `arg:"" predictor:"node" help:"The adopted node."`
	Module Name   `arg:"" predictor:"module" help:"The module to take onto it."`
	Yes    string `placeholder:"DIGEST" help:"Cut over exactly as the preview with this digest showed (refused if what runs there changed since)."`
	JSON   bool   `name:"json" help:"Print one JSON object: the preview (and, with --yes, what was assigned)."`
}

// takeDigestRule is what a take digest looks like.
var takeDigestRule = regexp.MustCompile(`^[0-9a-f]{12,64}$`)

// Run previews, or cuts over.
func (c *TakeCmd) Run(env *Env, nd *app.Nodes) error {
	if c.Yes != "" && !takeDigestRule.MatchString(c.Yes) {
		return clirun.UsageError{Msg: fmt.Sprintf("--yes %q is not a digest: give the hex digest 'mesh-controller take %s %s' printed", c.Yes, c.Node, c.Module)}
	}
	p, taken, err := nd.Take(env.Ctx, app.TakeRequest{Node: string(c.Node), Module: string(c.Module), Yes: c.Yes})
	if err != nil {
		return err
	}
	if c.JSON {
		if taken != nil {
			return printJSON(env.Stdout, taken)
		}
		return printJSON(env.Stdout, p)
	}
	w := env.Stdout
	if taken == nil {
		fmt.Fprintf(w, "take %s %s onto %s (adopted): a preview; nothing is done yet\n", p.Module, p.Version, p.Node)
	} else {
		fmt.Fprintf(w, "took %s %s onto %s, as previewed (%s)\n", p.Module, p.Version, p.Node, p.Digest)
	}
	fmt.Fprintln(w, "ports it declares:")
	if len(p.Declared) == 0 {
		fmt.Fprintln(w, "  none")
	}
	for _, d := range p.Declared {
		held := "free"
		var on []string
		for _, s := range p.Look.Ports {
			if s.Port == d.Port {
				on = append(on, fmt.Sprintf("%s on %s %s", s.Proto, s.Address, app.HoldersSaid(s.Holders)))
			}
		}
		if len(on) > 0 {
			held = strings.Join(on, "; ")
		}
		fmt.Fprintf(w, "  %s %d: %s\n", d.Name, d.Port, held)
	}
	fmt.Fprintln(w, "data it declares:")
	if len(p.Look.Data) == 0 {
		fmt.Fprintln(w, "  none")
	}
	for _, d := range p.Look.Data {
		what := "missing: its host makes it empty"
		switch {
		case d.Dir:
			what = fmt.Sprintf("a directory, %d bytes in %d entries", d.Bytes, d.Entries)
		case d.Exists:
			what = fmt.Sprintf("a file, %d bytes", d.Bytes)
		}
		if d.Partial {
			what += " (at least: the walk stopped)"
		}
		fmt.Fprintf(w, "  %s %s: %s\n", d.Name, d.Path, what)
	}
	fmt.Fprintf(w, "of its name (%s):", p.Module)
	var named []string
	for _, u := range p.Look.Units {
		named = append(named, "unit "+u+" active")
	}
	for _, h := range p.Look.Processes {
		named = append(named, fmt.Sprintf("process pid %d (%s)", h.Pid, h.Command))
	}
	if len(named) == 0 {
		named = []string{"nothing runs"}
	}
	fmt.Fprintf(w, " %s\n", strings.Join(named, "; "))
	systemd := "not running"
	if p.Look.Systemd {
		systemd = "running"
	}
	fmt.Fprintf(w, "systemd: %s (%s)\n", systemd, p.Look.SystemdWhy)
	fmt.Fprintln(w, "the cutover:")
	for i, step := range p.Cutover {
		fmt.Fprintf(w, "  %d. %s\n", i+1, step)
	}
	fmt.Fprintf(w, "digest: %s\n", p.Digest)
	if taken == nil {
		fmt.Fprintf(w, "to cut over exactly so: mesh-controller take %s %s --yes %s\n", p.Node, p.Module, p.Digest)
		return nil
	}
	printPushed(env, taken.Assigned.Pushed)
	return nil
}
