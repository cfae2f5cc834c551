package main

import (
	"fmt"
	"strings"

	"github.com/alecthomas/kong"

	"mesh-controller/app"
	"mesh-controller/app/overlay"
	"mesh-controller/app/protocol"
	"mesh-controller/cmd/clirun"
)

// OverlayCmd is overlay.
type OverlayCmd struct {
	Place OverlayPlaceCmd `cmd:"" help:"Say where a node is and how it is reached: its endpoint, its site, public or behind NAT (replacing what was said)."`
	Show  OverlayShowCmd  `cmd:"" help:"The private network as the mesh computes it: each node's addresses, its peers, which pairs are direct and which go through the relay, and what is missing."`
}

// Endpoint is an overlay endpoint checked while parsing (app.CheckEndpoint):
// one that does not parse is a usage error and no store is touched.
type Endpoint string

// Decode implements kong.MapperValue.
func (e *Endpoint) Decode(ctx *kong.DecodeContext) error {
	var s string
	if err := ctx.Scan.PopValueInto("endpoint", &s); err != nil {
		return err
	}
	if err := app.CheckEndpoint(s); err != nil {
		return err
	}
	*e = Endpoint(s)
	return nil
}

// OverlayPlaceCmd is overlay place.
type OverlayPlaceCmd struct {
	Name      Name     `arg:"" predictor:"node" help:"The node."`
	Endpoint  Endpoint `help:"host:port where its peers dial it (203.0.113.7:51820, [2001:db8::7]:51820, gw.example.org:51820); its WireGuard listens on that port."`
	Site      Name     `help:"The site it is on: nodes of one site reach each other directly."`
	Public    bool     `xor:"reach" help:"Its endpoint can be dialled from anywhere (needs --endpoint)."`
	BehindNAT bool     `xor:"reach" name:"behind-nat" help:"It is behind NAT: it dials out (the default)."`
	JSON      bool     `name:"json" help:"Print one JSON object."`
}

// Run places the node.
func (c *OverlayPlaceCmd) Run(env *Env, nd *app.Nodes) error {
	if c.Public && c.Endpoint == "" {
		return clirun.UsageError{Msg: "--public needs --endpoint: a public node's peers dial it there"}
	}
	v, err := nd.OverlayPlace(env.Ctx, string(c.Name), app.Placement{Endpoint: string(c.Endpoint), Site: string(c.Site), Public: c.Public})
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, v)
	}
	out := env.Stdout
	if !v.Changed {
		out = env.Stderr
	}
	fmt.Fprintf(out, "%s: %s%s\n", v.Node.Node, placement(v.Node), map[bool]string{true: "", false: " already"}[v.Changed])
	if v.Node.Address4 != "" {
		fmt.Fprintf(env.Stdout, "%s: overlay addresses %s, %s\n", v.Node.Node, v.Node.Address4, v.Node.Address6)
	}
	for _, m := range v.Node.Missing {
		fmt.Fprintf(env.Stderr, "%s: %s\n", v.Node.Node, m)
	}
	if v.Changed {
		if len(v.Moved) > 0 {
			fmt.Fprintf(env.Stdout, "overlay parts changed: %s\n", strings.Join(v.Moved, " "))
		} else {
			fmt.Fprintln(env.Stdout, "no node's overlay part changed (a node takes part once its host reports a WireGuard key)")
		}
	}
	printPushed(env, v.Pushed)
	fmt.Fprintln(env.Stderr, "see the whole overlay: mesh-controller overlay show")
	return nil
}

// placement says where a node is and how it is reached.
func placement(n overlay.Node) string {
	var s string
	switch n.Reach {
	case "public":
		s = "public"
	case "behind-nat":
		s = "behind NAT"
	default:
		return "not placed"
	}
	if n.Endpoint != "" {
		s += ", endpoint " + n.Endpoint
	} else {
		s += ", no endpoint"
	}
	if n.Site != "" {
		s += ", site " + n.Site
	}
	return s
}

// OverlayShowCmd is overlay show.
type OverlayShowCmd struct {
	JSON bool `name:"json" help:"Print one JSON object."`
}

// Run shows the overlay.
func (c *OverlayShowCmd) Run(env *Env, nd *app.Nodes) error {
	m, err := nd.OverlayShow(env.Ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, m)
	}
	w := env.Stdout
	fmt.Fprintf(w, "overlay %s, %s\n", m.Prefix4, m.Prefix6)
	if m.Relay != "" {
		fmt.Fprintf(w, "relay %s (%s)\n", m.Relay, m.RelayWhy)
	} else {
		fmt.Fprintln(w, "relay none (no public node with a key)")
	}
	if len(m.Nodes) == 0 {
		fmt.Fprintln(env.Stderr, "no nodes: add one with 'mesh-controller node add NAME'")
	}
	for _, n := range m.Nodes {
		fmt.Fprintf(w, "\n%s  %s  %s\n", n.Node, orNone(n.Address4), orNone(n.Address6)) // none: past the overlay's indexes
		key := "key reported"
		if !n.Key {
			key = "no key"
		}
		fmt.Fprintf(w, "  %s; %s\n", placement(n), key)
		for _, p := range n.Peers {
			fmt.Fprintf(w, "  %s\n", peerLine(p))
		}
		for _, miss := range n.Missing {
			fmt.Fprintf(w, "  missing: %s\n", miss)
		}
	}
	return nil
}

// peerLine says how a node reaches one peer.
func peerLine(p protocol.DeclaredPeer) string {
	s := "peer " + p.Node + " direct"
	if p.Endpoint != "" {
		s += ", dials " + p.Endpoint
	} else {
		s += ", dialled by it"
	}
	if p.Keepalive > 0 {
		s += fmt.Sprintf(", keepalive %ds", p.Keepalive)
	}
	if len(p.Via) > 0 {
		s += "; through it: " + strings.Join(p.Via, ", ")
	}
	if p.Relays {
		s += "; relays for it"
	}
	return s
}
