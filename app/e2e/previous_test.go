package e2e

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"mesh-controller/app"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/identity"
	"mesh-controller/embedded/broker"
	"mesh-controller/embedded/sqlite"
)

// The previous release's binaries beside this tree's: hosts and
// controllers of both, on the same stores and broker. scripts/previous-
// release names the previous release (its tag and commit) and builds its
// mesh-controller and mesh-host once, into bin/previous/<commit>.

// previous are the previous release's binaries.
type previous struct {
	controller, host string
	// version is what they say they are (mesh-controller version).
	version string
}

var previousBuilt = sync.OnceValues(func() (previous, error) {
	out, err := exec.Command("../../scripts/previous-release").Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return previous{}, fmt.Errorf("%s", strings.TrimSpace(string(ee.Stderr)))
		}
		return previous{}, err
	}
	dir, err := filepath.Abs(filepath.Join("..", "..", strings.TrimSpace(string(out))))
	if err != nil {
		return previous{}, err
	}
	p := previous{controller: filepath.Join(dir, "mesh-controller"), host: filepath.Join(dir, "mesh-host")}
	v, err := exec.Command(p.controller, "version").Output()
	if err != nil {
		return previous{}, fmt.Errorf("%s version: %w", p.controller, err)
	}
	p.version = strings.TrimPrefix(strings.TrimSpace(string(v)), "mesh-controller ")
	return p, nil
})

// previousRelease is the previous release's binaries, built once.
func previousRelease(t *testing.T) previous {
	t.Helper()
	p, err := previousBuilt()
	if err != nil {
		t.Fatalf("the previous release: %v", err)
	}
	return p
}

// buildHost builds this tree's mesh-host once per test binary.
func buildHost(t testing.TB) string { return buildProgram(t, "mesh-host", "../../cmd/mesh-host") }

// cli runs a mesh-controller binary's command on the stores in data and
// returns what it printed on stdout; the test fails unless it exits 0.
func cli(t *testing.T, bin, data string, args ...string) string {
	t.Helper()
	out, errOut, err := cliRun(bin, data, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", filepath.Base(bin), strings.Join(args, " "), err, out, errOut)
	}
	return out
}

// cliRun runs a mesh-controller binary's command on data, without the
// test's MESH_ variables.
func cliRun(bin, data string, args ...string) (stdout, stderr string, err error) {
	cmd := exec.Command(bin, append([]string{"--data", data}, args...)...)
	cmd.Env = withoutMesh()
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

// withoutMesh is the test's environment less its MESH_ variables.
func withoutMesh() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MESH_") {
			env = append(env, kv)
		}
	}
	return env
}

// shownNode is what 'node show --json' says of a node, in every version.
type shownNode struct {
	Name          string     `json:"name"`
	LastHeard     *time.Time `json:"last_heard"`
	SerialApplied int64      `json:"serial_applied"`
	SerialDecl    int64      `json:"serial_declared"`
	HostVersion   string     `json:"host_version"`
	Protocol      string     `json:"protocol"`
	Modules       []struct {
		Module  string `json:"module"`
		State   string `json:"state"`
		Pid     int    `json:"pid"`
		Version string `json:"version"`
	} `json:"modules"`
	Dropped []struct {
		Reason string `json:"reason"`
		Count  int64  `json:"count"`
	} `json:"dropped_messages"`
}

