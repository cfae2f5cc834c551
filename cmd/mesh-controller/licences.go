package main

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"mesh-controller/app"
	"mesh-controller/cmd/clirun"
)

// LicenceCmd groups licence commands.
type LicenceCmd struct {
	Add     LicenceAddCmd     `cmd:"" help:"A licence (access to a model or an outside service) under the name a person calls it; its token, from the terminal without echo or a file's exact bytes, is sealed at once to the operator key."`
	List    LicenceListCmd    `cmd:"" help:"Licences, their holders, their managers, when they expire."`
	Use     LicenceUseCmd     `cmd:"" help:"Let a module on a node hold a licence: a copy sealed to its node, in its declaration (--stop takes it away)."`
	Key     LicenceKeyCmd     `cmd:"" help:"Which key material a licence holds, to whom each copy of each version is sealed; never a token."`
	Manager LicenceManagerCmd `cmd:"" help:"Name the module on a node that holds a refreshable licence's refresh token and answers its tool refresh."`
	Refresh LicenceRefreshCmd `cmd:"" help:"Ask the manager for a new access token and seal it to every holder; the old version stays recoverable by the operator for 7 days."`
}

// LicenceAddCmd is licence add.
type LicenceAddCmd struct {
	Name        Name      `arg:"" help:"The name people call it (translation)."`
	Provider    Name      `required:"" placeholder:"P" help:"Who gives access (openai, deepl)."`
	From        InputFile `placeholder:"FILE" help:"Read the token from this file (its exact bytes, nothing trimmed); otherwise from the terminal, without echo. With --refreshable the file is JSON: {\"access_token\": \"…\", \"refresh_token\": \"…\", \"expires_at\": \"RFC 3339\"} (expires_at may be left out)."`
	Refreshable bool      `help:"An access token with a refresh token (the JSON file above); the refresh token is sealed apart, to the operator key, and to its manager once one is named (licence manager)."`
	Expires     string    `placeholder:"WHEN" help:"When the token runs out: RFC 3339 (2027-01-31T00:00:00Z) or a duration from now (720h, 90d); default the file's expires_at, else it does not say."`
}

// Run reads the token and hands it to the mesh; the plaintext goes nowhere else.
func (c *LicenceAddCmd) Run(env *Env, lcs *app.Licences) error {
	token, err := readValue(env, c.From, "token of licence "+string(c.Name), "a licence's token")
	if err != nil {
		return err
	}
	r, err := lcs.LicenceAdd(env.Ctx, app.LicenceAddRequest{Name: string(c.Name), Provider: string(c.Provider), Refreshable: c.Refreshable,
		Expires: c.Expires, Token: token})
	clear(token.Reveal())
	if err != nil {
		return err
	}
	expires := "no expiry given"
	if r.Expires != nil {
		expires = "expires " + r.Expires.Format(timeShown)
	}
	fmt.Fprintf(env.Stdout, "licence %s added (version %d, %s): sealed to the operator key %s\n", r.Name, r.Version, expires, r.OperatorKey)
	fmt.Fprintf(env.Stderr, "no module holds it yet: 'mesh-controller licence use %s NODE/MODULE --key OPERATOR-KEY'\n", r.Name)
	return nil
}

// LicenceUseCmd is licence use.
type LicenceUseCmd struct {
	Name   Name      `arg:"" help:"The licence."`
	Holder string    `arg:"" placeholder:"NODE/MODULE" help:"The module on its node that holds it."`
	Key    InputFile `placeholder:"FILE" help:"The operator key file: it opens the licence's token to seal it to the node, and is kept nowhere (the mesh holds no key that opens a licence)."`
	Stop   bool      `help:"Take the licence away from it: its copy is dropped and its host removes the file."`
}

// Run gives the licence, or takes it away.
func (c *LicenceUseCmd) Run(env *Env, lcs *app.Licences) error {
	switch {
	case c.Stop && c.Key != "":
		return clirun.UsageError{Msg: "--stop needs no --key: taking a licence away opens nothing"}
	case !c.Stop && c.Key == "":
		return clirun.UsageError{Msg: "give --key OPERATOR-KEY: the mesh seals the licence to the node from the operator's copy, which only that key opens"}
	}
	if c.Stop {
		pushed, err := lcs.LicenceStop(env.Ctx, string(c.Name), c.Holder)
		if err != nil {
			return err
		}
		fmt.Fprintf(env.Stdout, "licence %s taken away from %s: its copy is dropped\n", c.Name, c.Holder)
		printPushed(env, pushed)
		return nil
	}
	r, err := lcs.LicenceUse(env.Ctx, app.LicenceUseRequest{Name: string(c.Name), Holder: c.Holder, KeyFile: string(c.Key)})
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "licence %s (version %d) held by %s/%s: sealed to %s and to the operator key\n", r.Name, r.Version, r.Node, r.Module, r.Node)
	printPushed(env, r.Pushed)
	return nil
}

