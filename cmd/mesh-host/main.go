// Command mesh-host is the reference host: it joins a mesh with a one-time
// token and applies the declarations its controller signs. This package holds
// kong command structs only; each Run calls app/host.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/alecthomas/kong"

	"mesh-controller/app/host"
	"mesh-controller/app/logger"
	"mesh-controller/app/process"
	"mesh-controller/app/protocol"
	"mesh-controller/app/service"
	"mesh-controller/cmd/clirun"
)

// version is stamped at link time: -ldflags "-X main.version=v1.2.3".
var version string

// CLI is every command mesh-host has.
type CLI struct {
	// ConfigFile is read before the other flags are resolved: what the
	// service's unit would carry as flags, kept in a file.
	ConfigFile clirun.ConfigFile `name:"config-file" env:"MESH_HOST_CONFIG_FILE" default:"${config_file}" placeholder:"FILE" help:"A TOML file of flag values (heartbeat = \"5s\"; [run] self-upgrade = false); flags and their variables win over it, a key that is no flag is refused (default ${config_file}, read when it is there)."`

	Join JoinCmd `cmd:"" help:"Make this host's keys and join a mesh with a one-time token."`
	Run  RunCmd  `cmd:"" help:"Beat, report, and apply the declarations the controller signs."`
	// Versioned is version and --version: the same line.
	clirun.Versioned
	BackupDone BackupDoneCmd `cmd:"" name:"backup-done" help:"Tell the controller a backup line was done (for the backup module on the backup seat's holder)."`
	Simulate   SimulateCmd   `cmd:"" help:"Play every host of a token file from one process, each with its own keys and connection, for load measurement."`
	Install    InstallCmd    `cmd:"" help:"Run 'run --root /' as a systemd service: its unit written to /etc/systemd/system, the state dir /var/lib/mesh-host made (0700), the unit enabled (not started)."`
	Uninstall  UninstallCmd  `cmd:"" help:"Disable and stop the systemd service and remove its unit; the state dir is kept."`

	// Completion is the shell's: it prints a script, and the binary
	// answers the lines that script hands it (clirun).
	Completion clirun.CompletionCmd `cmd:"" help:"Print the script that has bash, zsh or fish complete mesh-host's commands and flags ('mesh-host completion bash > /etc/bash_completion.d/mesh-host')."`
}

// SimulateCmd is mesh-host simulate.
type SimulateCmd struct {
	Broker    string        `required:"" placeholder:"URL" help:"The broker to dial."`
	Tokens    string        `required:"" type:"existingfile" placeholder:"FILE" help:"'name token' lines, as 'mesh-controller token issue --count' writes them."`
	Heartbeat time.Duration `default:"10s" help:"The interval between each host's heartbeats."`
	ApplyMS   int           `name:"apply-ms" default:"0" help:"How long each simulated apply takes, in milliseconds."`
	For       time.Duration `help:"Stop this long after every host has joined or failed to (default: until SIGINT or SIGTERM)."`
	Report    time.Duration `default:"5s" help:"How often to print how many hosts are joined, beating and applied."`
	JSON      bool          `name:"json" help:"Print the summary as one JSON object at the end."`
	Joins     int           `default:"1024" help:"How many joins are in flight at once: as many as the controller's broker admits without credentials (-1: no bound, every host dials at once)."`
	// CPUProfile measures where the simulator's own time goes: it shares
	// the machine with the controller it loads.
	CPUProfile string `name:"cpu-profile" placeholder:"FILE" help:"Write a CPU profile of the simulator to FILE until it stops (go tool pprof reads it)."`
}

// Run simulates until stopped.
func (c *SimulateCmd) Run(env *Env) error {
	ctx := env.Ctx
	stopProfile, err := clirun.CPUProfile(c.CPUProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	out := env.Stderr
	s, err := host.Simulate(ctx, host.SimOptions{Broker: c.Broker, TokensFile: c.Tokens, Heartbeat: c.Heartbeat,
		ApplyDelay: time.Duration(c.ApplyMS) * time.Millisecond, Report: c.Report, Joins: c.Joins, For: c.For, Out: out})
	if err != nil {
		return err
	}
	if c.JSON {
		b, _ := json.Marshal(s)
		fmt.Fprintf(env.Stdout, "%s\n", b)
	}
	if s.JoinFailed > 0 {
		return fmt.Errorf("%d of %d hosts could not join", s.JoinFailed, s.Hosts)
	}
	return nil
}

// BackupDoneCmd is mesh-host backup-done.
type BackupDoneCmd struct {
	State string    `default:"${state_dir}" type:"path" placeholder:"DIR" help:"The state dir made by join."`
	Line  string    `arg:"" placeholder:"NODE/MODULE/DATA" help:"The backup line done."`
	At    time.Time `help:"When the backup was taken (RFC 3339); now if not given."`
}

// Run reports the backup.
func (c *BackupDoneCmd) Run(env *Env) error {
	parts := strings.Split(c.Line, "/")
	if len(parts) != 3 {
		return fmt.Errorf("%q is not NODE/MODULE/DATA", c.Line)
	}
	if err := joinedDir(c.State); err != nil {
		return err
	}
	st, err := host.Load(c.State)
	if err != nil {
		return err
	}
	at := c.At
	if at.IsZero() {
		at = time.Now()
	}
	if err := host.BackupDone(env.Ctx, st, protocol.BackupBody{Node: parts[0], Module: parts[1], Data: parts[2], At: at.UTC()}); err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "backup of %s at %s recorded\n", c.Line, at.UTC().Format(time.RFC3339))
	return nil
}

