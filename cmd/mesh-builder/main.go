// Command mesh-builder is the reference builder: a module a host runs (the
// builder module's run.command) that takes the build asks addressed to its
// node, builds them with git and the manifest's build section, stores each
// archive in the broker's object store and reports the outcome. Run as a
// module it needs no arguments: its environment says everything.
package main

import (
	"context"
	"io"
	"os"
	"path/filepath"

	"github.com/alecthomas/kong"

	"mesh-controller/app/builder"
	"mesh-controller/cmd/clirun"
	"mesh-controller/contexts/inventory/manifest"
)

// version is stamped at link time: -ldflags "-X main.version=v1.2.3".
var version string

// CLI is mesh-builder's command line: serve (the default, so that a host
// runs it with no arguments) and version.
type CLI struct {
	Serve ServeCmd `cmd:"" default:"withargs" help:"Take the build asks addressed to this node and build them (the default)."`
	// Versioned is version and --version: the same line.
	clirun.Versioned
}

// ServeCmd serves until SIGINT or SIGTERM: flags only, each defaulting to
// what a host gives a module.
type ServeCmd struct {
	Broker string `env:"MESH_BROKER" required:"" help:"The broker's URL (a host sets MESH_BROKER)."`
	Creds  string `env:"MESH_BROKER_CREDS" required:"" type:"existingfile" help:"Its broker user's .creds file (a host sets MESH_BROKER_CREDS)."`
	Node   string `env:"MESH_NODE" required:"" help:"The node it runs on: it takes the asks addressed there."`
	Work   string `env:"MESH_DATA_WORK" required:"" type:"existingdir" help:"Its work directory, one fresh subdirectory per build (the builder module's work data set)."`
	// Secrets holds its git-credentials secret when its manifest declares
	// one: how it reaches private repositories over HTTPS.
	Secrets string `env:"MESH_SECRETS_DIR" help:"Its secrets directory (a host sets MESH_SECRETS_DIR); a git-credentials file there (git-credential-store lines) is given to git."`
}

// Env is what Run is given.
type Env struct {
	Ctx    context.Context
	Stderr io.Writer
}

// Run serves until SIGINT or SIGTERM.
func (c *ServeCmd) Run(env *Env) error {
	credentials := ""
	if c.Secrets != "" {
		credentials = filepath.Join(c.Secrets, manifest.GitCredentialsSecret)
	}
	return builder.Serve(env.Ctx, builder.ServeOptions{Broker: c.Broker, Creds: c.Creds, Node: c.Node, WorkDir: c.Work,
		Hide: ownPaths(c.Creds), GitCredentials: credentials, Put: builder.PutArchive, Log: env.Stderr})
}

// ownPaths are the builder's own that no build may see: the directory of
// its broker credentials (its module's, as a host runs it), its secrets
// and its home.
func ownPaths(creds string) []string {
	out := []string{filepath.Dir(creds)}
	for _, v := range []string{"MESH_SECRETS_DIR", "HOME"} {
		if p := os.Getenv(v); filepath.IsAbs(p) && filepath.Clean(p) != "/" {
			out = append(out, filepath.Clean(p))
		}
	}
	return out
}

func main() {
	builder.SandboxMain() // a build's first process: never returns
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	var cli CLI
	return clirun.Program{
		Name: "mesh-builder",
		Options: []kong.Option{kong.Description("The reference builder, run by a host as the builder module: takes build asks, builds, stores archives."),
			kong.Vars{"version": clirun.VersionLine("mesh-builder", version)}},
		Bind:    func(ctx context.Context) any { return &Env{Ctx: ctx, Stderr: stderr} },
		RunBare: true,
	}.Run(&cli, args, stdout, stderr)
}