// LicenceListCmd is licence list.
type LicenceListCmd struct {
	JSON bool `name:"json" help:"Print one JSON array."`
}

// Run lists the licences.
func (c *LicenceListCmd) Run(env *Env, lcs *app.Licences) error {
	ls, err := lcs.LicenceList(env.Ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, ls)
	}
	if len(ls) == 0 {
		fmt.Fprintln(env.Stdout, "no licences: add one with 'mesh-controller licence add NAME --provider P'")
		return nil
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tPROVIDER\tVERSION\tEXPIRES\tHOLDERS\tMANAGER\tNEEDED BY")
	for _, l := range ls {
		expires := "-"
		if l.Expires != nil {
			expires = l.Expires.Format(timeShown)
		}
		if l.Refreshable {
			expires += " (refreshable)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", l.Name, l.Provider, l.Version, expires, dash(strings.Join(l.Holders, ",")), dash(l.Manager), dash(strings.Join(l.NeededBy, ",")))
	}
	return tw.Flush()
}

// LicenceKeyCmd is licence key.
type LicenceKeyCmd struct {
	Name Name `arg:"" help:"The licence."`
	JSON bool `name:"json" help:"Print one JSON object."`
}

// Run shows what the licence holds and to whom it is sealed.
func (c *LicenceKeyCmd) Run(env *Env, lcs *app.Licences) error {
	v, err := lcs.LicenceKey(env.Ctx, string(c.Name))
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, v)
	}
	fmt.Fprintf(env.Stdout, "licence   %s (%s)\nversion   %d\nholds     %s\ncopies:\n", v.Name, v.Provider, v.Version, strings.Join(v.Material, "; "))
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  VERSION\tKIND\tHOLDER\tSEALED TO\tSEALED AT")
	for _, cp := range v.Copies {
		version := fmt.Sprint(cp.Version)
		if cp.Current {
			version += " (current)"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", version, cp.Kind, dash(cp.Holder), strings.Join(cp.SealedTo, ", "), cp.SealedAt.UTC().Format(timeShown))
	}
	return tw.Flush()
}

// LicenceManagerCmd is licence manager.
type LicenceManagerCmd struct {
	Name    Name      `arg:"" help:"The refreshable licence."`
	Manager string    `arg:"" placeholder:"NODE/MODULE" help:"The module on its node that holds the refresh token and answers the tool refresh."`
	Key     InputFile `required:"" placeholder:"FILE" help:"The operator key file: it opens the refresh token to seal it to the node, and is kept nowhere."`
}

// Run names the manager.
func (c *LicenceManagerCmd) Run(env *Env, lcs *app.Licences) error {
	r, err := lcs.LicenceManager(env.Ctx, app.LicenceManagerRequest{Name: string(c.Name), Manager: c.Manager, KeyFile: string(c.Key)})
	if err != nil {
		return err
	}
	node, _, _ := strings.Cut(r.Manager, "/")
	fmt.Fprintf(env.Stdout, "licence %s managed by %s: its refresh token sealed to %s and to the operator key\n", r.Name, r.Manager, node)
	if r.Before != "" {
		fmt.Fprintf(env.Stdout, "%s no longer holds it\n", r.Before)
	}
	printPushed(env, r.Pushed)
	return nil
}

// LicenceRefreshCmd is licence refresh.
type LicenceRefreshCmd struct {
	Name Name `arg:"" help:"The refreshable licence."`
}

// Run refreshes the licence through its manager.
func (c *LicenceRefreshCmd) Run(env *Env, lcs *app.Licences) error {
	r, err := lcs.LicenceRefresh(env.Ctx, string(c.Name))
	if err != nil {
		return err
	}
	expires := "no expiry given"
	if r.Expires != nil {
		expires = "expires " + r.Expires.UTC().Format(timeShown)
	}
	fmt.Fprintf(env.Stdout, "licence %s refreshed by %s: version %d (%s), sealed to %s\n", r.Name, r.Manager, r.Version, expires, app.Plural(len(r.Holders), "holder"))
	fmt.Fprintf(env.Stdout, "version %d stays recoverable by the operator until %s\n", r.From, r.DiscardAfter.UTC().Format(timeShown))
	printPushed(env, r.Pushed)
	return nil
}
