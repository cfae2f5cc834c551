package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"mesh-controller/app"
	"mesh-controller/contexts/health"
)

// NodeCmd groups node commands.
type NodeCmd struct {
	Add  NodeAddCmd  `cmd:"" help:"Create a node record (converged unless --adopted)."`
	List NodeListCmd `cmd:"" help:"Every node: mode, joined or not, last heard."`
	Show NodeShowCmd `cmd:"" help:"One node whole."`
	// Remove decommissions nodes (noderemove.go).
	Remove NodeRemoveCmd `cmd:"" help:"Decommission nodes, all or none: revoke their broker users; what they keep on disk stays listed until cleaned up."`
	// PublicDomain and Networks say what a node routes (routing.go).
	PublicDomain NodePublicDomainCmd `cmd:"" name:"public-domain" help:"Show, set or clear the domain a node's public ports are routed under."`
	Networks     NodeNetworksCmd     `cmd:"" help:"Show, set or clear the networks a node routes for what it hosts; its filter forwards them."`
}

// NodeAddCmd is node add.
type NodeAddCmd struct {
	Name    Name `arg:"" help:"The node's name: [a-z][a-z0-9-]{0,62}."`
	Adopted bool `help:"The machine is already in use: the mesh runs its modules beside what is there and touches nothing else."`
}

// Run records the node.
func (c *NodeAddCmd) Run(env *Env, nd *app.Nodes) error {
	n, err := nd.NodeAdd(env.Ctx, string(c.Name), c.Adopted)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "node %s added (%s)\n", n.Name, n.Mode)
	fmt.Fprintf(env.Stderr, "next: give it a join token with 'mesh-controller token issue --node %s'\n", n.Name)
	return nil
}

// NodeListCmd is node list.
type NodeListCmd struct {
	JSON bool `name:"json" help:"Print one JSON array."`
}

// Run lists every node.
func (c *NodeListCmd) Run(env *Env, nd *app.Nodes) error {
	nodes, err := nd.NodeList(env.Ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		return app.WriteNodesJSON(env.Stdout, nodes)
	}
	if len(nodes) == 0 {
		fmt.Fprintln(env.Stderr, "no nodes yet; add one with 'mesh-controller node add NAME'")
		return nil
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tMODE\tJOINED\tLAST HEARD\tDECLARED\tAPPLIED\tHOST")
	for _, n := range nodes {
		state := applyState(n)
		if a := n.Applying; a != nil {
			state += fmt.Sprintf(", applying %d", a.Serial)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, n.Mode, yesNo(n.Joined), when(n.LastHeard), serial(n.SerialDeclared), state, hostShown(n))
	}
	return tw.Flush()
}

// NodeShowCmd is node show.
type NodeShowCmd struct {
	Name Name `arg:"" predictor:"node" help:"The node."`
	JSON bool `name:"json" help:"Print one JSON object."`
}

// Run shows one node.
func (c *NodeShowCmd) Run(env *Env, nd *app.Nodes) error {
	n, err := nd.NodeShow(env.Ctx, string(c.Name))
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, n)
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "name\t%s\n", n.Name)
	fmt.Fprintf(tw, "mode\t%s\n", n.Mode)
	fmt.Fprintf(tw, "recorded\t%s\n", n.CreatedAt.Format(timeShown))
	fmt.Fprintf(tw, "joined\t%s\n", when(n.JoinedAt))
	fmt.Fprintf(tw, "last heard\t%s\n", when(n.LastHeard))
	fmt.Fprintf(tw, "host\t%s\n", hostShown(n.NodeView))
	fmt.Fprintf(tw, "join token\t%s\n", tokenLine(n.Token))
	fmt.Fprintf(tw, "declared\t%s\n", serial(n.SerialDeclared))
	fmt.Fprintf(tw, "applied\t%s\n", applyState(n.NodeView))
	if a := n.Applying; a != nil {
		fmt.Fprintf(tw, "applying\t%s\n", applyingLine(*a))
	}
	fmt.Fprintf(tw, "public domain\t%s\n", orNone(n.PublicDomain))
	fmt.Fprintf(tw, "networks\t%s\n", orNone(strings.Join(n.Networks, ", ")))
	if a := n.LastApply; a != nil && !a.OK {
		fmt.Fprintf(tw, "last apply\tfailed at %s: %s\n", a.At.Format(timeShown), a.Error)
	}
	for _, d := range n.Dropped {
		fmt.Fprintf(tw, "dropped\t%s claiming to be from %s: %s (last %s)\n", app.Plural(d.Count, "message"), d.Node, d.Reason, d.LastAt.Format(timeShown))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(n.Facts) > 0 {
		fmt.Fprintln(env.Stdout, "\nfacts:")
		tw = tabwriter.NewWriter(env.Stdout, 0, 0, 2, ' ', 0)
		for _, f := range n.Facts {
			fmt.Fprintf(tw, "  %s\t%s\t(%s)\n", f.Name, f.Value, f.Why)
		}
		tw.Flush()
	}
	if len(n.Found) > 0 {
		fmt.Fprintln(env.Stdout, "\nfound beside the mesh:")
		for _, f := range n.Found {
			fmt.Fprintf(env.Stdout, "  %s %s: %s\n", f.Kind, f.Name, f.Detail)
		}
	}
	if len(n.Modules) > 0 {
		fmt.Fprintln(env.Stdout, "\nmodules:")
		printModuleStates(env.Stdout, n.Modules, "  ")
	}
	if len(n.Data) > 0 {
		fmt.Fprintln(env.Stdout, "\ndata:")
		tw = tabwriter.NewWriter(env.Stdout, 0, 0, 2, ' ', 0)
		for _, d := range n.Data {
			fmt.Fprintf(tw, "  %s/%s\t%s\t%s\t%s\n", d.Module, d.Name, d.Path, app.Plural(d.Bytes, "byte"), d.Precious)
		}
		tw.Flush()
	}
	return nil
}

