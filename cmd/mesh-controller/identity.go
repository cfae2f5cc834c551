package main

import (
	"fmt"
	"time"

	"mesh-controller/app"
	"mesh-controller/cmd/clirun"
)

// IdentityCmd groups identity commands.
type IdentityCmd struct {
	Show   IdentityShowCmd   `cmd:"" help:"The controller's signing public key, its fingerprint, when it was made; the key before it while hosts still accept it, and the hosts that have not acknowledged it."`
	Rotate IdentityRotateCmd `cmd:"" help:"Make a new signing key, announced to every host signed by the old one; hosts accept both for --overlap, then the old is retired."`
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
	for _, line := range v.Lines() {
		fmt.Fprintln(env.Stdout, line)
	}
	return nil
}

// IdentityRotateCmd is identity rotate.
type IdentityRotateCmd struct {
	Why     string        `required:"" help:"Why, for the hand-act log."`
	Overlap time.Duration `default:"168h" placeholder:"D" help:"How long hosts accept the old key beside the new one (a host away longer catches up through the chain when it is back); 0 retires it at once."`
	JSON    bool          `name:"json" help:"Print one JSON object."`
	// LeaveBehind rotates even with hosts of protocol 1.0 joined.
	LeaveBehind bool `name:"leave-behind" help:"Rotate even when joined hosts predate rotations (protocol 1.0): they refuse every declaration until upgraded and joined again."`
}

// Run rotates the signing key and says what comes next.
func (c *IdentityRotateCmd) Run(env *Env, nd *app.Nodes) error {
	if c.Overlap < 0 {
		return clirun.UsageError{Msg: "give --overlap as a duration of zero or more, e.g. 168h (a week); 0 retires the old key at once"}
	}
	v, err := nd.IdentityRotate(env.Ctx, app.RotateRequest{Why: c.Why, Overlap: c.Overlap, LeaveBehind: c.LeaveBehind})
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, v)
	}
	fmt.Fprintf(env.Stdout, "signing key rotated: %s replaces %s (rotation %d)\n", v.New.Fingerprint, v.Old.Fingerprint, v.Sequence)
	fmt.Fprintf(env.Stdout, "hosts accept both until %s; then %s is retired\n", v.OverlapUntil.UTC().Format(time.RFC3339), v.Old.Fingerprint)
	fmt.Fprintf(env.Stdout, "%s signed again with the new key\n", app.Plural(v.SignedAgain, "latest declaration"))
	if v.Announced {
		fmt.Fprintln(env.Stderr, "the serving controller announces it to every host now; 'mesh-controller identity show' says which have not acknowledged it")
	} else {
		fmt.Fprintln(env.Stderr, "no controller serves: 'mesh-controller serve' announces it to each host when it beats with the old key")
	}
	return nil
}
