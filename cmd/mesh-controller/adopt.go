package main

import (
	"fmt"

	"mesh-controller/app"
)

// AdoptCmd is adopt.
type AdoptCmd struct {
	Node Name `arg:"" predictor:"node" help:"The converged node to return to adopted."`
}

// Run adopts the node and sends its declaration.
func (c *AdoptCmd) Run(env *Env, nd *app.Nodes) error {
	p, err := nd.Adopt(env.Ctx, string(c.Node))
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "%s: adopted: the mesh owns no packet filter there now; what was taken stays taken\n", p.Node)
	printPushed(env, []app.Pushed{p})
	return nil
}
