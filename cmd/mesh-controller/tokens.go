package main

import (
	"fmt"
	"time"

	"mesh-controller/app"
	"mesh-controller/cmd/clirun"
)

// TokenCmd groups token commands.
type TokenCmd struct {
	Issue TokenIssueCmd `cmd:"" help:"A one-time right to join, printed once, alone on stdout; stored only as a hash."`
}

// TokenIssueCmd is token issue.
type TokenIssueCmd struct {
	Node    Name          `xor:"target" required:"" placeholder:"NAME" help:"Issue for an existing node record."`
	New     Name          `xor:"target" required:"" placeholder:"NAME" help:"Create the node record and issue for it in one act."`
	Adopted bool          `help:"With --new: the machine is already in use."`
	TTL     time.Duration `name:"ttl" default:"24h" help:"How long the token works, if unused."`
}

// Run issues the token: the token alone on stdout, everything else on stderr.
func (c *TokenIssueCmd) Run(env *Env) error {
	if c.Adopted && c.New == "" {
		return clirun.UsageError{Msg: "--adopted goes with --new: an existing node keeps its mode"}
	}
	r := app.TokenRequest{Node: string(c.Node), TTL: c.TTL, New: c.New != "", Adopted: c.Adopted}
	if r.New {
		r.Node = string(c.New)
	}
	t, err := env.App.TokenIssue(env.Ctx, r)
	if err != nil {
		return err
	}
	if t.Created {
		fmt.Fprintf(env.Stderr, "node %s added (%s)\n", t.Node, t.Mode)
	}
	if t.Revoked > 0 {
		fmt.Fprintf(env.Stderr, "the earlier unused token for %s no longer works\n", t.Node)
	}
	fmt.Fprintln(env.Stdout, t.Token)
	fmt.Fprintf(env.Stderr, "join token for %s: works once, until %s; it is shown only now and kept only as a hash\n",
		t.Node, t.ExpiresAt.Format(timeShown))
	return nil
}