// Env is what every Run is given.
type Env struct {
	Ctx    context.Context
	Stdout io.Writer
	Stderr io.Writer
}

// JoinCmd is mesh-host join.
type JoinCmd struct {
	Broker string `required:"" placeholder:"URL" help:"The broker to dial (see 'mesh-controller broker show'); a cluster's servers separated by commas. The controller's answer gives every server, which the host dials from then on."`
	Token  string `required:"" help:"The one-time token from 'mesh-controller token issue'."`
	Node   string `required:"" help:"The node's name, as recorded by the controller."`
	State  string `default:"${state_dir}" type:"path" placeholder:"DIR" help:"Where the host keeps its keys and credentials (made 0700, with its parents, when missing): root's is the service's."`
}

// Run joins.
func (c *JoinCmd) Run(env *Env) error {
	st, err := host.Join(env.Ctx, host.JoinOptions{Broker: c.Broker, Token: c.Token, Node: c.Node, State: c.State})
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "joined as %s; keys and credentials in %s\n", st.Node, st.Dir)
	fmt.Fprintf(env.Stderr, "next: mesh-host run --state %s --root DIR\n", st.Dir)
	return nil
}

// RunCmd is mesh-host run.
type RunCmd struct {
	State     string        `default:"${state_dir}" type:"path" placeholder:"DIR" help:"The state dir made by join."`
	Root      string        `required:"" type:"path" placeholder:"DIR" help:"Where declarations are applied: /var/lib/x becomes DIR/var/lib/x."`
	Heartbeat time.Duration `default:"10s" help:"The interval between heartbeats."`
	// FilterConfirm is short only in tests: a person's machine keeps the
	// default minute, time enough for a controller under load to answer.
	FilterConfirm time.Duration `default:"60s" help:"After applying the mesh's packet filter, how long to wait to hear the controller before rolling the filter back."`
	// ModuleUsers is on by default: a module runs as its own user where
	// the host can make one; tests turn it off to leave the machine's users
	// as they found them.
	ModuleUsers bool `default:"true" negatable:"" env:"MESH_HOST_MODULE_USERS" help:"As root, run each module as its own system user mesh-<module>, made on first start (--no-module-users: as the host's user)."`
	// OverlayInterface is on by default: the overlay needs no kernel
	// module and no other program where the host brings it up itself.
	// SelfUpgrade is on by default: a host release declared by 'host
	// upgrade' is how the mesh upgrades its hosts.
	SelfUpgrade      bool   `default:"true" negatable:"" name:"self-upgrade" env:"MESH_HOST_SELF_UPGRADE" help:"Upgrade to the host release the controller declares: the release's binary verified, this executable replaced (its directory must be the host's to write) and re-executed, the modules running on (--no-self-upgrade: such a declaration is refused, for a host a package manager upgrades)."`
	OverlayInterface bool   `default:"true" negatable:"" env:"MESH_HOST_OVERLAY_INTERFACE" help:"As root with /dev/net/tun, bring the mesh's overlay up as the WireGuard interface mesh0, in this process (userspace WireGuard; wg show reads it). Its wg-quick configuration is written in the state dir (mesh0.conf, 0600) either way: --no-overlay-interface leaves bringing it up to wg-quick. The WireGuard private key (wireguard.key in the state dir) never leaves this machine."`
	Metrics          string `placeholder:"ADDR" help:"Answer /metrics in the Prometheus text format at ADDR (host:port), a loopback address unless --metrics-public; /healthz (alive) and /readyz (connected to the broker, the last declaration given applied; 503 and why otherwise) beside it."`
	MetricsPublic    bool   `help:"Let --metrics listen on an address other machines can reach: the metrics name the modules this host runs."`
	LogFormat        string `name:"log-format" enum:"text,json" default:"text" help:"How the host's log on stderr is written: text (key=value) or json (one object a line); each line carries the node's name."`
	LogLevel         string `name:"log-level" enum:"debug,info,warn,error" default:"info" help:"The least a line of the log must matter to be written: debug also says what the hot paths do (each beat sent, each declaration received)."`
}

