package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"

	"mesh-controller/app"
	"mesh-controller/cmd/clirun"
)

// NodeRemoveCmd is node remove.
type NodeRemoveCmd struct {
	Names       []Name `arg:"" predictor:"node" optional:"" name:"name" help:"The nodes to remove."`
	Nodes       string `placeholder:"FILE|-" help:"Read the names from a file (- for stdin), one a line; 'name token' lines as 'token issue --count --out' writes them are taken too."`
	AndUnassign bool   `name:"and-unassign" help:"First take off whatever runs there, as unassign does: precious data retired and remembered."`
	Why         string `help:"Why; recorded in the hand-act log."`
	JSON        bool   `name:"json" help:"Print one JSON object."`
}

// Run removes the nodes, all or none, and says what each left behind.
func (c *NodeRemoveCmd) Run(env *Env, nd *app.Nodes) error {
	names := names(c.Names)
	switch {
	case c.Nodes != "" && len(names) > 0:
		return clirun.UsageError{Msg: "give node names or --nodes FILE, not both"}
	case c.Nodes == "" && len(names) == 0:
		return clirun.UsageError{Msg: "give the nodes to remove, or --nodes FILE (- for stdin)"}
	case c.Nodes != "":
		var err error
		if names, err = readNodes(c.Nodes); err != nil {
			return err
		}
	}
	r, err := nd.NodeRemove(env.Ctx, app.NodeRemoveRequest{Names: names, AndUnassign: c.AndUnassign, Why: c.Why})
	if err != nil {
		// An unassign may have run before the error: say what it did.
		for _, n := range r.Nodes {
			if n.Unassigned != nil {
				printUnassigned(env, *n.Unassigned)
			}
		}
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, r)
	}
	for _, n := range r.Nodes {
		if n.Unassigned == nil && len(n.Kept) == 0 && len(n.SeatsEmptied) == 0 && len(r.Nodes) > manyLines {
			continue // a load test's nodes: the summary names them
		}
		fmt.Fprintf(env.Stdout, "node %s removed\n", n.Name)
		if n.Unassigned != nil {
			printUnassigned(env, *n.Unassigned)
			printPushed(env, n.Unassigned.Pushed)
		}
		for _, seat := range n.SeatsEmptied {
			fmt.Fprintf(env.Stdout, "  seat %s has no holder now: give it one with 'mesh-controller seat %s --to NODE/MODULE'\n", seat, seat)
		}
		for _, cl := range n.Kept {
			what := cl.Module + "/" + cl.Target
			if cl.Kind == "consumer" {
				what = fmt.Sprintf("%s's data for %s", cl.Module, cl.Target)
			}
			fmt.Fprintf(env.Stdout, "  kept on its disk: %s (%s, %s, size %s): listed by 'data' and 'cleanup' as on a removed node until 'cleanup delete'\n",
				what, cl.State, dash(cl.Precious), size(cl.Bytes))
		}
	}
	if len(r.Nodes) > manyLines {
		fmt.Fprintf(env.Stdout, "removed %d nodes\n", len(r.Nodes))
	}
	for _, d := range r.Cancelled {
		fmt.Fprintf(env.Stdout, "cancelled the deletion of %s: no host is left to carry it out; it stays listed by 'cleanup'\n", d)
	}
	switch {
	case r.Revoked == 0:
	case r.Disconnected:
		fmt.Fprintf(env.Stdout, "revoked %s; the serving controller closes their connections\n", app.Plural(r.Revoked, "broker user"))
	default:
		fmt.Fprintf(env.Stdout, "revoked %s; their connections are closed when 'mesh-controller serve' runs\n", app.Plural(r.Revoked, "broker user"))
	}
	if r.Cleared > 0 {
		fmt.Fprintf(env.Stdout, "cleared %s about them\n", app.Plural(r.Cleared, "open condition"))
	}
	return nil
}

// readNodes reads node names from a file, or from stdin for "-".
func readNodes(from string) ([]string, error) {
	var in io.Reader = os.Stdin
	if from != "-" {
		f, err := os.Open(from)
		if errors.Is(err, fs.ErrNotExist) {
			// Not files.go's usage error (exit 2): --nodes also takes -,
			// which no file check allows; the message says what to give.
			return nil, fmt.Errorf("%w: give a file of node names, or - for standard input", err)
		}
		if err != nil {
			return nil, err
		}
		defer f.Close()
		in = f
	} else {
		from = "stdin"
	}
	return app.ReadNodeNames(in, strings.TrimSpace(from))
}
