package main

import (
	"bytes"
	"os"
	"os/exec"
	"time"

	"github.com/rogpeppe/go-internal/testscript"
)

// cmdBuildRefresher builds the test manager module (app/testdata/refresher)
// to PATH, where a host's module finds it: buildrefresher PATH.
func cmdBuildRefresher(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: buildrefresher PATH")
	}
	cmd := exec.Command("go", "build", "-o", ts.MkAbs(args[0]), "../../app/testdata/refresher")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		ts.Fatalf("build the refresher: %v\n%s", err, out)
	}
}

// cmdWaitSame waits (up to 20s) until FILE holds exactly WANT's bytes, for
// what a host writes on its own time: waitsame FILE WANT.
func cmdWaitSame(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: waitsame FILE WANT")
	}
	want, err := os.ReadFile(ts.MkAbs(args[1]))
	ts.Check(err)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if got, err := os.ReadFile(ts.MkAbs(args[0])); err == nil && bytes.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("waited 20s for %s to hold what %s holds", args[0], args[1])
		}
	}
}
