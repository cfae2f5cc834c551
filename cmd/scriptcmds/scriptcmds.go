// Package scriptcmds holds the testscript commands both binaries' scenarios
// use: exits (a command must fail with exactly this status), perm (a
// file's permission bits), absent (a text no file holds), grab (a value
// from the last output, for the next command) and sdnotify (systemd's side
// of sd_notify).
package scriptcmds

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"

	"github.com/rogpeppe/go-internal/testscript"
)

// Cmds are the commands, by name, for testscript.Params.Cmds.
var Cmds = map[string]func(ts *testscript.TestScript, neg bool, args []string){
	"exits":    Exits,
	"perm":     Perm,
	"absent":   Absent,
	"grab":     Grab,
	"sdnotify": SDNotify,
}

// Grab sets a variable to the first group of a regular expression matched
// (multi-line) in the last command's stdout, so a scenario can give back
// what a command printed, such as a preview's digest: grab NAME REGEXP.
func Grab(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: grab NAME REGEXP")
	}
	re, err := regexp.Compile("(?m)" + args[1])
	ts.Check(err)
	m := re.FindStringSubmatch(ts.ReadFile("stdout"))
	if len(m) < 2 {
		ts.Fatalf("grab %s: no match for %q with a group in stdout", args[0], args[1])
	}
	ts.Setenv(args[0], m[1])
	ts.Logf("%s=%s", args[0], m[1])
}

// Absent fails if any file under a directory holds a text: absent DIR TEXT.
func Absent(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: absent DIR TEXT")
	}
	n := 0
	err := filepath.WalkDir(ts.MkAbs(args[0]), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		n++
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.Contains(b, []byte(args[1])) {
			ts.Fatalf("%s holds %q", path, args[1])
		}
		return nil
	})
	ts.Check(err)
	if n == 0 {
		ts.Fatalf("%s holds no file: nothing was searched", args[0])
	}
}

// Exits runs a command that must fail with exactly this status, keeping its
// output for stdout and stderr: exits N COMMAND ARGS...
func Exits(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: exits N COMMAND [ARGS...]")
	}
	want, err := strconv.Atoi(args[0])
	ts.Check(err)
	err = ts.Exec(args[1], args[2:]...)
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		ts.Fatalf("%s: want exit status %d, got %v", args[1], want, err)
	}
	if ee.ExitCode() != want {
		ts.Fatalf("%s: exit status %d, want %d", args[1], ee.ExitCode(), want)
	}
}

// Perm checks a file's permission bits: perm FILE 0600 (! perm: not those).
func Perm(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 2 {
		ts.Fatalf("usage: perm FILE MODE")
	}
	fi, err := os.Stat(ts.MkAbs(args[0]))
	ts.Check(err)
	want, err := strconv.ParseUint(args[1], 8, 32)
	ts.Check(err)
	got := fi.Mode().Perm()
	if (uint64(got) == want) == neg {
		ts.Fatalf("%s has mode %#o; want %s%#o", args[0], got, map[bool]string{true: "not ", false: ""}[neg], want)
	}
	fmt.Fprintf(ts.Stdout(), "%s %#o\n", args[0], got)
}

// With returns Cmds plus more.
func With(more map[string]func(ts *testscript.TestScript, neg bool, args []string)) map[string]func(ts *testscript.TestScript, neg bool, args []string) {
	all := map[string]func(ts *testscript.TestScript, neg bool, args []string){}
	for k, v := range Cmds {
		all[k] = v
	}
	for k, v := range more {
		all[k] = v
	}
	return all
}
