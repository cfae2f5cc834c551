package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"mesh-controller/app/protocol"
)

// The serving controller killed (SIGKILL: its lease not given back, its
// embedded broker gone with it) in the middle of a roll-out, then in the
// middle of a rollback, and started again on the same stores once its
// lease lapsed: it resumes each where the store says it was, the command
// following it says so and ends as the roll-out does. Killed, every node's
// latest declaration names the module once, at the version it ran or the
// one it moves to; no node is moved twice, nor returned twice; every node
// ends on one version, its module running. Real binaries: the controller,
// three hosts, and the module's processes.
func TestRollOut_ControllerKilled(t *testing.T) {
	t.Parallel()
	mc, mh := buildProgram(t, "mesh-controller", "../../cmd/mesh-controller"), buildHost(t)
	data := t.TempDir()
	cli(t, mc, data, "migrate")
	addr := freeAddr(t)
	nodes := []string{"db1", "db2", "db3"}
	s := serveAgain(t, mc, data, addr)
	for _, n := range nodes {
		joinHost(t, mc, mh, data, "nats://"+addr, n)
	}
	manifest := func(version, script string) string {
		return writeManifest(t, storeRunning(version, script))
	}
	cli(t, mc, data, "module", "add", manifest("1.0.0", "exec sleep 1000"))
	for _, n := range nodes {
		cli(t, mc, data, "assign", n, "store")
	}
	storeOn := func(version string) {
		t.Helper()
		checkFor(t, settle, func() error {
			for _, n := range nodes {
				if got := showNode(t, mc, data, n); got.storeVersion() != version || got.pidOf("store") == 0 {
					return fmt.Errorf("%s: store %q, %+v; want %s ready", n, got.storeVersion(), got.Modules, version)
				}
			}
			return nil
		})
	}
	storeOn("1.0.0")

	// Forward: killed once the second node was sent its declaration.
	cli(t, mc, data, "module", "add", manifest("2.0.0", "exec sleep 1000"))
	follow := startProc(t, "upgrade store roll-out", mc, "--data", data, "upgrade", "store", "roll-out", "--canary", "1", "--batch", "1",
		"--soak", "500ms", "--wait", "20s")
	follow.wait(t, settle, `^db2 sent declaration \d+ \(store 1\.0\.0 -> 2\.0\.0\)$`, 0)
	kill(t, s)
	declaredOnce(t, data, nodes, "1.0.0", "2.0.0")
	s = serveAgain(t, mc, data, addr)
	follow.wait(t, 2*settle, `^store 2\.0\.0 rolled out to 3 nodes of 3$`, 0)
	<-follow.done
	if code := follow.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("the roll-out's command exited %d:\n%s", code, follow.text())
	}
	storeOn("2.0.0")
	movedOnce(t, mc, data, nodes, "move %s from 1.0.0 to 2.0.0")

	// Back: a version that cannot start, moved together, killed while
	// going back.
	cli(t, mc, data, "module", "add", writeManifest(t, storeUp("3.0.0", "exit 3")))
	follow = startProc(t, "upgrade store roll-out", mc, "--data", data, "upgrade", "store", "roll-out", "--together", "--wait", "20s")
	follow.wait(t, settle, `^db\d going back to store 2\.0\.0 \(declaration \d+\)$`, 0)
	kill(t, s)
	declaredOnce(t, data, nodes, "2.0.0", "3.0.0")
	serveAgain(t, mc, data, addr)
	follow.wait(t, 2*settle, `^mesh-controller: the roll-out stopped and was rolled back: `, 0)
	<-follow.done
	if code := follow.cmd.ProcessState.ExitCode(); code != 1 {
		t.Fatalf("the rolled-back roll-out's command exited %d:\n%s", code, follow.text())
	}
	for _, n := range nodes {
		follow.wait(t, time.Second, `(^|; )`+n+` back on store 2\.0\.0`, 0)
	}
	storeOn("2.0.0")
	movedOnce(t, mc, data, nodes, "rollback of store 3.0.0: %s back on store 2.0.0")
}

// serveAgain starts mesh-controller serve on data, listening on addr, its
// lease 2s: again and again until it serves (a controller killed keeps its
// lease until it lapses, and one started meanwhile refuses, naming it).
func serveAgain(t *testing.T, mc, data, addr string) *serveProc {
	t.Helper()
	var s *serveProc
	checkFor(t, settle, func() error {
		s = startProc(t, "controller", mc, "--data", data, "serve", "--listen", addr, "--lease", "2s", "--catch-up-every", "200ms")
		if !tookOver(s, settle) {
			return fmt.Errorf("serve did not serve: %s", s.text())
		}
		return nil
	})
	return s
}

// kill ends a controller with SIGKILL and waits for it.
func kill(t *testing.T, s *serveProc) {
	t.Helper()
	if err := s.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-s.done
}

// declaredOnce checks, the controller dead, that every node's latest
// declaration names store once, at from or to.
func declaredOnce(t *testing.T, data string, nodes []string, from, to string) {
	t.Helper()
	inv := openStore(t, data, "inventory")
	defer inv.Close()
	for _, n := range nodes {
		var body string
		if err := inv.Reader.QueryRow(`SELECT body FROM declarations WHERE node = ?`, n).Scan(&body); err != nil {
			t.Fatalf("%s's latest declaration: %v", n, err)
		}
		var d protocol.Declaration
		if err := json.Unmarshal([]byte(body), &d); err != nil {
			t.Fatal(err)
		}
		var versions []string
		for _, m := range d.Modules {
			if m.Module == "store" {
				versions = append(versions, m.Version)
			}
		}
		if len(versions) != 1 || (versions[0] != from && versions[0] != to) {
			t.Errorf("%s's latest declaration (serial %d) names store at %v; want once, at %s or %s", n, d.Serial, versions, from, to)
		}
	}
}

// movedOnce checks that the hand acts say each node's step (a format with
// its node) exactly once.
func movedOnce(t *testing.T, mc, data string, nodes []string, step string) {
	t.Helper()
	var v struct {
		Acts []struct {
			What string `json:"what"`
		} `json:"acts"`
	}
	if err := json.Unmarshal([]byte(cli(t, mc, data, "hand-acts", "--json")), &v); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		want, count := fmt.Sprintf(step, n), 0
		for _, a := range v.Acts {
			if strings.Contains(a.What, want) {
				count++
			}
		}
		if count != 1 {
			t.Errorf("the hand acts say %q %d times", want, count)
		}
	}
}

// storeVersion is the version of store its host reports.
func (n shownNode) storeVersion() string {
	for _, m := range n.Modules {
		if m.Module == "store" {
			return m.Version
		}
	}
	return ""
}
