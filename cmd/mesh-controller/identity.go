package main

import (
	"fmt"

	"mesh-controller/app"
)

// IdentityCmd groups identity commands.
type IdentityCmd struct {
	Show IdentityShowCmd `cmd:"" help:"The controller's signing public key, its fingerprint, when it was made."`
}

// IdentityShowCmd is identity show.
type IdentityShowCmd struct {
	JSON bool `name:"json" help:"Print one JSON object."`
}

// Run prints the public half of the signing key.
func (c *IdentityShowCmd) Run(env *Env, nd *app.Nodes) error {
	v, err := nd.IdentityShow(env.Ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, v)
	}
	fmt.Fprintf(env.Stdout, "algorithm    %s\npublic key   %s\nfingerprint  %s\nmade         %s\n",
		v.Algorithm, v.PublicKey, v.Fingerprint, v.CreatedAt.Format(timeShown))
	return nil
}
