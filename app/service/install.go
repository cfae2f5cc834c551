package service

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// ErrNotRoot means install or uninstall was asked to change the machine
// by a user who cannot.
var ErrNotRoot = errors.New("needs root")

// Options says how to install or uninstall one program's service.
type Options struct {
	Unit Unit
	// DestDir, when set, is where the machine's / is taken to be: the unit
	// and the data dir are made beneath it, and systemctl is not run (a
	// package's staging tree, a test).
	DestDir string
	// DryRun prints each step without doing it.
	DryRun bool
	// NoSystemctl leaves systemctl to the person (it is left anyway where
	// systemd is not running, or with DestDir).
	NoSystemctl bool
	// Out is told each step, one line each, as done (or, with DryRun, as
	// it would be); Next is told what is left to the person.
	Out, Next io.Writer
	// Euid is the user asking; 0 is root.
	Euid int
}

// Install writes the unit (0644) to /etc/systemd/system, makes the data
// dir (0700), and has systemd reload its units and enable this one. It
// does not start it: a host joins first, a controller may be configured.
func Install(o Options) error {
	p := o.Unit.Program
	text, err := o.Unit.Render()
	if err != nil {
		return err
	}
	if err := o.mayChange("install"); err != nil {
		return err
	}
	unitFile, dataDir := o.path(UnitDir, p.UnitName()), o.path(p.DataDir())
	cmdline := strings.Join(append(append([]string{o.Unit.Bin}, p.command()...), o.Unit.Args...), " ")
	if o.DryRun {
		o.step("would write %s (0644), running %s", unitFile, cmdline)
		o.step("would make %s (0700) if missing", dataDir)
	} else {
		if err := writeUnit(unitFile, text); err != nil {
			return err
		}
		o.step("wrote %s (0644), running %s", unitFile, cmdline)
		made, err := makeDataDir(dataDir)
		if err != nil {
			return err
		}
		o.step("%s", made)
	}
	systemctl := o.systemctl([]string{"daemon-reload"}, []string{"enable", p.UnitName()})
	if err := systemctl(); err != nil {
		return err
	}
	if p == Host {
		fmt.Fprintf(o.Next, "next: join, if this host has not: mesh-host join --broker URL --token TOKEN --node NAME (as root: its keys go to %s)\n", p.DataDir())
	}
	fmt.Fprintf(o.Next, "next: systemctl start %s (journalctl -u %s shows its log; flags it should run with go in %s)\n",
		p.UnitName(), p.UnitName(), p.ConfigFile())
	return nil
}

// Uninstall disables and stops the service, removes its unit and has
// systemd reload its units. The data dir is kept, and said so.
func Uninstall(o Options) error {
	p := o.Unit.Program
	if err := o.mayChange("uninstall"); err != nil {
		return err
	}
	unitFile, dataDir := o.path(UnitDir, p.UnitName()), o.path(p.DataDir())
	if err := o.systemctl([]string{"disable", "--now", p.UnitName()})(); err != nil {
		return err
	}
	_, err := os.Lstat(unitFile)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		o.step("no %s: nothing to remove", unitFile)
	case err != nil:
		return err
	case o.DryRun:
		o.step("would remove %s", unitFile)
	default:
		if err := os.Remove(unitFile); err != nil {
			return fmt.Errorf("remove the unit: %w", err)
		}
		o.step("removed %s", unitFile)
	}
	if err := o.systemctl([]string{"daemon-reload"})(); err != nil {
		return err
	}
	what := "the stores and the identity key"
	if p == Host {
		what = "the host's keys and credentials"
	}
	if _, err := os.Stat(dataDir); err == nil {
		o.step("kept %s: %s stay there; remove it by hand once nothing needs them", dataDir, what)
	} else {
		o.step("kept nothing: %s is not there", dataDir)
	}
	return nil
}

// mayChange refuses to change the machine for a user who is not root.
func (o Options) mayChange(verb string) error {
	if o.Euid == 0 || o.DestDir != "" || o.DryRun {
		return nil
	}
	return fmt.Errorf("%s %w: it writes %s and %s; run it as root (sudo %s %s), or give --destdir DIR to write beneath DIR, or --dry-run to see each step",
		verb, ErrNotRoot, UnitDir, o.Unit.Program.DataDir(), o.Unit.Program, verb)
}

// path is a machine's path beneath DestDir.
func (o Options) path(parts ...string) string {
	return filepath.Join(append([]string{"/", o.DestDir}, parts...)...)
}

func (o Options) step(format string, args ...any) { fmt.Fprintf(o.Out, format+"\n", args...) }

// systemctl runs each systemctl command in turn, or says why it does not
// and what the person should run.
func (o Options) systemctl(cmds ...[]string) func() error {
	return func() error {
		lines := make([]string, len(cmds))
		for i, c := range cmds {
			lines[i] = "systemctl " + strings.Join(c, " ")
		}
		why := ""
		switch {
		case o.DryRun:
			for _, l := range lines {
				o.step("would run %s", l)
			}
			return nil
		case o.DestDir != "":
			why = "the unit is beneath --destdir"
		case o.NoSystemctl:
			why = "--no-systemctl"
		case !systemdRunning():
			why = "systemd is not running here (no /run/systemd/system)"
		}
		if why != "" {
			o.step("skipped %s: %s", strings.Join(lines, "; "), why)
			fmt.Fprintf(o.Next, "next: on the machine, under systemd: %s\n", strings.Join(lines, "; "))
			return nil
		}
		for i, c := range cmds {
			out, err := exec.Command("systemctl", c...).CombinedOutput()
			if err != nil {
				return fmt.Errorf("%s: %v: %s", lines[i], err, bytes.TrimSpace(out))
			}
			o.step("ran %s", lines[i])
		}
		return nil
	}
}

// systemdRunning is sd_booted(3): systemd is this machine's init.
func systemdRunning() bool {
	fi, err := os.Lstat("/run/systemd/system")
	return err == nil && fi.IsDir()
}

// writeUnit writes the unit through a temporary file beside it, so that
// systemd never reads half of one.
func writeUnit(path string, text []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("make the unit's directory: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, text, 0o644); err != nil {
		return fmt.Errorf("write the unit: %w", err)
	}
	if err := os.Chmod(tmp, 0o644); err != nil { // whatever the umask
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write the unit: %w", err)
	}
	return nil
}

// makeDataDir makes the data dir 0700 (its parents 0755), or makes the one
// there 0700; it says which.
func makeDataDir(dir string) (string, error) {
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
			return "", fmt.Errorf("make the data dir: %w", err)
		}
		if err := os.Mkdir(dir, 0o700); err != nil {
			return "", fmt.Errorf("make the data dir: %w", err)
		}
		if err := os.Chmod(dir, 0o700); err != nil {
			return "", err
		}
		return fmt.Sprintf("made %s (0700)", dir), nil
	case err != nil:
		return "", err
	case !fi.IsDir():
		return "", fmt.Errorf("the data dir %s is not a directory: move it away", dir)
	case fi.Mode().Perm() != 0o700:
		if err := os.Chmod(dir, 0o700); err != nil {
			return "", fmt.Errorf("make the data dir 0700: %w", err)
		}
		return fmt.Sprintf("made %s 0700 (it was %04o); what is in it is kept", dir, fi.Mode().Perm()), nil
	}
	return fmt.Sprintf("kept %s (0700) and what is in it", dir), nil
}
