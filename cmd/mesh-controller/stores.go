package main

import (
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/alecthomas/kong"

	"mesh-controller/app"
)

// MigrateCmd is migrate (and prepare).
type MigrateCmd struct {
	NewIdentity bool `name:"new-identity" help:"Make a new signing key although nodes joined under the lost one: every one of them must then join again."`
}

// Run migrates every store and prints, per context, the version before and after.
func (c *MigrateCmd) Run(env *Env) error {
	done, err := env.App.MigrateWith(env.Ctx, app.MigrateOptions{NewIdentity: c.NewIdentity})
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
type VersionCmd struct{}

// Run prints the stamped version, or says it is a development build.
func (c *VersionCmd) Run(env *Env) error {
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
	fmt.Fprintln(w, "\nStores (one SQLite file per context; the variable moves it, or names a file holding its path with _FILE):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, l := range locs {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t(from %s)\n", l.Context, l.Shown(), l.Var, l.From)
	}
	return tw.Flush()
}
