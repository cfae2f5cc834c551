package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"mesh-controller/app"
	"mesh-controller/app/apptest"
	"mesh-controller/cmd/scriptcmds"
)

func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){"mesh-host": main})
}

// TestScripts runs every scenario under testdata/ against the real mesh-host
// binary and, where a scenario says `controller start`, a real controller
// serving in this test process.
func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Dir: "testdata",
		// As root, a host makes a system user per module: the scenarios
		// leave the machine's users as they found them.
		Setup: func(e *testscript.Env) error {
			e.Setenv("MESH_HOST_MODULE_USERS", "false")
			return nil
		},
		Cmds: scriptcmds.With(map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"controller": cmdController,
		}),
		// [root]: the scenario runs as root (root's defaults).
		Condition: func(cond string) (bool, error) {
			if cond != "root" {
				return false, fmt.Errorf("unknown condition %q", cond)
			}
			return os.Geteuid() == 0, nil
		},
	})
}

// controllers are the scenarios' controllers by data dir: one each, as a
// process opens each store once.
var controllers sync.Map

func controllerOf(ts *testscript.TestScript) *apptest.Mesh {
	dir := ts.MkAbs("controller")
	if prev, ok := controllers.Load(dir); ok {
		return prev.(*apptest.Mesh)
	}
	c := apptest.NewEnv(dir, func(string) string { return "" })
	controllers.Store(dir, c)
	ts.Defer(func() {
		controllers.Delete(dir)
		c.Close()
	})
	return c
}

// cmdController drives a real controller on $WORK/controller:
// controller start (sets $BROKER), controller token NAME (sets $TOKEN),
// controller node NAME (prints node show as JSON).
func cmdController(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) == 0 {
		ts.Fatalf("usage: controller start|token NAME|node NAME")
	}
	c := controllerOf(ts)
	ctx := context.Background()
	switch args[0] {
	case "start":
		_, err := c.Migrate(ctx)
		ts.Check(err)
		sctx, cancel := context.WithCancel(ctx)
		ready, done := make(chan app.Ready, 1), make(chan error, 1)
		go func() {
			done <- c.Serve(sctx, app.ServeOptions{Listen: "127.0.0.1:0", Ready: func(r app.Ready) { ready <- r }})
		}()
		ts.Defer(func() { cancel(); <-done })
		select {
		case r := <-ready:
			ts.Setenv("BROKER", r.BrokerURL)
		case err := <-done:
			ts.Fatalf("serve: %v", err)
		case <-time.After(20 * time.Second):
			ts.Fatalf("serve not ready after 20s")
		}
	case "token":
		tok, err := c.TokenIssue(ctx, app.TokenRequest{Node: args[1], New: true, TTL: time.Hour})
		ts.Check(err)
		ts.Setenv("TOKEN", tok.Token)
	case "tokens":
		n, err := strconv.Atoi(args[2])
		ts.Check(err)
		_, err = c.TokenIssueMany(ctx, args[1], n, false, time.Hour, ts.MkAbs(args[3]))
		ts.Check(err)
	case "node":
		n, err := c.NodeShow(ctx, args[1])
		ts.Check(err)
		b, _ := json.MarshalIndent(n, "", "  ")
		fmt.Fprintf(ts.Stdout(), "%s\n", b)
	default:
		ts.Fatalf("unknown: controller %s", args[0])
	}
}
