package main

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/term"

	"mesh-controller/app"
	"mesh-controller/app/protocol"
	"mesh-controller/cmd/clirun"
)

// OperatorCmd groups operator commands.
type OperatorCmd struct {
	Key OperatorKeyCmd `cmd:"" help:"The operator key: an age key pair whose private half never lives on the mesh."`
}

// OperatorKeyCmd groups operator key commands.
type OperatorKeyCmd struct {
	Make OperatorKeyMakeCmd `cmd:"" help:"Make an age key pair off the mesh: the private half goes only to the file (0600, never overwritten); prints the public half."`
	Set  OperatorKeySetCmd  `cmd:"" help:"Tell the mesh which key to seal every secret to from now on."`
	Show OperatorKeyShowCmd `cmd:"" help:"The operator key, and what it can recover."`
}

// OperatorKeyMakeCmd is operator key make.
type OperatorKeyMakeCmd struct {
	Out string `default:"mesh-operator.key" placeholder:"FILE" help:"Where the private half goes."`
}

// Run makes the key pair; it touches no store.
func (c *OperatorKeyMakeCmd) Run(env *Env) error {
	k, err := app.OperatorKeyMake(c.Out)
	if err != nil {
		return err
	}
	fmt.Fprintln(env.Stdout, k.Public)
	fmt.Fprintf(env.Stderr, "the private half is in %s (0600) and nowhere else: move it off this machine, keep a copy (it is a standard age identity file; without it no secret can be recovered when the mesh is lost), then: mesh-controller operator key set %s\n", k.File, k.Public)
	return nil
}

// OperatorKeySetCmd is operator key set.
type OperatorKeySetCmd struct {
	Public  string `arg:"" help:"The public half: age1…"`
	Replace bool   `help:"Replace the key that is set."`
}

// Run sets the key.
func (c *OperatorKeySetCmd) Run(env *Env, scs *app.Secrets) error {
	prev, err := scs.OperatorKeySet(env.Ctx, c.Public, c.Replace)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "operator key set: every secret made from now on is also sealed to %s\n", c.Public)
	if prev != "" {
		fmt.Fprintf(env.Stderr, "replaced %s: it is not revoked — it still opens every copy sealed to it and every earlier export; those stay recoverable only by it until each secret is made or accepted again\n", prev)
	}
	return nil
}

// OperatorKeyShowCmd is operator key show.
type OperatorKeyShowCmd struct {
	JSON bool `name:"json" help:"Print one JSON object."`
}

// Run shows the key.
func (c *OperatorKeyShowCmd) Run(env *Env, scs *app.Secrets) error {
	v, err := scs.OperatorKeyShow(env.Ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, v)
	}
	fmt.Fprintf(env.Stdout, "key            %s\nset            %s\nrecoverable    %s\nonly by older  %s\n", v.Key, v.SetAt.Format(timeShown),
		app.Plural(v.Recoverable, "secret"), app.Plural(v.OnlyOlderKeys, "secret"))
	fmt.Fprintf(env.Stdout, "licence copies %d (%d only by older keys)\n", v.LicenceCopies, v.LicenceCopiesOnlyOlder)
	return nil
}

// SecretCmd groups secret commands.
type SecretCmd struct {
	Accept  SecretAcceptCmd  `cmd:"" help:"A value a person has, from the terminal without echo or from a file; sealed at once to the node and the operator key."`
	Recover SecretRecoverCmd `cmd:"" help:"Break-glass: open the operator-sealed copy into a new 0600 file; a hand act."`
	Export  SecretExportCmd  `cmd:"" help:"Every operator-sealed copy, ciphertext only, as one document to keep beside the operator key."`
}

// SecretAcceptCmd is secret accept.
type SecretAcceptCmd struct {
	Node   Name      `arg:"" predictor:"node" help:"The node."`
	Module Name      `arg:"" predictor:"module" help:"The module."`
	Name   string    `arg:"" help:"The secret, as the manifest names it."`
	From   InputFile `placeholder:"FILE" help:"Read the value from this file (its exact bytes); otherwise from the terminal, without echo."`
}

// errNoTerminal means there is neither --from nor a terminal to read from.
var errNoTerminal = errors.New("no terminal to read the value from: give --from FILE (a value is never taken from the command line or the environment)")

// Run reads the value and hands it to the mesh; the plaintext goes nowhere else.
func (c *SecretAcceptCmd) Run(env *Env, scs *app.Secrets) error {
	value, err := readValue(env, c.From, fmt.Sprintf("value of %s for %s on %s", c.Name, c.Module, c.Node), "a secret")
	if err != nil {
		return err
	}
	pushed, err := scs.SecretAccept(env.Ctx, string(c.Node), string(c.Module), c.Name, value)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "%s of %s on %s accepted: sealed to %s and to the operator key\n", c.Name, c.Module, c.Node, c.Node)
	printPushed(env, pushed)
	return nil
}

