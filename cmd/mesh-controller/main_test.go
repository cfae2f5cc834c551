package main

import (
	"context"
	"crypto/ed25519"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"mesh-controller/app"
	"mesh-controller/contexts/identity"

	"github.com/rogpeppe/go-internal/testscript"

	"mesh-controller/cmd/scriptcmds"
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
			// The shared example manifests, as kept beside the manifest tests.
			examples, err := filepath.Abs("../../contexts/inventory/testdata")
			if err != nil {
				return err
			}
			e.Setenv("EXAMPLES", examples)
			// A fixed operator key for scenarios; its private half is testOperatorIdentity.
			e.Setenv("OPERATOR_KEY", "age1qw9z92zmyjj7ef5qdauyxtg2t7qeanlwt0wsencparm9fryhkdcqyh25r9")
			return nil
		},
		Cmds: scriptcmds.With(map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"sql":         cmdSQL,
			"waitserving": cmdWaitServing,
			"damage":      cmdDamage,
			"waitfile":    cmdWaitFile,
			"hostjoined":  cmdHostJoined,
		}),
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

// cmdWaitServing waits (up to 20s) until a controller holds the lease of the
// scenario's data dir, or with !, until none does.
func cmdWaitServing(ts *testscript.TestScript, neg bool, args []string) {
	c := app.New(ts.Getenv("MESH_DATA"))
	c.Getenv = ts.Getenv
	defer c.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		v, err := c.BrokerShow(context.Background())
		if err == nil && v.Serving != neg {
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("waited 20s for serving=%v (last error: %v)", !neg, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cmdHostJoined records that a node's host joined, as a join through serve
// does (its token used, its keys kept, the node marked joined), so that
// scenarios about joined nodes need no running host and broker. The host's
// age recipient is $OPERATOR_KEY. hostjoined NODE TOKEN-FILE, the file
// holding what 'token issue --node NODE' printed.
func cmdHostJoined(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: hostjoined NODE TOKEN-FILE")
	}
	token, err := os.ReadFile(ts.MkAbs(args[1]))
	ts.Check(err)
	hostKey, _, err := ed25519.GenerateKey(nil)
	ts.Check(err)
	user, err := nkeys.CreateUser()
	ts.Check(err)
	nkey, err := user.PublicKey()
	ts.Check(err)
	c := app.New(ts.Getenv("MESH_DATA"))
	c.Getenv = ts.Getenv
	defer c.Close()
	ctx := context.Background()
	st, err := c.Stores(ctx)
	ts.Check(err)
	now := time.Now()
	_, err = st.Identity.Join(ctx, strings.TrimSpace(string(token)), identity.Host{Node: args[0], HostKey: hostKey,
		AgeRecipient: ts.Getenv("OPERATOR_KEY"), NKey: nkey, HostVersion: "scenario"}, now)
	ts.Check(err)
	ts.Check(st.Inventory.MarkJoined(ctx, args[0], now))
}