func serial(s int64) string {
	if s == 0 {
		return "none"
	}
	return fmt.Sprint(s)
}

// applyState says how a node stands against its latest declaration.
func applyState(n app.NodeView) string {
	switch {
	case n.SerialDeclared == 0 && n.SerialApplied == 0:
		return "-"
	case !n.Behind:
		return fmt.Sprintf("%d (current)", n.SerialApplied)
	case n.SerialApplied >= n.SerialDeclared:
		// Applied what it was sent, yet behind: its plan moved, or an
		// upgrade is recorded for it and not sent.
		return fmt.Sprintf("%d (behind: %s)", n.SerialApplied, n.BehindWhy)
	case n.LastApply != nil && !n.LastApply.OK && n.LastApply.Serial > n.SerialApplied:
		return fmt.Sprintf("%s (behind; %d failed)", serial(n.SerialApplied), n.LastApply.Serial)
	}
	return fmt.Sprintf("%s (behind)", serial(n.SerialApplied))
}

// applyingLine says which declaration a node's host is applying, since
// when (its host's clock) and in which phase, as its last beat said.
func applyingLine(a app.ApplyingView) string {
	s := fmt.Sprintf("%d since %s", a.Serial, a.Since.UTC().Format(timeShown))
	if a.Phase != "" {
		s += " (" + shown(a.Phase) + ")" // the host's word
	}
	return s
}

func tokenLine(t *app.TokenView) string {
	if t == nil {
		return "none issued"
	}
	s := fmt.Sprintf("%s (issued %s, expires %s", t.State, t.IssuedAt.Format(timeShown), t.ExpiresAt.Format(timeShown))
	if t.UsedAt != nil {
		s += ", used " + t.UsedAt.Format(timeShown)
	}
	return s + ")"
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func when(t *time.Time) string {
	if t == nil {
		return "never"
	}
	return t.Format(timeShown)
}

// printModuleStates prints one line per module: its version and state, and
// how long it has been so; what it waits for or why it failed; for a module
// that fails or loops, its last exit and the tail of its log.
func printModuleStates(w io.Writer, ms []health.ModuleState, indent string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, m := range ms {
		line := fmt.Sprintf("%s%s\t%s\t%s", indent, m.Module, m.Version, m.State)
		if m.State != app.StateUnreported {
			line += " since " + m.Since.Format(timeShown)
		}
		if m.Pid > 0 {
			line += fmt.Sprintf(", pid %d", m.Pid)
		}
		if m.Restarts1h > 0 {
			line += ", " + app.Plural(m.Restarts1h, "restart") + " in the last hour"
		}
		if m.LastExit != "" && m.State != "ready" {
			line += ", last exit: " + m.LastExit
		}
		if m.Detail != "" {
			line += " (" + m.Detail + ")"
		}
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
	for _, m := range ms {
		if len(m.LogTail) == 0 {
			continue
		}
		fmt.Fprintf(w, "%slast lines of the log of %s:\n", indent, m.Module)
		for _, l := range m.LogTail {
			fmt.Fprintf(w, "%s  | %s\n", indent, l)
		}
	}
}

// hostShown is what a node's host runs: its build, the protocol it was
// last heard speaking, and the release declared to it when that is
// another: "v0.3.0 (protocol 1.1)", "v0.3.0 (protocol 1.1, declared
// v0.3.1)"; "-" before it joined.
func hostShown(n app.NodeView) string {
	var notes []string
	if n.Protocol != "" {
		notes = append(notes, "protocol "+shown(n.Protocol))
	}
	if n.HostRelease != "" && n.HostRelease != n.HostVersion {
		notes = append(notes, "declared "+shown(n.HostRelease))
	}
	switch {
	case n.HostVersion == "" && len(notes) == 0:
		return "-"
	case len(notes) == 0:
		return shown(n.HostVersion)
	}
	return fmt.Sprintf("%s (%s)", shown(orNone(n.HostVersion)), strings.Join(notes, ", "))
}