func showNode(t *testing.T, bin, data, node string) shownNode {
	t.Helper()
	var n shownNode
	if err := json.Unmarshal([]byte(cli(t, bin, data, "node", "show", node, "--json")), &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// pidOf is the pid of module on node as the controller shows it, once it
// is ready (0 until then).
func (n shownNode) pidOf(module string) int {
	for _, m := range n.Modules {
		if m.Module == module && m.State == protocol.StateReady {
			return m.Pid
		}
	}
	return 0
}

// meshHost is a real host: mesh-host joined as node, then run as a process.
type meshHost struct {
	node, bin, state, root string
	proc                   *serveProc
}

// joinHost joins node with bin (a mesh-host of either version) through the
// broker at url, with a token bin issues on data's stores, and runs it.
func joinHost(t *testing.T, controller, bin, data, url, node string) *meshHost {
	t.Helper()
	token := strings.TrimSpace(cli(t, controller, data, "token", "issue", "--new", node))
	dir := t.TempDir()
	h := &meshHost{node: node, bin: bin, state: filepath.Join(dir, "state"), root: filepath.Join(dir, "root")}
	cmd := exec.Command(bin, "join", "--broker", url, "--token", token, "--node", node, "--state", h.state)
	cmd.Env = withoutMesh()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s join %s: %v\n%s", bin, node, err, out)
	}
	h.start(t)
	return h
}

// start runs the host (again).
func (h *meshHost) start(t *testing.T) {
	t.Helper()
	h.proc = startProc(t, h.node, h.bin, "run", "--state", h.state, "--root", h.root, "--heartbeat", "200ms",
		"--no-module-users", "--no-overlay-interface")
}

// stop ends the host with SIGTERM and waits for it: its modules stop with it.
func (h *meshHost) stop() {
	h.proc.cmd.Process.Signal(syscall.SIGTERM)
	<-h.proc.done
}

// helloAs registers a copy of the example module named module, on a free
// port, installs it on h, and assigns it there.
func helloAs(t *testing.T, controller, data string, h *meshHost, module string) {
	t.Helper()
	manifest, err := os.ReadFile(helloOnFreePort(t))
	if err != nil {
		t.Fatal(err)
	}
	cli(t, controller, data, "module", "add", writeManifest(t, strings.Replace(string(manifest), `"module": "hello"`, `"module": "`+module+`"`, 1)))
	dst := filepath.Join(h.root, protocol.ModulesDir, module, "bin", "hello")
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(buildHello(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
	cli(t, controller, data, "assign", h.node, module)
}

// readyOn waits until module is ready on node and returns its pid.
func readyOn(t *testing.T, controller, data, node, module string) int {
	t.Helper()
	var pid int
	checkFor(t, settle, func() error {
		n := showNode(t, controller, data, node)
		if pid = n.pidOf(module); pid == 0 {
			return fmt.Errorf("%s on %s is not ready: %+v", module, node, n.Modules)
		}
		return nil
	})
	return pid
}

// withOperatorKey makes an operator key off the mesh and sets it.
func withOperatorKey(t *testing.T, controller, data string) {
	t.Helper()
	pub := strings.TrimSpace(cli(t, controller, data, "operator", "key", "make", "--out", filepath.Join(t.TempDir(), "operator.key")))
	cli(t, controller, data, "operator", "key", "set", pub)
}

// The controller upgraded in place, under hosts of both versions running
// modules: the previous release serves its own stores, and a host of this
// tree and one of the previous release join it, apply their declarations
// and run a module each; it is stopped and this tree's controller started
// on the same stores migrates them and serves: the hosts come back, their
// modules still running (pids unchanged), nothing lost. Then the previous
// release's host applies what the new controller declares, a host of the
// previous release joins the new controller and runs a module, and their
// messages (protocol 1.0, which they do not say) are accepted.
func TestPreviousRelease_ControllerUpgradedInPlace(t *testing.T) {
	t.Parallel()
	prev := previousRelease(t)
	mc, mh := buildController(t), buildHost(t)
	data, addr := t.TempDir(), freeAddr(t)

	cli(t, prev.controller, data, "migrate")
	withOperatorKey(t, prev.controller, data)
	old := startProc(t, "controller "+prev.version, prev.controller, "--data", data, "serve", "--listen", addr, "--catch-up-every", "200ms")
	old.wait(t, 20*time.Second, readyLine, 0)
	url := "nats://" + addr

	// Under the previous release: one host of each version, a module each.
	web1 := joinHost(t, prev.controller, prev.host, data, url, "web1")
	web2 := joinHost(t, prev.controller, mh, data, url, "web2")
	helloAs(t, prev.controller, data, web1, "hello1")
	helloAs(t, prev.controller, data, web2, "hello2")
	pids := map[string]int{"web1": readyOn(t, prev.controller, data, "web1", "hello1"), "web2": readyOn(t, prev.controller, data, "web2", "hello2")}
	before := map[string]shownNode{"web1": showNode(t, prev.controller, data, "web1"), "web2": showNode(t, prev.controller, data, "web2")}
	modulesBefore := cli(t, prev.controller, data, "module", "list")

	// This tree's controller, on the stores the previous release left.
	old.cmd.Process.Signal(syscall.SIGTERM)
	<-old.done
	stopped := time.Now()
	if _, errOut, err := cliRun(mc, data, "node", "list"); err == nil || !strings.Contains(errOut, "schema is behind this binary") {
		t.Fatalf("node list on stores the previous release left: %v\n%s", err, errOut)
	}
	upgraded := startProc(t, "controller (this tree)", mc, "--data", data, "serve", "--listen", addr, "--catch-up-every", "200ms")
	migrated, _ := upgraded.wait(t, 20*time.Second, `^migrated: identity \S+ version 6 -> \d+$`, 0)
	t.Logf("this tree's serve on %s's stores: %s", prev.version, migrated.text)
	upgraded.wait(t, 20*time.Second, readyLine, 0)

	for _, n := range []struct{ node, module, host, protocol string }{
		{"web1", "hello1", prev.version, protocol.Unversioned},
		{"web2", "hello2", "development build", protocol.Version},
	} {
		checkFor(t, settle, func() error {
			got := showNode(t, mc, data, n.node)
			switch {
			case got.LastHeard == nil || !got.LastHeard.After(stopped):
				return fmt.Errorf("%s not heard since the upgrade (last %v)", n.node, got.LastHeard)
			case got.pidOf(n.module) != pids[n.node]:
				return fmt.Errorf("%s's %s: %+v, want pid %d ready", n.node, n.module, got.Modules, pids[n.node])
			case got.Protocol != n.protocol || got.HostVersion != n.host:
				return fmt.Errorf("%s runs %q, protocol %q; want %q, %q", n.node, got.HostVersion, got.Protocol, n.host, n.protocol)
			case got.SerialApplied != before[n.node].SerialApplied || got.SerialDecl != before[n.node].SerialDecl:
				return fmt.Errorf("%s applied %d of %d; before the upgrade %d of %d", n.node, got.SerialApplied, got.SerialDecl, before[n.node].SerialApplied, before[n.node].SerialDecl)
			case len(got.Dropped) != 0:
				return fmt.Errorf("%s's messages were dropped: %+v", n.node, got.Dropped)
			}
			return nil
		})
		if !alive(pids[n.node]) {
			t.Fatalf("%s's %s (pid %d) is gone", n.node, n.module, pids[n.node])
		}
	}
	if after := cli(t, mc, data, "module", "list"); after != modulesBefore {
		t.Errorf("module list before the upgrade:\n%s\nafter:\n%s", modulesBefore, after)
	}
	list := cli(t, mc, data, "node", "list")
	if !regexp.MustCompile(`(?m)^web1 .* ` + regexp.QuoteMeta(prev.version+" (protocol 1.0)") + `$`).MatchString(list) {
		t.Errorf("node list does not say web1 runs %s, protocol 1.0:\n%s", prev.version, list)
	}

	// The previous release's host applies what this controller declares
	// (its module moved, so restarted), and one joins this controller.
	settings := filepath.Join(t.TempDir(), "greeting.json")
	if err := os.WriteFile(settings, []byte(`{"greeting": "hi"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cli(t, mc, data, "settings", "set", "hello1", settings, "--node", "web1")
	web3 := joinHost(t, mc, prev.host, data, url, "web3")
	helloAs(t, mc, data, web3, "hello3")
	readyOn(t, mc, data, "web3", "hello3")
	checkFor(t, settle, func() error {
		for _, node := range []string{"web1", "web3"} {
			n := showNode(t, mc, data, node)
			if n.SerialApplied != n.SerialDecl || n.SerialApplied == 0 || n.pidOf("hello"+node[3:]) == 0 || n.Protocol != protocol.Unversioned || len(n.Dropped) != 0 {
				return fmt.Errorf("%s (%s): %+v", node, prev.version, n)
			}
		}
		if n := showNode(t, mc, data, "web1"); n.SerialApplied <= before["web1"].SerialApplied {
			return fmt.Errorf("web1 applied nothing new: %d", n.SerialApplied)
		}
		return nil
	})
	// The previous release's hosts answer this controller's requests on the
	// reply subject they are handed, under their own subjects
	// (protocol.AnswerSubject): web1 with the credentials the previous
	// release issued, web3 with this controller's, which let a host publish
	// in no inbox.
	for _, n := range []string{"web1", "web3"} {
		if out := cli(t, mc, data, "logs", n, "hello"+n[3:]); !strings.Contains(out, "on "+n+": start") {
			t.Errorf("hello%s's log from %s (%s): %q", n[3:], n, prev.version, out)
		}
	}
	// Every message of theirs was taken: none dropped for its protocol.
	if strings.Contains(upgraded.text(), "protocol mismatch") {
		t.Fatalf("the controller dropped messages of the previous release's hosts:\n%s", upgraded.text())
	}
	// A host of the previous release cannot renew a credential, nor follow
	// a rotation of the signing key: its broker user never expires, as
	// before, and a rotation is refused, naming it, unless asked to leave
	// it behind.
	ids := openStore(t, data, "identity")
	defer ids.Close()
	for _, n := range []struct {
		node    string
		expires bool
	}{{"web3", false}} {
		var expires sql.NullString
		if err := ids.Reader.QueryRow(`SELECT expires_at FROM issued_users WHERE node = ? AND kind = 'host' AND revoked_at IS NULL ORDER BY issued_at DESC LIMIT 1`, n.node).Scan(&expires); err != nil {
			t.Fatalf("%s's broker user: %v", n.node, err)
		}
		if expires.Valid != n.expires {
			t.Errorf("%s's broker user expires at %q; want an expiry: %v", n.node, expires.String, n.expires)
		}
	}
	if _, errOut, err := cliRun(mc, data, "identity", "rotate", "--why", "a yearly rotation"); err == nil ||
		!regexp.MustCompile(`^mesh-controller: hosts that cannot follow a key rotation would be left behind: web1, web3 \(2 hosts\) speak protocol 1\.0, which predates rotations, and would refuse every declaration the new key signs, upgrade those hosts first .*--leave-behind.*\n$`).MatchString(errOut) {
		t.Fatalf("a rotation with hosts of the previous release joined: %v\n%q", err, errOut)
	}
	_ = web2
}

// A standby of the previous release beside this tree's controller on the
// same stores: it stood by before they were migrated (an upgrade of two
// controllers under way), and when the one serving is killed it takes
// nothing and writes nothing: the stores, migrated, refuse its take of the
// lease, and it says so. Before that: this tree's controller, started
// while the previous release serves, stands by without migrating, and
// migrate by hand refuses, naming the one serving.
func TestPreviousRelease_OldStandbyStepsAside(t *testing.T) {
	t.Parallel()
	prev := previousRelease(t)
	mc := buildController(t)
	data := t.TempDir()
	cli(t, prev.controller, data, "migrate")
	url := brokerFor(t, data)

	serve := func(name, bin string) *serveProc {
		return startProc(t, name, bin, "--data", data, "--broker", url, "serve", "--lease", "2s", "--catch-up-every", "200ms")
	}
	a := serve("a ("+prev.version+")", prev.controller)
	a.wait(t, 20*time.Second, readyLine, 0)
	b := serve("b ("+prev.version+")", prev.controller)
	b.wait(t, 20*time.Second, standbyLine, 0)
	c := serve("c (this tree)", mc)
	c.wait(t, 20*time.Second, standbyLine+`.*; it is an older mesh-controller: the stores are migrated then$`, 0)
	if v := schemaVersion(t, data, "identity"); v != 6 {
		t.Fatalf("the identity store is at version %d while the previous release serves: migrated beneath it", v)
	}
	_, errOut, err := cliRun(mc, data, "migrate")
	if want := fmt.Sprintf(`^mesh-controller: \w+ store \S+: a controller serves these stores, and their schemas are behind this binary's: pid %d on \S+ \(an older mesh-controller, which records no version\), until \S+, stop that controller first; .*takes the lease over\n$`, a.pid()); err == nil || !regexp.MustCompile(want).MatchString(errOut) {
		t.Fatalf("migrate by hand while the previous release serves: %v\n%s\nwant %s", err, errOut, want)
	}

	// b paused, a stopped: c takes the lease, and migrates first.
	if err := b.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	a.cmd.Process.Signal(syscall.SIGTERM)
	<-a.done
	c.wait(t, 20*time.Second, `^migrated: identity `, 0)
	c.wait(t, 20*time.Second, readyLine, 0)
	if err := b.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed := b.lines()
	// b cannot say it stands by any more: the stores refuse it.
	b.wait(t, 10*time.Second, `standby: record this controller as standing by.*upgrade this mesh-controller`, resumed)

	// c killed: b would take over, and the stores refuse it.
	c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
	kept := storeDigests(t, data)
	lease := leaseOf(t, data)
	select {
	case <-b.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("the previous release's standby did not stop once the lease lapsed:\n%s", b.text())
	}
	if b.cmd.ProcessState.ExitCode() != 1 {
		t.Errorf("it exited %d, want 1", b.cmd.ProcessState.ExitCode())
	}
	if _, _, ok := b.find(regexp.MustCompile(readyLine), 0); ok {
		t.Fatalf("the previous release served migrated stores:\n%s", b.text())
	}
	refused, _ := b.wait(t, time.Second, `^mesh-controller: .*take the lease: .*these stores were migrated by a newer mesh-controller, which this older one cannot serve: upgrade this mesh-controller`, resumed)
	t.Logf("migrate by hand under %s: %s", prev.version, strings.TrimSpace(errOut))
	t.Logf("%s standing by, once the lease lapsed: %s", prev.version, refused.text)
	if got := leaseOf(t, data); got.Holder != lease.Holder || got.Generation != lease.Generation || got.Version != "development build" {
		t.Errorf("the lease after the previous release tried: %+v; before: %+v", got, lease)
	}
	if got := storeDigests(t, data); got != kept {
		t.Errorf("the stores changed after this tree's controller was killed:\nbefore %s\nafter  %s", kept, got)
	}
}

// brokerFor starts a broker apart from any controller that trusts the
// operator of the identity store in data (migrated by any version), as
// 'broker show --config' configures one, and returns its URL.
func brokerFor(t *testing.T, data string) string {
	t.Helper()
	db := openStore(t, data, "identity")
	keys, err := app.BrokerKeys(context.Background(), identity.NewStore(db))
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	trust, err := keys.Trust(app.JoinUser(), nil)
	if err != nil {
		t.Fatal(err)
	}
	external, err := broker.Start(freeAddr(t), trust)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(external.Shutdown)
	return external.ClientURL()
}

// openStore opens a context's store in data as a person's sqlite3 would,
// beside the processes that use it; the caller closes it.
func openStore(t *testing.T, data, name string) *sqlite.DB {
	t.Helper()
	db, err := sqlite.Open(context.Background(), sqlite.Location{Context: name, DSN: filepath.Join(data, name+".db")}, false)
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// schemaVersion is the highest migration a store in data records.
func schemaVersion(t *testing.T, data, name string) int {
	t.Helper()
	db := openStore(t, data, name)
	defer db.Close()
	var v int
	if err := db.Reader.QueryRow(`SELECT max(version) FROM schema_migrations`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// leaseOf is the lease as the identity store in data records it.
func leaseOf(t *testing.T, data string) identity.Lease {
	t.Helper()
	db := openStore(t, data, "identity")
	defer db.Close()
	l, err := identity.NewStore(db).Lease(context.Background())
	if err != nil || l == nil {
		t.Fatalf("the lease: %+v, %v", l, err)
	}
	return *l
}

// storeDigests digests every row of every table of every store in data.
func storeDigests(t *testing.T, data string) string {
	t.Helper()
	ctx := context.Background()
	var out []string
	for _, name := range app.Contexts {
		db := openStore(t, data, name)
		tables, err := db.Tables(ctx)
		if err != nil {
			db.Close()
			t.Fatal(err)
		}
		for _, tb := range tables {
			d, err := sqlite.Digest(ctx, db.Reader, tb)
			if err != nil {
				db.Close()
				t.Fatal(err)
			}
			out = append(out, fmt.Sprintf("%s.%s:%d:%s", name, tb.Name, d.Rows, d.Digest))
		}
		db.Close()
	}
	return strings.Join(out, " ")
}
