// Command mesh-controller is the control plane of a mesh: its daemon and the
// commands a person runs. This package holds kong command structs only; each
// Run calls app/ and prints what it returns.
package main

import (
	"context"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/alecthomas/kong"
	"github.com/posener/complete"

	"mesh-controller/app"
	"mesh-controller/app/service"
	"mesh-controller/cmd/clirun"
)

// version is stamped at link time: -ldflags "-X main.version=v1.2.3".
var version string

// Globals are the flags every command takes.
type Globals struct {
	// Config is read before the other flags are resolved: what a service's
	// unit would carry as flags, kept in a file.
	ConfigFile clirun.ConfigFile `name:"config-file" env:"MESH_CONFIG_FILE" default:"${config_file}" placeholder:"FILE" help:"A TOML file of flag values (data = \"/srv/mesh\"; [serve] listen = \"0.0.0.0:4222\"); flags and their variables win over it, a key that is no flag is refused (default ${config_file}, read when it is there)."`
	Data       string            `name:"data" env:"MESH_DATA" default:"${data_dir}" placeholder:"DIR" help:"Where the stores live unless moved by their own variable (default ${data_dir})."`
	Broker     string            `name:"broker" env:"MESH_BROKER" placeholder:"URL" help:"An external NATS instead of the serving controller's embedded broker: a cluster's servers, separated by commas (nats://a:4222,nats://b:4222,…; see 'broker show --config')."`
}

// CLI is every command mesh-controller has. A command that is not built is not here.
type CLI struct {
	Globals
	// VersionFlag is --version: the same line as the version command.
	VersionFlag kong.VersionFlag `name:"version" help:"Print the version stamped at link time, as 'mesh-controller version' does."`

	Migrate    MigrateCmd    `cmd:"" help:"Bring every context's store up to date (made on first use)."`
	Prepare    MigrateCmd    `cmd:"" help:"The same act as migrate, named as the mesh asks any module to prepare its state."`
	Version    VersionCmd    `cmd:"" help:"Print the version stamped at link time."`
	Help       HelpCmd       `cmd:"" help:"Show usage, and where each context's store is."`
	Identity   IdentityCmd   `cmd:"" help:"The controller's signing identity."`
	Node       NodeCmd       `cmd:"" help:"Machines the mesh knows."`
	Host       HostCmd       `cmd:"" help:"The hosts themselves: mesh-host releases the controller keeps, and the hosts upgrading themselves to one (canary, batches, rolled back on failure)."`
	Token      TokenCmd      `cmd:"" help:"One-time rights to join."`
	Serve      ServeCmd      `cmd:"" help:"The daemon: takes the lease, runs the broker, answers hosts. Prints one line beginning 'ready' when it serves."`
	Broker     BrokerCmd     `cmd:"" help:"The broker hosts dial."`
	Declare    DeclareCmd    `cmd:"" help:"Sign and send a node a hand-written declaration (a hand act: --why)."`
	Module     ModuleCmd     `cmd:"" help:"Modules: services described by manifests."`
	Settings   SettingsCmd   `cmd:"" help:"A module's settings: the mesh's layer and each node's."`
	Assign     AssignCmd     `cmd:"" help:"Put modules on a node, judged together: all or nothing, every problem listed."`
	Unassign   UnassignCmd   `cmd:"" help:"Take modules off a node; their data is retired and remembered, never forgotten."`
	Plan       PlanCmd       `cmd:"" help:"What a node would run and why."`
	Take       TakeCmd       `cmd:"" help:"On an adopted node, preview a module's cutover from what runs there now, and its digest; --yes DIGEST cuts over exactly so."`
	Logs       LogsCmd       `cmd:"" help:"A running module's log, from its host over the broker (--follow until Ctrl-C)."`
	Build      BuildCmd      `cmd:"" help:"Builds: have a holder of the build seat build a repository (or --behind, --on: a plan), and what was built, the queue, plans and builders."`
	Collection CollectionCmd `cmd:"" help:"Kept archives, held and not held by any registered manifest, and what the sweep may let go."`
	Ask        AskCmd        `cmd:"" help:"Ask a running module's tool; prints its answer (--node: the instance on that node)."`
	Push       PushCmd       `cmd:"" help:"Send a node (or every node) its declaration."`
	Converge   ConvergeCmd   `cmd:"" help:"Preview making a node converged (the mesh's whole) and, with --filter nftables, the packet filter it would own, with a digest; --yes DIGEST does exactly so."`
	Overlay    OverlayCmd    `cmd:"" help:"The mesh's private network: where each node is (place), and the network as computed (show)."`
	Adopt      AdoptCmd      `cmd:"" help:"Return a converged node to adopted: the mesh's packet filter removed; what was taken stays taken."`
	Upgrade    UpgradeCmd    `cmd:"" help:"Move a module to its current version: preview, roll-out (canary, batches, health-gated, rolled back on failure), rollback or record."`
	Operator   OperatorCmd   `cmd:"" help:"The operator key, kept off the mesh: every secret is also sealed to it."`
	Secret     SecretCmd     `cmd:"" help:"Secrets: sealed with age to their node and the operator key, never stored plain."`
	Licence    LicenceCmd    `cmd:"" help:"Licences: access to a model or an outside service under the name a person calls it, sealed to the modules that hold it."`
	Status     StatusCmd     `cmd:"" help:"What is wrong, what is quiet, what is out of date."`
	Conditions ConditionsCmd `cmd:"" help:"Open conditions, urgent first (show, silence, history)."`
	Doctor     DoctorCmd     `cmd:"" help:"The self-check: the last verdict (run, probes, signals)."`
	Healers    HealersCmd    `cmd:"" help:"The healers, what they did lately, and their brake (release)."`
	HandActs   HandActsCmd   `cmd:"" name:"hand-acts" help:"What was done by hand lately, and which causes repeat (record)."`
	Durations  DurationsCmd  `cmd:"" help:"Measured durations (apply, heartbeat, tier, build, start): count, p50, p90, p99, max."`
	Board      BoardCmd      `cmd:"" help:"The three questions as a web page that holds nothing."`
	API        APICmd        `cmd:"" name:"api" help:"Assign, unassign and the read views over HTTP, to bearers of a token the OpenID Connect issuer (--issuer) signed."`
	Seat       SeatCmd       `cmd:"" help:"Seats: hand one over (NAME --to NODE/MODULE), add a holder (--add), list or rename them."`
	Provision  ProvisionCmd  `cmd:"" help:"Provisions: which provider a node's consumers get one from (pin, unpin), and new credentials (rotate)."`
	Retire     RetireCmd     `cmd:"" help:"Providers waiting for a person to approve a retirement (approve, reject)."`
	Cleanup    CleanupCmd    `cmd:"" help:"Retired consumers and data sets per provider (delete)."`
	Data       DataCmd       `cmd:"" help:"Every data set every machine declares: size, preciousness, state, last backup, backup holder."`
	Store      StoreCmd      `cmd:"" help:"The stores as a whole: back them up, restore a backup, copy them onto PostgreSQL or back."`
	Install    InstallCmd    `cmd:"" help:"Run serve as a systemd service: its unit written to /etc/systemd/system, the data dir /var/lib/mesh-controller made (0700), the unit enabled (not started)."`
	Uninstall  UninstallCmd  `cmd:"" help:"Disable and stop the systemd service and remove its unit; the data dir is kept."`

	// Completion is the shell's: it prints a script, and the binary
	// answers the lines that script hands it (clirun).
	Completion clirun.CompletionCmd `cmd:"" help:"Print the script that has bash, zsh or fish complete mesh-controller's commands, flags, and node and module names ('mesh-controller completion bash > /etc/bash_completion.d/mesh-controller')."`

	Former
}