// Run works until SIGINT or SIGTERM.
func (c *RunCmd) Run(env *Env) (err error) {
	log, err := logger.New(env.Stderr, c.LogFormat, c.LogLevel)
	if err != nil {
		return err
	}
	metricsAt, err := clirun.ListenMetrics(c.Metrics, c.MetricsPublic)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil && metricsAt != nil {
			metricsAt.Close() // Run closes it once it runs
		}
	}()
	if err := joinedDir(c.State); err != nil {
		return err
	}
	st, err := host.Load(c.State)
	if err != nil {
		return err
	}
	r := &host.Runner{State: st, Root: c.Root, Heartbeat: c.Heartbeat, Log: log, ModuleUsers: c.ModuleUsers, FilterConfirm: c.FilterConfirm,
		NoOverlayInterface: !c.OverlayInterface, SelfUpgrade: c.SelfUpgrade, Metrics: metricsAt}
	fmt.Fprintf(env.Stdout, "running as %s, applying under %s; module logs in %s\n", st.Node, c.Root, filepath.Join(c.Root, "var", "log", "mesh"))
	if metricsAt != nil {
		fmt.Fprintf(env.Stdout, "metrics: http://%s/metrics\n", metricsAt.Addr())
	}
	return r.Run(env.Ctx)
}

// joinedDir refuses a --state dir that is not there as a usage error that
// says where one comes from: only join makes it, since a state dir without
// the keys join made is no host.
func joinedDir(dir string) error {
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return clirun.UsageError{Msg: fmt.Sprintf("--state %s does not exist: 'mesh-host join --state %s' makes it when the host joins; join first, or give the state dir join made", dir, dir)}
	case err != nil:
		return err
	case !fi.IsDir():
		return clirun.UsageError{Msg: fmt.Sprintf("--state %s is not a directory: give the state dir 'mesh-host join' made", dir)}
	}
	return nil
}

// InstallCmd is mesh-host install.
type InstallCmd struct {
	Bin string `type:"path" placeholder:"PATH" help:"The binary the unit runs (default: this executable, its links followed; /usr/bin/mesh-host when installed from the .deb)."`
	clirun.ServiceFlags
}

// Run installs the unit.
func (c *InstallCmd) Run(env *Env) error {
	bin, err := clirun.ServiceBin(c.Bin)
	if err != nil {
		return err
	}
	return service.Install(c.Options(service.Host, bin, env.Stdout, env.Stderr))
}

// UninstallCmd is mesh-host uninstall.
type UninstallCmd struct {
	clirun.ServiceFlags
}

// Run removes the unit, keeping the state dir.
func (c *UninstallCmd) Run(env *Env) error {
	return service.Uninstall(c.Options(service.Host, "", env.Stdout, env.Stderr))
}

// The main goroutine stays on the process's main thread, which forks every
// module: a host re-executing itself keeps its modules (process.Exec).
func init() { runtime.LockOSThread() }

func main() {
	os.Exit(process.ServeMainThread(func() int { return run(os.Args[1:], os.Stdout, os.Stderr) }))
}

// run parses args, runs the chosen command, and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	if version != "" {
		host.Version = version
	}
	var cli CLI
	return clirun.Program{
		Name: "mesh-host",
		Options: []kong.Option{
			kong.Description("The reference host of a mesh: joins with a token, applies signed declarations."),
			kong.ConfigureHelp(kong.HelpOptions{Compact: true}),
			kong.Vars{"state_dir": host.DefaultStateDir(os.Getenv, os.Geteuid()), "config_file": service.Host.ConfigFile(),
				"version": clirun.VersionLine("mesh-host", host.Version)},
			kong.Configuration(clirun.TOML),
		},
		Hint: func(err error) string {
			switch {
			case errors.Is(err, host.ErrRefused):
				return "ask for a new token with 'mesh-controller token issue --node NAME'"
			case errors.Is(err, host.ErrJoinedAlready):
				return "run it with 'mesh-host run', or join with a fresh --state dir"
			case errors.As(err, new(*host.UnreachableError)):
				return "check the URL ('mesh-controller broker show' prints where hosts dial), that 'mesh-controller serve' runs there, and that this machine reaches that host and port (a firewall, a listen address on loopback only)"
			}
			return ""
		},
		Bind: func(ctx context.Context) any { return &Env{Ctx: ctx, Stdout: stdout, Stderr: stderr} },
	}.Run(&cli, args, stdout, stderr)
}
