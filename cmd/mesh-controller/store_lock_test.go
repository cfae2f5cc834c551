package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"mesh-controller/app/host"
)

// sqlite3 is the sqlite3 command line, as a person inspecting a store runs
// it: C SQLite, which on closing its last connection checkpoints and
// deletes the WAL whenever it can take an exclusive lock on the database.
// make test installs it where missing.
func sqlite3(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("sqlite3")
	if err != nil {
		if os.Getenv("MESH_TEST_TOOLS") != "" || os.Getenv("CI") != "" {
			t.Fatal("no sqlite3: 'make test' installs Debian's sqlite3")
		}
		t.Skip("no sqlite3 here; 'make test' installs it")
	}
	return path
}

// A serving controller keeps every write while other processes open and
// close its stores (issue 11, item 1). Before, the self-check reopened each
// store inside the serving process, which dropped the process's POSIX locks;
// an outside open-and-close then deleted the WAL under serve, and joins were
// lost. Here serve runs its self-check every 100 ms while another process
// opens and closes every store and hosts join; afterwards every join is in
// the stores, no store file serve holds was deleted, and each store passes
// integrity_check.
func TestServe_StoresKeepWritesWhileOthersOpenThem(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	sqlite3Bin := sqlite3(t)
	bin := buildBinary(t)
	data := t.TempDir()
	run := func(args ...string) string {
		t.Helper()
		var stderr bytes.Buffer
		cmd := exec.Command(bin, append([]string{"--data", data}, args...)...)
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%v: %v\n%s%s", args, err, out, stderr.String())
		}
		return string(out)
	}
	run("migrate")
	serve, serveErr := startServe(t, bin, data, "--check-every", "100ms")
	defer serve.Process.Kill()

	var files []string
	for _, c := range []string{"inventory", "identity", "secrets", "licences", "builds", "health"} {
		files = append(files, filepath.Join(data, c+".db"))
	}
	// Another process opens and closes every store, again and again.
	stop, touched := make(chan struct{}), make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				touched <- n
				return
			default:
			}
			for _, f := range files {
				// A failure (busy, say) is no matter: the open and close are the attack.
				exec.Command(sqlite3Bin, f, "SELECT count(*) FROM sqlite_master;").Run()
			}
			n++
		}
	}()
	var once sync.Once
	stopTouching := func() (n int) {
		once.Do(func() { close(stop); n = <-touched })
		return n
	}
	defer stopTouching()

	url := brokerURL(t, run("broker", "show", "--json"))
	const hosts = 30
	deleted := func() string {
		links, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", serve.Process.Pid))
		for _, l := range links {
			if target, err := os.Readlink(l); err == nil && strings.HasSuffix(target, "(deleted)") && strings.Contains(target, data) {
				return target
			}
		}
		return ""
	}
	for i := 1; i <= hosts; i++ {
		node := fmt.Sprintf("web%d", i)
		token := strings.TrimSpace(run("token", "issue", "--new", node))
		if _, err := host.Join(context.Background(), host.JoinOptions{Broker: url, Token: token, Node: node,
			State: filepath.Join(t.TempDir(), node)}); err != nil {
			t.Fatalf("join %s: %v", node, err)
		}
		run("node", "list", "--json") // a person's command beside serve
		if d := deleted(); d != "" {
			t.Fatalf("after %d joins, serve writes to a deleted file: %s\n%s", i, d, serveErr.String())
		}
	}
	// Two more of serve's self-checks (what reopened the stores) while they
	// are touched.
	checked := time.Now()
	for range 2 {
		checkFor(t, 20*time.Second, func() error {
			out, err := exec.Command(bin, "--data", data, "doctor", "last", "--json").Output()
			if err != nil {
				return fmt.Errorf("doctor last: %v", err)
			}
			var v struct {
				At time.Time `json:"at"`
			}
			if err := json.Unmarshal(out, &v); err != nil {
				return fmt.Errorf("doctor last --json: %v: %s", err, out)
			}
			if !v.At.After(checked) {
				return fmt.Errorf("serve's last self-check ran at %s, not after %s", v.At.Format(time.RFC3339Nano), checked.Format(time.RFC3339Nano))
			}
			checked = v.At
			return nil
		})
	}
	if n := stopTouching(); n < 5 {
		t.Fatalf("the stores were opened and closed only %d times", n)
	}
	if d := deleted(); d != "" {
		t.Fatalf("serve writes to a deleted file: %s", d)
	}
	serve.Process.Signal(os.Interrupt)
	if err := serve.Wait(); err != nil {
		t.Fatalf("serve: %v\n%s", err, serveErr.String())
	}
	var list []struct {
		Name   string `json:"name"`
		Joined bool   `json:"joined"`
	}
	decodeJSON(t, run("node", "list", "--json"), &list)
	joined := 0
	for _, n := range list {
		if n.Joined {
			joined++
		}
	}
	if joined != hosts {
		t.Fatalf("%d of %d joins kept", joined, hosts)
	}
	for _, f := range files {
		db, err := sql.Open("sqlite", "file:"+f+"?mode=ro")
		if err != nil {
			t.Fatal(err)
		}
		var ok string
		if err := db.QueryRow(`PRAGMA integrity_check`).Scan(&ok); err != nil || ok != "ok" {
			t.Errorf("%s: integrity_check %q %v", f, ok, err)
		}
		if strings.HasSuffix(f, "identity.db") {
			var n int
			db.QueryRow(`SELECT count(*) FROM hosts`).Scan(&n)
			if n != hosts {
				t.Errorf("identity store holds %d hosts, want %d", n, hosts)
			}
		}
		db.Close()
	}
}
