package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"mesh-controller/app/apptest"
	"mesh-controller/app/host"
	"mesh-controller/app/host/holdtest"
)

// cmdHostRun joins a real host with the token in TOKEN-FILE through the
// serving controller's broker and runs it (in this test process) until the
// scenario ends: hostrun NODE TOKEN-FILE. $ROOT_NODE is its root. It
// returns once the controller has the host's facts (those of when it
// connected: it looks again only a minute later).
func cmdHostRun(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: hostrun NODE TOKEN-FILE")
	}
	c := apptest.NewEnv(ts.Getenv("MESH_DATA"), ts.Getenv)
	v, err := c.BrokerShow(context.Background())
	c.Close()
	ts.Check(err)
	if len(v.URLs) == 0 {
		ts.Fatalf("no broker URL: is a controller serving?")
	}
	token, err := os.ReadFile(ts.MkAbs(args[1]))
	ts.Check(err)
	dir := ts.MkAbs("host-" + args[0])
	st, err := host.Join(context.Background(), host.JoinOptions{Broker: strings.Join(v.URLs, ","), Token: strings.TrimSpace(string(token)),
		Node: args[0], State: filepath.Join(dir, "state")})
	ts.Check(err)
	root := filepath.Join(dir, "root")
	ts.Setenv("ROOT_"+args[0], root)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	// Its overlay interface stays down: it runs in the machine's own
	// network namespace, beside other scenarios' hosts.
	r := &host.Runner{State: st, Root: root, Heartbeat: 100 * time.Millisecond, NoOverlayInterface: true}
	go func() { done <- r.Run(ctx) }()
	ts.Defer(func() {
		cancel()
		if err := <-done; err != nil {
			ts.Logf("host %s: %v", args[0], err)
		}
	})
	c = apptest.NewEnv(ts.Getenv("MESH_DATA"), ts.Getenv)
	defer c.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		d, err := c.NodeShow(context.Background(), args[0])
		ts.Check(err)
		if len(d.Facts) > 0 {
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("host %s: its facts did not reach the controller within 10s", args[0])
		}
	}
}

// cmdSettled waits until a node's host has applied its latest declaration
// (and so reported what applying it changed in its facts): settled NODE.
func cmdSettled(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: settled NODE")
	}
	c := apptest.NewEnv(ts.Getenv("MESH_DATA"), ts.Getenv)
	defer c.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		d, err := c.NodeShow(context.Background(), args[0])
		ts.Check(err)
		if d.SerialApplied > 0 && !d.Behind {
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("%s did not apply its latest declaration within 10s", args[0])
		}
	}
}

// cmdHoldPort starts a process that holds a listening TCP socket on
// ADDRESS:PORT (127.0.0.1 unless said; sleep, with the socket inherited),
// as something already running on an adopted machine, until the scenario
// ends: holdport PORT [ADDRESS]. A second holdport on the same port stops
// the first holder first, so the port's holder has a new pid. $HOLDER_PID
// is the holder's pid.
func cmdHoldPort(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 1 || len(args) > 2 {
		ts.Fatalf("usage: holdport PORT [ADDRESS]")
	}
	address := "127.0.0.1"
	if len(args) == 2 {
		address = args[1]
	}
	key := holderKey{ts, args[0]}
	if old, ok := holders.Load(key); ok {
		old.(*holdtest.Holder).Stop()
	}
	h, err := holdtest.Listen(address+":"+args[0], 10*time.Second)
	ts.Check(err)
	ts.Setenv("HOLDER_PID", fmt.Sprint(h.Pid()))
	holders.Store(key, h)
	ts.Defer(func() {
		h.Stop()
		holders.Delete(key)
	})
}

// holders are the holdport holders running, by scenario and port.
var holders sync.Map

type holderKey struct {
	ts   *testscript.TestScript
	port string
}
