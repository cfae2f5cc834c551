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
	Node    Name          `predictor:"node" xor:"target" required:"" placeholder:"NAME" help:"Issue for an existing node record."`
	New     Name          `xor:"target" required:"" placeholder:"NAME" help:"Create the node record and issue for it in one act."`
	Adopted bool          `help:"With --new: the machine is already in use."`
	TTL     time.Duration `name:"ttl" default:"24h" help:"How long the token works, if unused."`
	Count   int           `help:"With --new PREFIX: make PREFIX1…PREFIXN, one token each, written to --out."`
	Out     string        `placeholder:"FILE" help:"With --count: the file (0600, created exclusively) for the 'name token' lines; never stdout."`
}

// Run issues the token: the token alone on stdout, everything else on stderr.
func (c *TokenIssueCmd) Run(env *Env, nd *app.Nodes) error {
	if c.Adopted && c.New == "" {
		return clirun.UsageError{Msg: "--adopted goes with --new: an existing node keeps its mode"}
	}
	if c.Count != 0 || c.Out != "" {
		if c.New == "" || c.Count == 0 || c.Out == "" {
			return clirun.UsageError{Msg: "many tokens at once take --new PREFIX --count N --out FILE"}
		}
		b, err := nd.TokenIssueMany(env.Ctx, string(c.New), c.Count, c.Adopted, c.TTL, c.Out)
		if err != nil {
			return err
		}
		fmt.Fprintf(env.Stdout, "%s added (%s…%s); their join tokens are in %s (0600): each works once, until %s\n",
			app.Plural(b.Count, "node"), b.First, b.Last, b.Out, time.Now().Add(c.TTL).UTC().Format(timeShown))
		return nil
	}
	r := app.TokenRequest{Node: string(c.Node), TTL: c.TTL, New: c.New != "", Adopted: c.Adopted}
	if r.New {
		r.Node = string(c.New)
	}
	t, err := nd.TokenIssue(env.Ctx, r)
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
