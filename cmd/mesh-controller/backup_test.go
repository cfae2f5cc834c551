package main

import (
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/rogpeppe/go-internal/testscript"
)

// cmdDamage flips the bits of one byte of a file, as a bad disk or a cut
// copy would: damage FILE OFFSET (a negative offset counts from the end).
func cmdDamage(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: damage FILE OFFSET")
	}
	path := ts.MkAbs(args[0])
	b, err := os.ReadFile(path)
	ts.Check(err)
	at, err := strconv.Atoi(args[1])
	ts.Check(err)
	if at < 0 {
		at += len(b)
	}
	if at < 0 || at >= len(b) {
		ts.Fatalf("%s has %d bytes: no offset %s", args[0], len(b), args[1])
	}
	b[at] ^= 0xff
	ts.Check(os.WriteFile(path, b, 0o600))
}

// cmdWaitFile waits (up to 20s) until a file matching a glob exists, for what
// the daemon makes on its own time: waitfile GLOB.
func cmdWaitFile(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: waitfile GLOB")
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		m, err := filepath.Glob(ts.MkAbs(args[0]))
		ts.Check(err)
		if len(m) > 0 {
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("waited 20s for %s", args[0])
		}
		time.Sleep(20 * time.Millisecond)
	}
}
