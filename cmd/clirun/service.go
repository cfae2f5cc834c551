package clirun

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"mesh-controller/app/service"
)

// ServiceFlags are install's and uninstall's flags, the same in every
// binary that runs as a service.
type ServiceFlags struct {
	DestDir     string `name:"destdir" type:"path" placeholder:"DIR" help:"Write beneath DIR instead of / (a package's staging tree, a test): DIR/etc/systemd/system, DIR/var/lib; systemctl is not run."`
	DryRun      bool   `name:"dry-run" help:"Print each step without doing it."`
	NoSystemctl bool   `name:"no-systemctl" help:"Leave systemctl (daemon-reload, enable or disable) to a person: each command is printed (left anyway where systemd is not running)."`
}

// Options are the service's options for program running bin (for
// uninstall, bin is "").
func (f ServiceFlags) Options(p service.Program, bin string, stdout, stderr io.Writer) service.Options {
	return service.Options{Unit: service.Unit{Program: p, Bin: bin}, DestDir: f.DestDir, DryRun: f.DryRun, NoSystemctl: f.NoSystemctl,
		Out: stdout, Next: stderr, Euid: os.Geteuid()}
}

// ServiceBin is the binary a unit runs: --bin, else this executable (its
// links followed, so that the unit names the file itself); refused as a
// usage error when it is not an executable file.
func ServiceBin(bin string) (string, error) {
	if bin == "" {
		exe, err := os.Executable()
		if err != nil {
			return "", fmt.Errorf("find this executable: %w; give --bin PATH", err)
		}
		if bin, err = filepath.EvalSymlinks(exe); err != nil {
			return "", fmt.Errorf("find this executable: %w; give --bin PATH", err)
		}
	}
	fi, err := os.Stat(bin)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return "", UsageError{Msg: fmt.Sprintf("--bin %s is not an executable file: give the path the service should run", bin)}
	}
	return bin, nil
}