// readValue reads a value a person gives: the file's exact bytes (nothing
// trimmed), else what is typed at the terminal without echo; never the
// command line or the environment. what names it in a refusal.
func readValue(env *Env, from InputFile, prompt, what string) (protocol.Secret, error) {
	if from != "" {
		b, err := app.ReadInput(string(from), app.MaxSecretBytes, what)
		if err != nil {
			return protocol.Secret{}, err
		}
		defer clear(b)
		return protocol.NewSecret(b), nil
	}
	fd := int(os.Stdin.Fd())
	if !term.IsTerminal(fd) {
		return protocol.Secret{}, errNoTerminal
	}
	fmt.Fprintf(env.Stderr, "%s (not echoed): ", prompt)
	b, err := term.ReadPassword(fd)
	fmt.Fprintln(env.Stderr)
	defer clear(b)
	if err != nil {
		return protocol.Secret{}, err
	}
	if len(b) > app.MaxSecretBytes {
		return protocol.Secret{}, fmt.Errorf("the value: %w: %s may be at most %d bytes", app.ErrTooLarge, what, app.MaxSecretBytes)
	}
	return protocol.NewSecret(b), nil
}

// SecretRecoverCmd is secret recover.
type SecretRecoverCmd struct {
	Node       Name      `arg:"" predictor:"node" optional:"" help:"The node."`
	Module     Name      `arg:"" predictor:"module" optional:"" help:"The module."`
	Name       string    `arg:"" optional:"" help:"The secret."`
	Licence    Name      `placeholder:"NAME" help:"Recover a licence's token (its operator copy) instead of a secret: name no node, module or secret."`
	Version    int64     `name:"licence-version" placeholder:"N" help:"With --licence: that version (kept for its grace period once refreshed); default the current one, or the newest in --from-export."`
	Key        InputFile `required:"" placeholder:"FILE" help:"The operator key file (its private half)."`
	Out        string    `placeholder:"FILE" help:"Where to write the value (created 0600, never overwritten); default NODE-MODULE-NAME.secret."`
	FromExport InputFile `placeholder:"FILE" help:"Open the copy in this export instead of the store (when the mesh itself is lost)."`
}

// Run recovers the value into the file.
func (c *SecretRecoverCmd) Run(env *Env, scs *app.Secrets) error {
	named := c.Node != "" || c.Module != "" || c.Name != ""
	switch {
	case c.Licence != "" && named:
		return clirun.UsageError{Msg: "name a secret (NODE MODULE NAME) or --licence NAME, not both"}
	case c.Licence == "" && (c.Node == "" || c.Module == "" || c.Name == ""):
		return clirun.UsageError{Msg: "name the secret: NODE MODULE NAME (or a licence: --licence NAME)"}
	case c.Licence == "" && c.Version != 0:
		return clirun.UsageError{Msg: "--licence-version goes with --licence: a secret's copy is its current one"}
	}
	r, err := scs.SecretRecover(env.Ctx, app.RecoverRequest{Node: string(c.Node), Module: string(c.Module), Name: c.Name,
		KeyFile: string(c.Key), Out: c.Out, FromExport: string(c.FromExport), Licence: string(c.Licence), Version: c.Version})
	if err != nil {
		return err
	}
	what := fmt.Sprintf("%s/%s/%s", c.Node, c.Module, c.Name)
	if c.Licence != "" {
		what = "licence " + string(c.Licence)
	}
	fmt.Fprintf(env.Stdout, "%s (version %d) written to %s (0600)\n", what, r.Version, r.Out)
	if r.Recorded {
		fmt.Fprintln(env.Stderr, "recorded as a hand act (who and when, never the value)")
	} else {
		fmt.Fprintf(env.Stderr, "not recorded as a hand act: %s\n", r.NotRecorded)
	}
	return nil
}

// SecretExportCmd is secret export.
type SecretExportCmd struct {
	Out string `placeholder:"FILE" help:"Write to this file (created 0600, never overwritten) rather than stdout."`
}

// Run exports.
func (c *SecretExportCmd) Run(env *Env, scs *app.Secrets) error {
	b, n, err := scs.SecretExport(env.Ctx, c.Out)
	if err != nil {
		return err
	}
	if c.Out == "" {
		_, err = env.Stdout.Write(b)
	} else {
		copies := fmt.Sprintf("%d sealed copies", n)
		if n == 1 {
			copies = "1 sealed copy"
		}
		fmt.Fprintf(env.Stdout, "%s exported to %s\n", copies, c.Out)
	}
	fmt.Fprintln(env.Stderr, "keep it beside the operator key: each copy opens with it alone (age -d -i OPERATOR-KEY)")
	return err
}
