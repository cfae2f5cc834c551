package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"mesh-controller/app/apptest"
	"mesh-controller/contexts/identity"

	"github.com/rogpeppe/go-internal/testscript"

	"mesh-controller/cmd/scriptcmds"
	"mesh-controller/embedded/postgres"
	"mesh-controller/embedded/sqlite"
	"mesh-controller/embedded/sqlite/sqlitetest"
)

func TestMain(m *testing.M) {
	testscript.Main(removingReadmeBin{m}, map[string]func(){"mesh-controller": main})
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
			// The shared example manifests, as kept for the inventory's tests.
			examples, err := filepath.Abs("../../contexts/inventory/testdata")
			if err != nil {
				return err
			}
			e.Setenv("EXAMPLES", examples)
			// A fixed operator key for scenarios; its private half is testOperatorIdentity.
			e.Setenv("OPERATOR_KEY", "age1qw9z92zmyjj7ef5qdauyxtg2t7qeanlwt0wsencparm9fryhkdcqyh25r9")
			return nil
		},
		// [postgres]: MESH_TEST_POSTGRES names a server to make databases
		// on. Under CI or make test its absence fails the scenario: nothing is
		// skipped there. [root]: the scenario runs as root (root's defaults).
		//
		// [tool:NAME]: NAME is on PATH (zsh, fish). Under CI or make test,
		// which installs them, its absence fails the scenario.
		Condition: func(cond string) (bool, error) {
			if cond == "root" {
				return os.Geteuid() == 0, nil
			}
			if tool, ok := strings.CutPrefix(cond, "tool:"); ok {
				_, err := exec.LookPath(tool)
				if err != nil && sqlitetest.Required() {
					return false, fmt.Errorf("%s is not installed under CI or make test: make test installs it (TOOLS)", tool)
				}
				return err == nil, nil
			}
			if cond != "postgres" {
				return false, fmt.Errorf("unknown condition %q", cond)
			}
			if os.Getenv(sqlitetest.PostgresVar) == "" && sqlitetest.Required() {
				return false, fmt.Errorf("%s is not set under CI or make test: the PostgreSQL scenarios must run (make test starts it)", sqlitetest.PostgresVar)
			}
			return os.Getenv(sqlitetest.PostgresVar) != "", nil
		},
		Cmds: scriptcmds.With(map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"sql":            cmdSQL,
			"waitserving":    cmdWaitServing,
			"damage":         cmdDamage,
			"waitfile":       cmdWaitFile,
			"hostjoined":     cmdHostJoined,
			"pg":             cmdPG,
			"oidc":           cmdOIDC,
			"tlscert":        cmdTLSCert,
			"freeport":       cmdFreePort,
			"apicall":        cmdAPICall,
			"hostrun":        cmdHostRun,
			"holdport":       cmdHoldPort,
			"buildrefresher": cmdBuildRefresher,
			"waitsame":       cmdWaitSame,
			"settled":        cmdSettled,
		}),
	})
}

// cmdSQL runs one SQL statement on a store file, for scenarios that must
// damage a store the way a newer binary or a hand edit would: sql FILE STATEMENT.
func cmdSQL(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 2 {
		ts.Fatalf("usage: sql FILE STATEMENT")
	}
	dsn := args[0]
	if !postgres.IsURL(dsn) {
		dsn = ts.MkAbs(dsn)
	}
	db, err := sqlite.Open(context.Background(), sqlite.Location{Context: "test", DSN: dsn}, true)
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

// cmdPG makes what a person makes on PostgreSQL before 'migrate', on the
// test server (MESH_TEST_POSTGRES; the scenario is skipped without it, and
// fails under CI); everything made is dropped when the scenario ends.
// Names are made unique per scenario, since roles are the server's:
//
//	pg role R          CREATE ROLE (password pw-R); $ROLE_R is its name
//	pg db D [R]        CREATE DATABASE owned by R (else the superuser); $PG_D
//	                   is its URL, logging in as R; $DB_D its name
//	pg url D R NAME    $PG_D is the URL of database NAME as role R (made by
//	                   pg role, else R as it is), made or not
func cmdPG(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: pg role R | pg db D [R] | pg url D R NAME")
	}
	admin := os.Getenv(sqlitetest.PostgresVar)
	if admin == "" {
		ts.Fatalf("%s is not set: begin the scenario with [!postgres] skip", sqlitetest.PostgresVar)
	}
	db, _, err := postgres.Open(context.Background(), admin)
	ts.Check(err)
	defer db.Close()
	exec := func(stmt string) {
		if _, err := db.Exec(stmt); err != nil {
			ts.Fatalf("%s: %v", stmt, err)
		}
	}
	suffix := ts.Getenv("PG_SUFFIX")
	if suffix == "" {
		b := make([]byte, 4)
		rand.Read(b)
		suffix = hex.EncodeToString(b)
		ts.Setenv("PG_SUFFIX", suffix)
	}
	u, err := url.Parse(admin)
	ts.Check(err)
	urlOf := func(role, name string) string {
		v := *u
		v.Path = "/" + name
		if role != "" {
			name := ts.Getenv("ROLE_" + role)
			if name == "" {
				name = role // a role never made
			}
			v.User = url.UserPassword(name, "pw-"+role)
		}
		return v.String()
	}
	switch args[0] {
	case "role":
		name := "r_" + args[1] + "_" + suffix
		exec(`CREATE ROLE ` + name + ` LOGIN PASSWORD 'pw-` + args[1] + `'`)
		ts.Defer(func() { dropLater(admin, `DROP ROLE IF EXISTS `+name) })
		ts.Setenv("ROLE_"+args[1], name)
	case "db":
		name := "d_" + args[1] + "_" + suffix
		owner, role := "", ""
		if len(args) > 2 {
			role = args[2]
			owner = " OWNER " + ts.Getenv("ROLE_"+role)
		}
		exec(`CREATE DATABASE ` + name + owner + ` TEMPLATE template0`)
		ts.Defer(func() { dropLater(admin, `DROP DATABASE IF EXISTS `+name+` WITH (FORCE)`) })
		ts.Setenv("DB_"+args[1], name)
		ts.Setenv("PG_"+args[1], urlOf(role, name))
	case "url":
		if len(args) != 4 {
			ts.Fatalf("usage: pg url D R NAME")
		}
		ts.Setenv("PG_"+args[1], urlOf(args[2], args[3]))
	default:
		ts.Fatalf("usage: pg role R | pg db D [R] | pg url D R NAME")
	}
}

// dropLater drops what a scenario made, when it ends (through a connection
// of its own: the one that made it is closed by then).
func dropLater(admin, stmt string) {
	db, _, err := postgres.Open(context.Background(), admin)
	if err != nil {
		return
	}
	defer db.Close()
	db.Exec(stmt)
}

// cmdWaitServing waits (up to 20s) until a controller holds the lease of the
// scenario's data dir, or with !, until none does.
func cmdWaitServing(ts *testscript.TestScript, neg bool, args []string) {
	c := apptest.NewEnv(ts.Getenv("MESH_DATA"), ts.Getenv)
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
	c := apptest.NewEnv(ts.Getenv("MESH_DATA"), ts.Getenv)
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
