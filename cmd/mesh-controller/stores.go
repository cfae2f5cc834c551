package main

import (
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/alecthomas/kong"

	"mesh-controller/app"
	"mesh-controller/cmd/clirun"
	"mesh-controller/embedded/postgres"
)

// MigrateCmd is migrate (and prepare).
type MigrateCmd struct {
	NewIdentity bool `name:"new-identity" help:"Make a new signing key although nodes joined under the lost one: every one of them must then join again."`
	JSON        bool `name:"json" help:"Print one JSON array: per store, its context, where it is, its version before and after, and what else was done."`
}

// Run migrates every store and prints, per context, the version before and after.
func (c *MigrateCmd) Run(env *Env) error {
	done, err := env.App.MigrateWith(env.Ctx, app.MigrateOptions{NewIdentity: c.NewIdentity})
	if c.JSON {
		// What was done before a refusal is said too, then the refusal.
		if perr := printJSON(env.Stdout, append([]app.Migrated{}, done...)); perr != nil {
			return perr
		}
		return err
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 0, 2, ' ', 0)
	changed := false
	for _, m := range done {
		var what string
		switch {
		case m.Known == 0:
			what = "version 0 (this context has no schema yet)"
		case m.From == m.To:
			what = fmt.Sprintf("version %d, up to date", m.To)
		default:
			what = fmt.Sprintf("version %d -> %d", m.From, m.To)
		}
		if m.Note != "" {
			what += "; " + m.Note
		}
		changed = changed || m.Changed()
		fmt.Fprintf(tw, "%s\t%s\t%s\n", m.Context, m.Store, what)
	}
	tw.Flush()
	if err != nil {
		return err
	}
	if changed {
		fmt.Fprintln(env.Stderr, "migrated; next: add a node with 'mesh-controller node add NAME'")
	} else {
		fmt.Fprintln(env.Stderr, "nothing to change: every store is up to date")
	}
	return nil
}

// VersionCmd is version.
type VersionCmd struct {
	JSON bool `name:"json" help:"Print one JSON object: the version (\"\" for a development build), the Go it was built with, the protocol it speaks, and the commit it was built from when stamped."`
}

// Run prints the stamped version, or says it is a development build.
func (c *VersionCmd) Run(env *Env) error {
	if c.JSON {
		return printJSON(env.Stdout, app.BuiltAs(version))
	}
	fmt.Fprintln(env.Stdout, versionLine())
	return nil
}

// versionLine is what version and --version print: the version stamped at
// link time, or "development build", never a made-up number.
func versionLine() string {
	if version == "" {
		return "mesh-controller development build"
	}
	return "mesh-controller " + version
}

// HelpCmd is help.
type HelpCmd struct {
	Command []string `arg:"" optional:"" help:"The command to explain."`
}

// Run prints the usage of the whole binary, or of one command.
func (c *HelpCmd) Run(kctx *kong.Context) error {
	_, err := kctx.Kong.Parse(append(append([]string{}, c.Command...), "--help"))
	return err
}

// helpWithStores prints kong's usage (with bare forms and xor alternatives,
// see help.go) and, for the binary as a whole, where each context's store
// is and which variable moves it.
func helpWithStores(options kong.HelpOptions, kctx *kong.Context) error {
	defer showBareForms(kctx.Model.Node)()
	printUsage(kctx)
	options.NoAppSummary = true
	if err := kong.DefaultHelpPrinter(options, kctx); err != nil {
		return err
	}
	if kctx.Selected() != nil {
		return nil
	}
	data := kctx.Model.Target.Interface().(CLI).Globals.Data
	if data == "" {
		// --help is handled while parsing, before the environment is applied.
		data = os.Getenv("MESH_DATA")
	}
	if data == "" {
		data = kctx.Model.Vars()["data_dir"]
	}
	w := kctx.Stdout
	locs, err := app.New(data).StoreLocations()
	if err != nil {
		fmt.Fprintf(w, "\nStores: %v\n", err)
		return nil
	}
	fmt.Fprintln(w, "\nStores (one SQLite file per context, or a postgres:// URL naming its database; the variable moves it, or names a file holding it with _FILE):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, l := range locs {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t(from %s)\n", l.Context, l.Shown(), l.Var, l.From)
	}
	return tw.Flush()
}

// StoreCmd is store: the stores themselves, as a whole.
type StoreCmd struct {
	Backup  BackupCmd    `cmd:"" help:"A consistent copy of every store, taken while serve runs, sealed with age to the operator key."`
	Restore RestoreCmd   `cmd:"" help:"A backup into a new or empty data dir (--data), opened with the operator key; integrity and schema checked."`
	Copy    StoreCopyCmd `cmd:"" help:"Copy contexts' stores onto others (SQLite to PostgreSQL, or back) while no controller serves; counts and digests compared."`
}

// StoreCopyCmd is store copy.
type StoreCopyCmd struct {
	To   []string `required:"" placeholder:"CONTEXT=URL" help:"A context and the store to copy it onto: a postgres:// URL (its database and role made by a person) or a SQLite path. Repeat for more contexts."`
	JSON bool     `name:"json" help:"Print one JSON array."`
}

// Run copies each context named onto its target and says what to set next.
func (c *StoreCopyCmd) Run(env *Env, cps *app.Copies) error {
	targets := map[string]string{}
	for _, t := range c.To {
		name, dsn, ok := strings.Cut(t, "=")
		if !ok || name == "" {
			return clirun.UsageError{Msg: fmt.Sprintf("--to %s: write it CONTEXT=URL, e.g. --to inventory=postgres://mesh_inventory@db.example/inventory", postgres.Redact(t))}
		}
		if _, twice := targets[name]; twice {
			return clirun.UsageError{Msg: fmt.Sprintf("--to names %s twice: one target per context", name)}
		}
		targets[name] = dsn
	}
	done, err := cps.StoreCopy(env.Ctx, targets)
	if c.JSON && err == nil {
		return printJSON(env.Stdout, done)
	}
	for _, cp := range done {
		fmt.Fprintf(env.Stdout, "%s: copied %d rows from %s to %s\n", cp.Context, cp.Rows(), cp.From, cp.To)
		for _, t := range cp.Tables {
			fmt.Fprintf(env.Stdout, "  %-22s %8d rows  sha256 %s  (the same at both ends)\n", t.Table, t.Rows, t.Digest)
		}
	}
	if err != nil {
		return err
	}
	for _, cp := range done {
		fmt.Fprintf(env.Stderr, "next, for every mesh-controller that uses these stores: set %s=%s (with its password), or write that URL in a file only the controller reads and set %s_FILE to its path\n",
			cp.Var, cp.To, cp.Var)
	}
	return nil
}
