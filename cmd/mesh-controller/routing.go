package main

import (
	"fmt"
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
	Name   Name   `arg:"" help:"The node."`
	Domain Domain `arg:"" optional:"" help:"The domain its public ports are routed under, as <port>.<module>.<domain>: lower-case labels, at least two (example.org)."`
	Clear  bool   `help:"Take its domain away: its public ports close."`
	JSON   bool   `name:"json" help:"Print one JSON object."`
}

// Run shows, sets or clears the node's public domain.
func (c *NodePublicDomainCmd) Run(env *Env) error {
	if c.Clear && c.Domain != "" {
		return clirun.UsageError{Msg: "give a domain or --clear, not both"}
	}
	var v app.RoutingView
	var err error
	switch {
	case c.Clear:
		v, err = env.App.SetPublicDomain(env.Ctx, string(c.Name), "")
	case c.Domain != "":
		v, err = env.App.SetPublicDomain(env.Ctx, string(c.Name), string(c.Domain))
	default:
		v, err = env.App.NodeRouting(env.Ctx, string(c.Name))
	}
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, v)
	}
	switch {
	case c.Clear && v.Changed:
		fmt.Fprintf(env.Stdout, "%s: public domain cleared: its public ports are not reachable until one is set\n", v.Node)
	case c.Clear:
		fmt.Fprintf(env.Stderr, "%s has no public domain: nothing to clear\n", v.Node)
	case c.Domain != "" && v.Changed:
		fmt.Fprintf(env.Stdout, "%s: public domain %s set\n", v.Node, v.PublicDomain)
	case c.Domain != "":
		fmt.Fprintf(env.Stderr, "%s: public domain is %s already\n", v.Node, v.PublicDomain)
	case v.PublicDomain == "":
		fmt.Fprintf(env.Stderr, "%s has no public domain: its public ports are not reachable until one is set ('mesh-controller node public-domain %s DOMAIN')\n", v.Node, v.Node)
	default:
		fmt.Fprintln(env.Stdout, v.PublicDomain)
	}
	printPushed(env, v.Pushed)
	return nil
}

// NodeNetworksCmd is node networks.
type NodeNetworksCmd struct {
	Name     Name      `arg:"" help:"The node."`
	Networks []Network `arg:"" optional:"" name:"cidr" help:"The networks it routes for what it hosts, as CIDR prefixes written canonically (10.20.0.0/16, 2001:db8::/48): all of them, replacing those it had."`
	Clear    bool      `help:"Take its networks away: it forwards nothing."`
	JSON     bool      `name:"json" help:"Print one JSON object."`
}

// Run shows, sets or clears the node's networks.
func (c *NodeNetworksCmd) Run(env *Env) error {
	if c.Clear && len(c.Networks) > 0 {
		return clirun.UsageError{Msg: "give networks or --clear, not both"}
	}
	var v app.RoutingView
	var err error
	switch {
	case c.Clear || len(c.Networks) > 0:
		nets := make([]string, len(c.Networks))
		for i, n := range c.Networks {
			nets[i] = string(n)
		}
		v, err = env.App.SetNetworks(env.Ctx, string(c.Name), nets)
	default:
		v, err = env.App.NodeRouting(env.Ctx, string(c.Name))
	}
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, v)
	}
	switch {
	case c.Clear && v.Changed:
		fmt.Fprintf(env.Stdout, "%s: networks cleared: it forwards nothing\n", v.Node)
	case c.Clear:
		fmt.Fprintf(env.Stderr, "%s routes no networks: nothing to clear\n", v.Node)
	case len(c.Networks) > 0 && v.Changed:
		fmt.Fprintf(env.Stdout, "%s: networks set: %s\n", v.Node, strings.Join(v.Networks, ", "))
	case len(c.Networks) > 0:
		fmt.Fprintf(env.Stderr, "%s: networks are %s already\n", v.Node, strings.Join(v.Networks, ", "))
	case len(v.Networks) == 0:
		fmt.Fprintf(env.Stderr, "%s routes no networks ('mesh-controller node networks %s CIDR...' sets them)\n", v.Node, v.Node)
	default:
		for _, n := range v.Networks {
			fmt.Fprintln(env.Stdout, n)
		}
	}
	printPushed(env, v.Pushed)
	return nil
}