// Former are the spellings the commands had before they were grouped by
// noun (build queue was queue, store backup was backup…): still run, so
// that no script breaks, and hidden, so that help shows one way to say each.
type Former struct {
	Builds  BuildsCmd  `cmd:"" hidden:"" help:"The former spelling of build list."`
	Queue   QueueCmd   `cmd:"" hidden:"" help:"The former spelling of build queue."`
	Cancel  CancelCmd  `cmd:"" hidden:"" help:"The former spelling of build cancel."`
	Clear   ClearCmd   `cmd:"" hidden:"" help:"The former spelling of build clear."`
	Rebuild RebuildCmd `cmd:"" hidden:"" help:"The former spelling of build rebuild."`
	Replay  ReplayCmd  `cmd:"" hidden:"" help:"The former spelling of build replay."`
	Kill    KillCmd    `cmd:"" hidden:"" help:"The former spelling of build kill."`
	Pause   PauseCmd   `cmd:"" hidden:"" help:"The former spelling of build pause."`
	Resume  ResumeCmd  `cmd:"" hidden:"" help:"The former spelling of build resume."`
	Builder BuilderCmd `cmd:"" hidden:"" help:"The former group of build issue."`
	Plans   PlansCmd   `cmd:"" hidden:"" help:"The former spelling of build plans."`
	HandAct HandActCmd `cmd:"" hidden:"" name:"hand-act" help:"The former group of hand-acts record."`
	Seats   SeatsCmd   `cmd:"" hidden:"" help:"The former spelling of seat list."`
	Pin     PinCmd     `cmd:"" hidden:"" help:"The former spelling of provision pin."`
	Unpin   UnpinCmd   `cmd:"" hidden:"" help:"The former spelling of provision unpin."`
	Rotate  RotateCmd  `cmd:"" hidden:"" help:"The former spelling of provision rotate."`
	Backup  BackupCmd  `cmd:"" hidden:"" help:"The former spelling of store backup."`
	Restore RestoreCmd `cmd:"" hidden:"" help:"The former spelling of store restore."`
}

