package main

import (
	"fmt"

	"mesh-controller/app"
	"mesh-controller/app/protocol"
)

// DeclareCmd is declare.
type DeclareCmd struct {
	Node Name      `arg:"" predictor:"node" help:"The node."`
	File InputFile `arg:"" help:"A JSON object: the declaration body; node, serial and issued_at are filled in."`
	Why  string    `required:"" help:"Why this is declared by hand; recorded in the hand-act log."`
}

// Run signs, keeps and sends the declaration.
func (c *DeclareCmd) Run(env *Env, md *app.Modules) error {
	body, err := app.ReadInput(string(c.File), protocol.MaxDeclarationBytes, "a declaration")
	if err != nil {
		return err
	}
	d, err := md.Declare(env.Ctx, app.DeclareRequest{Node: string(c.Node), Body: body, From: string(c.File), Why: c.Why})
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "declaration %d for %s signed and kept\n", d.Serial, d.Node)
	switch {
	case d.Sent && d.Joined:
		fmt.Fprintf(env.Stderr, "sent; 'mesh-controller node list' shows when %s has applied it\n", d.Node)
	case d.Sent:
		fmt.Fprintf(env.Stderr, "%s has not joined yet: it gets this declaration when it joins\n", d.Node)
	default:
		fmt.Fprintf(env.Stderr, "not sent now (%s): %s gets it when 'mesh-controller serve' runs and it connects\n", d.NotSent, d.Node)
	}
	return nil
}
