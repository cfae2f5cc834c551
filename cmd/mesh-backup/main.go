// Command mesh-backup is the reference backup module: a module a host runs
// (the backup module's run.command, "bin/backup daemon") on the backup
// seat's holder. It keeps one restic repository per node beneath its
// repository data set, serves them to their nodes through a restic REST
// server, says when each backup line is due, prunes and drills restores.
// Run as a module it needs no arguments: its environment says everything.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/alecthomas/kong"

	"mesh-controller/app/backupseat"
	"mesh-controller/app/protocol"
	"mesh-controller/cmd/clirun"
)

// version is stamped at link time: -ldflags "-X main.version=v1.2.3".
var version string

// CLI is mesh-backup's command line: daemon (the default), whose flags
// each default to what a host gives a module, and version.
type CLI struct {
	Daemon DaemonCmd `cmd:"" default:"1" help:"Serve the mesh's backups (the default)."`
	// Versioned is version and --version: the same line.
	clirun.Versioned
}

// DaemonCmd serves until SIGINT or SIGTERM.
type DaemonCmd struct {
	Broker       string        `env:"MESH_BROKER" required:"" help:"The broker's URL (a host sets MESH_BROKER)."`
	Creds        string        `env:"MESH_BROKER_CREDS" required:"" type:"existingfile" help:"Its broker user's .creds file (a host sets MESH_BROKER_CREDS)."`
	Node         string        `env:"MESH_NODE" required:"" help:"The node it runs on."`
	Module       string        `env:"MESH_MODULE" default:"backup" help:"Its module's name (a host sets MESH_MODULE)."`
	Repositories string        `env:"MESH_DATA_REPOSITORY" required:"" help:"Its repository data set: one restic repository per node beneath it."`
	Scratch      string        `env:"MESH_DATA_CACHE" help:"Where drills restore (its cache data set; default: a drills directory beside the repositories)."`
	Secrets      string        `env:"MESH_SECRETS_DIR" required:"" type:"existingdir" help:"Its secrets directory, which holds repository_password."`
	Lines        string        `env:"MESH_BACKUP_LINES" help:"The file its host writes its backup lines to (a host sets it on the backup seat's holder alone)."`
	Settings     string        `env:"MESH_SETTINGS" help:"Its settings file: address and port its REST server listens on."`
	Port         int           `env:"MESH_PORT_REST" help:"The port its REST server listens on (its manifest's port rest; else settings, else 8420)."`
	Listen       string        `help:"Where its REST server listens, host:port (default: its settings' address and port, else every address)."`
	Tick         time.Duration `env:"BACKUP_TICK" default:"15s" help:"How often it reads its lines and looks for what is due."`
}

// Env is what Run is given.
type Env struct {
	Ctx    context.Context
	Stderr io.Writer
}

// Run serves the backups.
func (c *DaemonCmd) Run(env *Env) error {
	if c.Lines == "" {
		// Assigned beside the holder (a seat handed over, a spare): its
		// host starts it again with its lines when it takes the seat.
		fmt.Fprintf(env.Stderr, "mesh-backup: %s does not hold the backup seat (no MESH_BACKUP_LINES): idle until it does\n", c.Node)
		<-env.Ctx.Done()
		return nil
	}
	pw, err := os.ReadFile(filepath.Join(c.Secrets, "repository_password"))
	if errors.Is(err, fs.ErrNotExist) {
		return errors.New("no repository_password in its secrets: accept it (mesh-controller secret accept NODE backup repository_password --from FILE)")
	} else if err != nil {
		return err
	}
	password := protocol.NewSecret([]byte(strings.TrimRight(string(pw), "\r\n")))
	clear(pw)
	listen, err := c.listen()
	if err != nil {
		return err
	}
	scratch := c.Scratch
	if scratch == "" {
		scratch = filepath.Join(filepath.Dir(filepath.Clean(c.Repositories)), "drills")
	}
	return backupseat.New(backupseat.Options{Broker: c.Broker, Creds: c.Creds, Node: c.Node, Module: c.Module,
		Repositories: c.Repositories, Scratch: scratch, Password: password, Lines: c.Lines, Listen: listen, Tick: c.Tick,
		Log: env.Stderr}).Serve(env.Ctx)
}

// listen is where the REST server listens: --listen, else the settings'
// address (every address when none) and the port its manifest, its
// settings or the default names, as the controller tells nodes.
func (c *DaemonCmd) listen() (string, error) {
	if c.Listen != "" {
		return c.Listen, nil
	}
	var s struct {
		Address string `json:"address"`
		Port    int    `json:"port"`
	}
	if c.Settings != "" {
		if b, err := os.ReadFile(c.Settings); err == nil {
			if err := json.Unmarshal(b, &s); err != nil {
				return "", errors.New("its settings are not a JSON object: " + err.Error())
			}
		}
	}
	port := protocol.DefaultBackupPort
	switch {
	case c.Port > 0:
		port = c.Port
	case s.Port > 0:
		port = s.Port
	}
	return net.JoinHostPort(s.Address, strconv.Itoa(port)), nil
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	var cli CLI
	return clirun.Program{
		Name: "mesh-backup",
		Options: []kong.Option{kong.Description("The reference backup module, run by a host on the backup seat's holder: keeps every node's restic repository, says what is due, prunes and drills restores."),
			kong.Vars{"version": clirun.VersionLine("mesh-backup", version)}},
		Bind:    func(ctx context.Context) any { return &Env{Ctx: ctx, Stderr: stderr} },
		RunBare: true,
	}.Run(&cli, args, stdout, stderr)
}
