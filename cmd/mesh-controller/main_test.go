package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"mesh-controller/embedded/sqlite"
)

func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){"mesh-controller": main})
}

// TestScripts runs every scenario under testdata/: one behaviour each,
// against the real binary and real stores under the scenario's $WORK.
func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Dir: "testdata",
		Setup: func(e *testscript.Env) error {
			e.Setenv("MESH_DATA", e.WorkDir+"/data")
			e.Setenv("HOME", e.WorkDir+"/home")
			e.Setenv("XDG_DATA_HOME", "")
			return nil
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"sql":   cmdSQL,
			"perm":  cmdPerm,
			"exits": cmdExits,
		},
	})
}

// cmdSQL runs one SQL statement on a store file, for scenarios that must
// damage a store the way a newer binary or a hand edit would: sql FILE STATEMENT.
func cmdSQL(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 2 {
		ts.Fatalf("usage: sql FILE STATEMENT")
	}
	db, err := sqlite.Open(context.Background(), sqlite.Location{Context: "test", DSN: ts.MkAbs(args[0])}, true)
	ts.Check(err)
	defer db.Close()
	_, err = db.Writer.Exec(args[1])
	if neg {
		if err == nil {
			ts.Fatalf("sql succeeded unexpectedly")
		}
		return
	}
	ts.Check(err)
}

// cmdPerm checks a file's permission bits: perm FILE 0600.
func cmdPerm(ts *testscript.TestScript, neg bool, args []string) {
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

// cmdExits runs a command that must fail with exactly this status, keeping
// its output for stdout and stderr: exits N COMMAND ARGS...
func cmdExits(ts *testscript.TestScript, neg bool, args []string) {
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
