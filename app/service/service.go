// Package service owns the systemd units mesh-controller and mesh-host run
// under: their texts (embedded templates), and installing and removing them
// on a machine. The release's packages put the same texts in their .deb
// through Unit.Render.
package service

import (
	"bytes"
	"embed"
	"fmt"
	"path/filepath"
	"strings"
	"text/template"
)

// Program is a binary that runs as a service.
type Program string

// The programs with a unit.
const (
	Controller Program = "mesh-controller"
	Host       Program = "mesh-host"
)

// Programs lists every program with a unit.
var Programs = []Program{Controller, Host}

// UnitName is the unit's file name: mesh-controller.service.
func (p Program) UnitName() string { return string(p) + ".service" }

// DataDir is where the service keeps what it keeps (the controller's
// stores, the host's keys and credentials): /var/lib/<program>, made 0700.
// It is the program's default as root.
func (p Program) DataDir() string { return "/var/lib/" + string(p) }

// ConfigFile is the program's optional configuration file:
// /etc/<program>/config.toml.
func (p Program) ConfigFile() string { return "/etc/" + string(p) + "/config.toml" }

// command is what the unit runs: the controller's daemon, and the host
// applying beneath the machine's own root.
func (p Program) command() []string {
	if p == Host {
		return []string{"run", "--root", "/"}
	}
	return []string{"serve"}
}

// UnitDir is where units a machine's administrator installs go.
const UnitDir = "/etc/systemd/system"

// PackageUnitDir is where a package's units go (a .deb's).
const PackageUnitDir = "/usr/lib/systemd/system"

//go:embed units/*.service
var units embed.FS

// Unit is one program's unit as installed on one machine.
type Unit struct {
	Program Program
	// Bin is the installed binary's absolute path, named by ExecStart
	// (/usr/bin/mesh-host from the .deb).
	Bin string
	// Args are added after the program's command: --no-self-upgrade for
	// a host a package manager upgrades.
	Args []string
}

// Render is the unit file's text.
func (u Unit) Render() ([]byte, error) {
	if !filepath.IsAbs(u.Bin) {
		return nil, fmt.Errorf("unit %s: the binary %q is not an absolute path", u.Program.UnitName(), u.Bin)
	}
	src, err := units.ReadFile("units/" + u.Program.UnitName())
	if err != nil {
		return nil, fmt.Errorf("no unit for %q", u.Program)
	}
	t, err := template.New(u.Program.UnitName()).Option("missingkey=error").Parse(string(src))
	if err != nil {
		return nil, err
	}
	words := append([]string{u.Bin}, u.Program.command()...)
	words = append(words, u.Args...)
	for i, w := range words {
		words[i] = execWord(w)
	}
	var b bytes.Buffer
	err = t.Execute(&b, map[string]string{
		"Name":           u.Program.UnitName(),
		"ExecStart":      strings.Join(words, " "),
		"DataDir":        u.Program.DataDir(),
		"StateDirectory": string(u.Program),
	})
	return b.Bytes(), err
}

// execWord quotes one word of ExecStart= as systemd reads it: double
// quotes around a word with a space, quote or backslash, and a $ or %
// doubled, so a path is taken as it is and never expanded.
func execWord(w string) string {
	w = strings.NewReplacer("%", "%%", "$", "$$").Replace(w)
	if !strings.ContainsAny(w, " \t\"'\\") {
		return w
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(w) + `"`
}