// Env is what every Run is given: the application and where to print.
type Env struct {
	// Ctx ends on SIGINT or SIGTERM.
	Ctx    context.Context
	App    *app.Controller
	Stdout io.Writer
	Stderr io.Writer
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// run parses args, runs the chosen command, and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	var cli CLI
	var a *app.Controller
	var st *app.Stores
	return clirun.Program{
		Name:    "mesh-controller",
		Options: kongOptions(),
		Hint:    hint,
		Bind: func(ctx context.Context) any {
			a = app.New(cli.Globals.Data)
			a.Broker = cli.Globals.Broker
			a.Version = version
			return &Env{Ctx: ctx, App: a, Stdout: stdout, Stderr: stderr}
		},
		// The stores are opened once, here, for the commands that ask for
		// a service; each service is given only the stores it names.
		Provide: func(ctx context.Context) []any {
			return []any{
				func() *app.Stores { st = a.OpenStores(ctx); return st },
				func(st *app.Stores) *app.Nodes { return app.NewNodes(a, st) },
				func(st *app.Stores) *app.Modules { return app.NewModules(a, st) },
				func(st *app.Stores) *app.Seats { return app.NewSeats(a, st) },
				func(st *app.Stores) *app.Secrets { return app.NewSecrets(a, st) },
				func(st *app.Stores) *app.Licences { return app.NewLicences(a, st) },
				func(st *app.Stores) *app.Builds { return app.NewBuilds(a, st) },
				func(st *app.Stores) *app.Health { return app.NewHealth(a, st) },
				func(st *app.Stores) *app.Copies { return app.NewCopies(a, st) },
				func(st *app.Stores) *app.Server { return app.NewServer(a, st) },
				func(st *app.Stores) app.API { return app.NewAPI(a, st) },
			}
		},
		Done: func() {
			if st != nil {
				st.Close()
			}
		},
		// What a node or module argument (predictor:"node", "module")
		// completes with.
		Predictors: map[string]complete.Predictor{
			"node":   knownNames(func(n app.Names) []string { return n.Nodes }),
			"module": knownNames(func(n app.Names) []string { return n.Modules }),
		},
	}.Run(&cli, args, stdout, stderr)
}

// knownNames completes a node's or a module's name from the inventory of
// the data dir the line names (--data), else the environment's: the
// shell asks before anything is parsed. Nothing is offered when there is
// no store yet or it cannot be read at once.
func knownNames(pick func(app.Names) []string) complete.Predictor {
	return complete.PredictFunc(func(complete.Args) []string {
		// The whole line: the arguments a predictor is given begin at its
		// command, after a --data given before it.
		data, words := os.Getenv("MESH_DATA"), strings.Fields(os.Getenv("COMP_LINE"))
		for i, w := range words {
			if v, ok := strings.CutPrefix(w, "--data="); ok {
				data = v
			} else if w == "--data" && i+1 < len(words) {
				data = words[i+1]
			}
		}
		if data == "" {
			data = app.DefaultDataDir(os.Getenv, os.Geteuid())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		names, err := app.New(data).KnownNames(ctx)
		if err != nil {
			return nil
		}
		return pick(names)
	})
}

// description opens the binary's help; it says the exit statuses every
// command keeps, and the one rule for an input file that is not there.
const description = "The control plane of a mesh: one binary, one SQLite store per context.\n\n" +
	"Exit status: 0 when done; 1 when a command was refused or found a problem; " +
	"2 for a usage error: an unknown command or flag, a missing or invalid argument, " +
	"or an input file that does not exist (found before any store is touched)."

// kongOptions are the parser's options besides those clirun sets; tests
// build the same parser to walk its commands.
func kongOptions() []kong.Option {
	return []kong.Option{
		kong.Description(description),
		kong.Vars{"data_dir": app.DefaultDataDir(os.Getenv, os.Geteuid()), "listen": app.DefaultListen, "version": versionLine(),
			"config_file": service.Controller.ConfigFile()},
		kong.Configuration(clirun.TOML),
		kong.Help(helpWithStores),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true}),
	}
}

// timeShown is how times are printed for a person: UTC, to the second.
const timeShown = "2006-01-02 15:04:05Z"

// printJSON prints v as one indented JSON document.
func printJSON(w io.Writer, v any) error { return app.WriteJSON(w, v) }

// shown is a value given from outside (a token's subject, a person's why)
// as a line of text prints it: as it is when every character prints, else
// quoted with Go's escapes, so that a line break, a tab, an ANSI escape or
// any other control or format character can never make a line or a column
// that is not there.
func shown(s string) string {
	if utf8.ValidString(s) && !strings.ContainsFunc(s, func(r rune) bool { return !strconv.IsPrint(r) }) {
		return s
	}
	return strconv.Quote(s)
}

// Name is a name (node, module, seat…) checked while parsing, so an invalid
// one is a usage error and no store is touched.
type Name string

// Decode implements kong.MapperValue.
func (n *Name) Decode(ctx *kong.DecodeContext) error {
	var s string
	if err := ctx.Scan.PopValueInto("name", &s); err != nil {
		return err
	}
	if err := app.CheckName(s); err != nil {
		return err
	}
	*n = Name(s)
	return nil
}
