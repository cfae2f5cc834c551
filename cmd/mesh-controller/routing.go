package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/alecthomas/kong"

	"mesh-controller/app"
	"mesh-controller/app/protocol"
	"mesh-controller/cmd/clirun"
)

// Domain is a public domain checked while parsing (protocol.CheckDomain):
// a malformed one is a usage error and no store is touched.
type Domain string

// Decode implements kong.MapperValue.
func (d *Domain) Decode(ctx *kong.DecodeContext) error {
	var s string
	if err := ctx.Scan.PopValueInto("domain", &s); err != nil {
		return err
	}
	if err := protocol.CheckDomain(s); err != nil {
		return err
	}
	*d = Domain(s)
	return nil
}

// Network is a CIDR prefix checked while parsing (protocol.ParseNetwork):
// one that does not parse, or is not written canonically, is a usage
// error. Whether a node's networks may stand together is the app's to judge.
type Network string

// Decode implements kong.MapperValue.
func (n *Network) Decode(ctx *kong.DecodeContext) error {
	var s string
	if err := ctx.Scan.PopValueInto("cidr", &s); err != nil {
		return err
	}
	if _, err := protocol.ParseNetwork(s); err != nil {
		return err
	}
	*n = Network(s)
	return nil
}

// NodePublicDomainCmd is node public-domain.
type NodePublicDomainCmd struct {
	Name   Name   `arg:"" predictor:"node" help:"The node."`
	Domain Domain `arg:"" optional:"" help:"The domain its public ports are routed under, as <port>.<module>.<domain>: lower-case labels, at least two (example.org)."`
	Clear  bool   `help:"Take its domain away: its public ports close."`
	JSON   bool   `name:"json" help:"Print one JSON object."`
}

// Run shows, sets or clears the node's public domain.
func (c *NodePublicDomainCmd) Run(env *Env, nd *app.Nodes) error {
	if c.Clear && c.Domain != "" {
		return clirun.UsageError{Msg: "give a domain or --clear, not both"}
	}
	node := string(c.Name)
	act := routingAct{clear: c.Clear, set: c.Domain != ""}
	var v app.RoutingView
	var err error
	if act.clear || act.set {
		v, err = nd.SetPublicDomain(env.Ctx, node, string(c.Domain))
	} else {
		v, err = nd.NodeRouting(env.Ctx, node)
	}
	if err != nil || c.JSON {
		return jsonOr(env, v, err)
	}
	act.shown = []string{v.PublicDomain}
	if v.PublicDomain == "" {
		act.shown = nil
	}
	act.say(env, v, routingWords{
		cleared: ": public domain cleared: its public ports are not reachable until one is set",
		nothing: " has no public domain: nothing to clear",
		set:     ": public domain " + v.PublicDomain + " set",
		already: ": public domain is " + v.PublicDomain + " already",
		none:    fmt.Sprintf(" has no public domain: its public ports are not reachable until one is set ('mesh-controller node public-domain %s DOMAIN')", node),
	})
	return nil
}

// NodeNetworksCmd is node networks.
type NodeNetworksCmd struct {
	Name     Name      `arg:"" predictor:"node" help:"The node."`
	Networks []Network `arg:"" optional:"" name:"cidr" help:"The networks it routes for what it hosts, as CIDR prefixes written canonically (10.20.0.0/16, 2001:db8::/48): all of them, replacing those it had."`
	Clear    bool      `help:"Take its networks away: it forwards nothing."`
	JSON     bool      `name:"json" help:"Print one JSON object."`
}

// Run shows, sets or clears the node's networks.
func (c *NodeNetworksCmd) Run(env *Env, nd *app.Nodes) error {
	if c.Clear && len(c.Networks) > 0 {
		return clirun.UsageError{Msg: "give networks or --clear, not both"}
	}
	node := string(c.Name)
	act := routingAct{clear: c.Clear, set: len(c.Networks) > 0}
	var v app.RoutingView
	var err error
	if act.clear || act.set {
		nets := make([]string, len(c.Networks))
		for i, n := range c.Networks {
			nets[i] = string(n)
		}
		v, err = nd.SetNetworks(env.Ctx, node, nets)
	} else {
		v, err = nd.NodeRouting(env.Ctx, node)
	}
	if err != nil || c.JSON {
		return jsonOr(env, v, err)
	}
	act.shown = v.Networks
	nets := strings.Join(v.Networks, ", ")
	act.say(env, v, routingWords{
		cleared: ": networks cleared: it forwards nothing",
		nothing: " routes no networks: nothing to clear",
		set:     ": networks set: " + nets,
		already: ": networks are " + nets + " already",
		none:    fmt.Sprintf(" routes no networks ('mesh-controller node networks %s CIDR...' sets them)", node),
	})
	return nil
}

// jsonOr returns err, or else prints v as JSON (asked for).
func jsonOr(env *Env, v app.RoutingView, err error) error {
	if err != nil {
		return err
	}
	return printJSON(env.Stdout, v)
}

// routingAct is what a routing command was asked: to clear, to set, or
// (neither) to show; shown is what it shows, one value a line.
type routingAct struct {
	clear, set bool
	shown      []string
}

// routingWords are what a routing command says in each case, after the
// node's name (each begins with its separator).
type routingWords struct{ cleared, nothing, set, already, none string }

// say prints what the act did: a change on stdout with the declaration it
// made, no change on stderr, a value shown alone on stdout (for scripts).
func (a routingAct) say(env *Env, v app.RoutingView, w routingWords) {
	line := func(out io.Writer, s string) { fmt.Fprintf(out, "%s%s\n", v.Node, s) }
	switch {
	case a.clear && v.Changed:
		line(env.Stdout, w.cleared)
	case a.clear:
		line(env.Stderr, w.nothing)
	case a.set && v.Changed:
		line(env.Stdout, w.set)
	case a.set:
		line(env.Stderr, w.already)
	case len(a.shown) == 0:
		line(env.Stderr, w.none)
	default:
		for _, s := range a.shown {
			fmt.Fprintln(env.Stdout, s)
		}
	}
	printPushed(env, v.Pushed)
}
