package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/nats-io/nats.go"

	"mesh-controller/app"
	"mesh-controller/app/apptest"
	"mesh-controller/app/host"
	"mesh-controller/app/protocol"
	"mesh-controller/embedded/broker"
)

// A mesh on loopback for end-to-end tests: the real daemon with its embedded
// broker, real SQLite files, and real hosts. Nothing is mocked.
type testMesh struct {
	t      testing.TB
	c      *apptest.Mesh
	listen string
	url    string
	count  *app.Counters
	cancel context.CancelFunc
	done   chan error
	logs   *syncBuffer
	// operator is the operator key's private half, kept off the mesh.
	operator *age.X25519Identity
	// opts are extra serve options (bounds, check interval, healer limits).
	opts app.ServeOptions
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// logged says whether one line of the daemon's text log has msg and each
// key and value after it, each written as slog's TextHandler writes it.
func (s *syncBuffer) logged(msg string, kv ...any) bool {
	want := []string{textAttr(slog.MessageKey, msg)}
	for i := 0; i+1 < len(kv); i += 2 {
		want = append(want, textAttr(kv[i].(string), kv[i+1]))
	}
	for line := range strings.Lines(s.String()) {
		line = " " + strings.TrimSpace(line) + " "
		if !slices.ContainsFunc(want, func(w string) bool { return !strings.Contains(line, " "+w+" ") }) {
			return true
		}
	}
	return false
}

// textAttr is key=value as slog's TextHandler writes it (quoted if need
// be); key msg is the record's message.
func textAttr(key string, value any) string {
	var b bytes.Buffer
	isMsg := key == slog.MessageKey
	l := slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) == 0 && (a.Key == slog.TimeKey || a.Key == slog.LevelKey || (!isMsg && a.Key == slog.MessageKey && a.Value.String() == "")) {
			return slog.Attr{}
		}
		return a
	}}))
	if isMsg {
		l.Info(fmt.Sprint(value))
	} else {
		l.Info("", key, value)
	}
	return strings.TrimSpace(b.String())
}

// newController is the controller on data dir dir, the one place the
// suite makes one, so that what the use cases hang on changes here alone.
func newController(t testing.TB, dir string) *apptest.Mesh {
	t.Helper()
	c := apptest.New(dir)
	t.Cleanup(func() { c.Close() })
	return c
}

// migrated is a controller on migrated stores in a temporary dir, no daemon,
// and its stores.
func migrated(t testing.TB) (*apptest.Mesh, *app.Stores) {
	t.Helper()
	c := newController(t, t.TempDir())
	c.Getenv = func(string) string { return "" }
	if _, err := c.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	st, err := c.Stores(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return c, st
}

// withOperator sets a new operator key on c and returns its identity, which
// opens what is sealed to the operator (backups, break-glass copies).
func withOperator(t testing.TB, c *apptest.Mesh) *age.X25519Identity {
	t.Helper()
	op, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.OperatorKeySet(context.Background(), op.Recipient().String(), false); err != nil {
		t.Fatal(err)
	}
	return op
}

// freeAddr picks a loopback address no one listens on, so a controller can be
// restarted on the same one.
func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func newTestMesh(t testing.TB) *testMesh { return newTestMeshEnv(t, nil) }

// newTestMeshEnv is newTestMesh with the stores env names (MESH_STORE_…),
// the rest in a temporary data dir.
func newTestMeshEnv(t testing.TB, env map[string]string) *testMesh {
	t.Helper()
	return newTestMeshOn(t, env, freeAddr(t))
}

// newTestMeshOn is newTestMeshEnv with the broker listening on listen
// (host:port, port 0 picks one): an address other than loopback, for hosts
// in another network namespace.
func newTestMeshOn(t testing.TB, env map[string]string, listen string) *testMesh {
	t.Helper()
	c := newController(t, t.TempDir())
	c.Getenv = func(k string) string { return env[k] }
	if _, err := c.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	m := &testMesh{t: t, c: c, listen: listen, logs: &syncBuffer{}, operator: withOperator(t, c)}
	m.start()
	t.Cleanup(m.stop)
	return m
}

func (m *testMesh) start() {
	m.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan app.Ready, 1)
	m.count = &app.Counters{}
	m.cancel, m.done = cancel, make(chan error, 1)
	go func() {
		o := m.opts
		o.Listen, o.Log, o.FlushEvery, o.Counters, o.Ready = m.listen, m.logs, 20*time.Millisecond, m.count, func(r app.Ready) { ready <- r }
		m.done <- m.c.Serve(ctx, o)
	}()
	select {
	case r := <-ready:
		m.url = r.BrokerURL
	case err := <-m.done:
		// Serve has returned: nothing is left for stop to wait on.
		m.cancel()
		m.cancel = nil
		m.t.Fatalf("serve: %v", err)
	case <-time.After(20 * time.Second):
		m.t.Fatal("serve not ready after 20s")
	}
}

func (m *testMesh) stop() {
	if m.cancel == nil {
		return
	}
	m.cancel()
	if err := <-m.done; err != nil {
		m.t.Errorf("serve: %v", err)
	}
	m.cancel = nil
}

type testHost struct {
	t testing.TB
	// sup, if set, is the supervisor its runner uses (a shorter back-off).
	sup *host.Supervisor
	// users runs each module as its own system user (as root).
	users bool
	// factsEvery, if set, is how often its host looks for changed facts.
	factsEvery time.Duration
	name       string
	state      *host.State
	root       string
	cancel     context.CancelFunc
	done       chan error
}

// join issues a token for a new node and joins a host with it.
func (m *testMesh) join(name string) *testHost { return m.joinWith(name, nil) }

// joinWith joins a host whose runner uses sup, if given.
func (m *testMesh) joinWith(name string, sup *host.Supervisor) *testHost {
	m.t.Helper()
	return m.joinToken(name, app.TokenRequest{Node: name, New: true, TTL: time.Hour}, sup)
}

// joinToken joins a host with a token issued as r asks (a new adopted
// node, say), its runner using sup if given.
func (m *testMesh) joinToken(name string, r app.TokenRequest, sup *host.Supervisor) *testHost {
	m.t.Helper()
	tok, err := m.c.TokenIssue(context.Background(), r)
	if err != nil {
		m.t.Fatal(err)
	}
	dir := m.t.TempDir()
	st, err := host.Join(context.Background(), host.JoinOptions{Broker: m.url, Token: tok.Token, Node: name, State: filepath.Join(dir, "state")})
	if err != nil {
		m.t.Fatalf("join %s: %v", name, err)
	}
	h := &testHost{t: m.t, name: name, state: st, root: filepath.Join(dir, "root"), sup: sup}
	h.start()
	m.t.Cleanup(h.stop)
	return h
}

func (h *testHost) start() {
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel, h.done = cancel, make(chan error, 1)
	st, err := host.Load(h.state.Dir)
	if err != nil {
		h.t.Fatal(err)
	}
	// In-process hosts share the test's network namespace, the machine's:
	// an overlay declared to them is written, never brought up there. They
	// beat as often as a host may (every 100 ms, the daemon's budget): a
	// faster beat had half its heartbeats dropped as too many.
	r := &host.Runner{State: st, Root: h.root, Heartbeat: 100 * time.Millisecond, Supervisor: h.sup, ModuleUsers: h.users, FactsEvery: h.factsEvery,
		NoOverlayInterface: true}
	go func() { h.done <- r.Run(ctx) }()
}

func (h *testHost) stop() {
	if h.cancel == nil {
		return
	}
	h.cancel()
	if err := <-h.done; err != nil {
		h.t.Errorf("host %s: %v", h.name, err)
	}
	h.cancel = nil
}

// settle is how long a test waits for the mesh to come to what it awaits
// (a host to beat, apply, report; a condition to open): long, for a
// machine shared with other work.
const settle = 15 * time.Second

// checkFor polls check until it returns nil, failing the test after
// timeout with the last error check returned: the failure says what was
// not so yet, and what was seen instead.
func checkFor(t testing.TB, timeout time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v", timeout, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// allOf is a check that every one of checks passes at once; it says the
// first that does not.
func allOf(checks ...func() error) func() error {
	return func() error {
		for _, check := range checks {
			if err := check(); err != nil {
				return err
			}
		}
		return nil
	}
}

// applied is a check that node has applied declaration serial; it says
// what it applied instead, and why its last apply failed if one did.
func (m *testMesh) applied(node string, serial int64) func() error {
	return func() error {
		n := m.node(node)
		if n.SerialApplied == serial {
			return nil
		}
		return fmt.Errorf("%s has applied declaration %d, not %d (declared %d)%s", node, n.SerialApplied, serial, n.SerialDeclared, applyFailure(n))
	}
}

// appliedFrom is a check that node has applied declaration serial or a
// later one.
func (m *testMesh) appliedFrom(node string, serial int64) func() error {
	return func() error {
		n := m.node(node)
		if n.SerialApplied >= serial {
			return nil
		}
		return fmt.Errorf("%s has applied declaration %d, not %d yet (declared %d)%s", node, n.SerialApplied, serial, n.SerialDeclared, applyFailure(n))
	}
}

// applyFailure says why a node's last apply failed, "" if it did not.
func applyFailure(n app.NodeDetail) string {
	if a := n.LastApply; a != nil && !a.OK {
		return fmt.Sprintf("; its apply of %d failed: %s", a.Serial, a.Error)
	}
	return ""
}

// upToDate is a check that node applied the declaration of its plan as it
// is now (it is not behind), and some declaration at all.
func (m *testMesh) upToDate(node string) func() error {
	return func() error {
		n := m.node(node)
		if !n.Behind && n.SerialApplied > 0 {
			return nil
		}
		return fmt.Errorf("%s is behind its plan: applied %d, declared %d%s", node, n.SerialApplied, n.SerialDeclared, applyFailure(n))
	}
}

// reported is a check that node's host reported its facts.
func (m *testMesh) reported(node string) func() error {
	return func() error {
		if n := m.node(node); len(n.Facts) == 0 {
			return fmt.Errorf("%s has reported no facts (joined %v, heard from at %s)", node, n.Joined, timeOf(n.LastHeard))
		}
		return nil
	}
}

// notBehind is a check that node is not behind its plan: it applied the
// declaration of its plan as it is now, or was never declared one.
func (m *testMesh) notBehind(node string) func() error {
	return func() error {
		if n := m.node(node); n.Behind {
			return fmt.Errorf("%s is behind its plan: applied %d, declared %d%s", node, n.SerialApplied, n.SerialDeclared, applyFailure(n))
		}
		return nil
	}
}

// connClosed is a check that the broker connection nc (what) is closed.
func connClosed(nc *nats.Conn, what string) func() error {
	return func() error {
		if !nc.IsClosed() {
			return fmt.Errorf("%s is %s, not closed", what, nc.Status())
		}
		return nil
	}
}

// disconnected is a check that the broker connection nc (what) is not
// connected.
func disconnected(nc *nats.Conn, what string) func() error {
	return func() error {
		if nc.IsConnected() {
			return fmt.Errorf("%s is still connected", what)
		}
		return nil
	}
}

// heard is a check that node's host has been heard from (joining is).
func (m *testMesh) heard(node string) func() error {
	return func() error {
		if n := m.node(node); n.LastHeard == nil {
			return fmt.Errorf("%s has not been heard from (joined %v)", node, n.Joined)
		}
		return nil
	}
}

// beating is a check that node's host has beaten: heard, and saying how
// often it beats.
func (m *testMesh) beating(node string) func() error {
	return func() error {
		n := m.node(node)
		if n.LastHeard == nil {
			return fmt.Errorf("%s has not been heard from (joined %v)", node, n.Joined)
		}
		if n.HeartbeatS == 0 {
			return fmt.Errorf("%s has not beaten (heard from at %s)", node, timeOf(n.LastHeard))
		}
		return nil
	}
}

// droppedFor is a check that count messages claiming to be node's were
// refused for reason; it says which were.
func (m *testMesh) droppedFor(node, reason string, count int64) func() error {
	return func() error {
		dropped := m.node(node).Dropped
		for _, d := range dropped {
			if d.Reason == reason && d.Count == count {
				return nil
			}
		}
		return fmt.Errorf("not %d of %s's messages refused for %s; refused: %+v", count, node, reason, dropped)
	}
}

// fileHolds is a check that file holds value (a secret: a failure says only
// how much it holds).
func fileHolds(file, value string) func() error {
	return func() error {
		b, err := os.ReadFile(file)
		if err == nil && string(b) != value {
			err = fmt.Errorf("%s holds %d bytes, not the %d expected", file, len(b), len(value))
		}
		return err
	}
}

// gone is a check that nothing is at path.
func gone(path string) func() error {
	return func() error {
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%s is still there (%v)", path, err)
		}
		return nil
	}
}

// timeOf is a time that may be missing, to be read in a failure.
func timeOf(at *time.Time) string {
	if at == nil {
		return "never"
	}
	return at.Format(time.RFC3339Nano)
}

// beatsAbove is a check that the mesh absorbed more than n heartbeats.
func (m *testMesh) beatsAbove(n int64) func() error {
	return func() error {
		if got := m.count.Beats.Load(); got <= n {
			return fmt.Errorf("%d heartbeats absorbed, not more than %d (%d dropped)", got, n, m.count.Dropped.Load())
		}
		return nil
	}
}

// opened is a check that the condition key is open; it says which are.
func (m *testMesh) opened(t *testing.T, key string) func() error {
	return func() error {
		open := m.openKeys(t)
		if slices.Contains(open, key) {
			return nil
		}
		return fmt.Errorf("%s is not open; open: %q", key, open)
	}
}

// cleared is a check that the condition key is not open.
func (m *testMesh) cleared(t *testing.T, key string) func() error {
	return func() error {
		if m.open(t, key) {
			return fmt.Errorf("%s is still open", key)
		}
		return nil
	}
}

// moduleIn is a check that module on node is reported in state; it says
// the state it is in, and why.
func (m *testMesh) moduleIn(node, module, state string) func() error {
	return func() error {
		s := m.moduleState(node, module)
		if s.State == state {
			return nil
		}
		if s.State == "" {
			return fmt.Errorf("%s on %s is not %s: not assigned there", module, node, state)
		}
		return fmt.Errorf("%s on %s is %s, not %s (detail %q, last exit %q)", module, node, s.State, state, s.Detail, s.LastExit)
	}
}

// readyAgain is a check that module on node is ready in another process
// than pid; it says what it is instead.
func (m *testMesh) readyAgain(node, module string, pid int) func() error {
	return func() error {
		if s := m.moduleState(node, module); s.State != protocol.StateReady || s.Pid == pid {
			return fmt.Errorf("%s on %s is %s as pid %d, not ready again after pid %d (detail %q, last exit %q)", module, node, s.State, s.Pid, pid, s.Detail, s.LastExit)
		}
		return nil
	}
}

// moduleGone is a check that node no longer reports module, nor has it
// assigned.
func (m *testMesh) moduleGone(node, module string) func() error {
	return func() error {
		if s := m.moduleState(node, module); s.Module != "" {
			return fmt.Errorf("%s on %s is still reported, %s as pid %d", module, node, s.State, s.Pid)
		}
		return nil
	}
}

// logSays is a check that the daemon's log holds s; it says what the log
// said last.
func (m *testMesh) logSays(s string) func() error {
	return func() error {
		logs := m.logs.String()
		if strings.Contains(logs, s) {
			return nil
		}
		return fmt.Errorf("the log does not say %q; it ends:\n%s", s, lastLines(logs, 5))
	}
}

// lastLines is s's last n lines.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func (m *testMesh) node(name string) app.NodeDetail {
	m.t.Helper()
	n, err := m.c.NodeShow(context.Background(), name)
	if err != nil {
		m.t.Fatal(err)
	}
	return n
}

func (m *testMesh) declare(node, body string) app.Declared {
	m.t.Helper()
	d, err := m.c.Declare(context.Background(), app.DeclareRequest{Node: node, Body: []byte(body), From: "test", Why: "test"})
	if err != nil {
		m.t.Fatal(err)
	}
	return d
}

func moduleBody(module, dataPath string) string {
	return `{"modules": [{"module": "` + module + `", "version": "1.0.0", "settings": {"workers": 2},
		"data": [{"name": "data", "path": "` + dataPath + `", "precious": "irreplaceable"}]}]}`
}

func TestMesh_JoinReportDeclare(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	hosts := []*testHost{m.join("web1"), m.join("web2"), m.join("web3")}
	for _, h := range hosts {
		checkFor(t, settle, func() error {
			if n := m.node(h.name); !n.Joined || len(n.Facts) == 0 || n.HeartbeatS == 0 {
				return fmt.Errorf("%s joined %v, with %d facts, beating every %vs", h.name, n.Joined, len(n.Facts), n.HeartbeatS)
			}
			return nil
		})
	}
	n := m.node("web1")
	facts := map[string]string{}
	for _, f := range n.Facts {
		if f.Why == "" {
			t.Errorf("fact %s has no evidence", f.Name)
		}
		facts[f.Name] = f.Value
	}
	for _, name := range []string{"arch", "os", "cores", "memory_mb", "disk_free_mb"} {
		if facts[name] == "" {
			t.Errorf("no fact %s: %v", name, facts)
		}
	}

	d := m.declare("web1", moduleBody("paperless", "/var/lib/paperless/media"))
	if !d.Sent || d.Serial != 1 {
		t.Fatalf("declare: %+v", d)
	}
	checkFor(t, settle, m.applied("web1", 1))
	h := hosts[0]
	if _, err := os.Stat(filepath.Join(h.root, "etc/mesh/modules/paperless/settings.json")); err != nil {
		t.Fatal(err)
	}
	media := filepath.Join(h.root, "var/lib/paperless/media")
	if err := os.WriteFile(filepath.Join(media, "scan.pdf"), []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}

	// A second declaration without paperless: its files go, its data stays.
	m.declare("web1", moduleBody("smtp-relay", "/var/spool/relay"))
	checkFor(t, settle, m.applied("web1", 2))
	if _, err := os.Stat(filepath.Join(h.root, "etc/mesh/modules/paperless/module.json")); !os.IsNotExist(err) {
		t.Errorf("an undeclared module's file was kept: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(media, "scan.pdf")); err != nil || string(b) != "precious" {
		t.Fatalf("data of an undeclared module was touched: %v", err)
	}
	// The data report has the new module's data set, and still the old one's:
	// data no longer declared stays, and stays reported, until deleted.
	checkFor(t, settle, func() error {
		ds := m.node("web1").Data
		if len(ds) == 2 && ds[0].Module == "paperless" && ds[0].Bytes == int64(len("precious")) && ds[1].Module == "smtp-relay" && ds[1].Path == "/var/spool/relay" {
			return nil
		}
		return fmt.Errorf("web1 reports data %+v, not paperless's %d bytes and smtp-relay's /var/spool/relay", ds, len("precious"))
	})
	list, err := m.c.NodeList(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if list[0].SerialDeclared != 2 || list[0].SerialApplied != 2 || list[1].SerialDeclared != 0 {
		t.Fatalf("node list serials: %+v", list)
	}
}

// A host that was offline applies the latest declaration when it is back,
// and a controller that was down sends what was declared meanwhile.
func TestMesh_OfflineHostAndController(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	h := m.join("web1")
	checkFor(t, settle, m.heard("web1"))

	h.stop()
	m.declare("web1", moduleBody("one", "/srv/one"))
	m.declare("web1", moduleBody("two", "/srv/two"))
	h.start()
	checkFor(t, settle, m.applied("web1", 2))
	if _, err := os.Stat(filepath.Join(h.root, "etc/mesh/modules/two/module.json")); err != nil {
		t.Fatal(err)
	}

	m.stop()
	d := m.declare("web1", moduleBody("three", "/srv/three"))
	if d.Sent || !strings.Contains(d.NotSent, "no controller is serving") {
		t.Fatalf("declared while down: %+v", d)
	}
	m.start() // same address: the host reconnects by itself
	checkFor(t, settle, m.applied("web1", 3))
}

func TestMesh_TokenUsedTwice(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	tok, err := m.c.TokenIssue(context.Background(), app.TokenRequest{Node: "web1", New: true, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	join := func() error {
		_, err := host.Join(context.Background(), host.JoinOptions{Broker: m.url, Token: tok.Token, Node: "web1", State: filepath.Join(t.TempDir(), "s")})
		return err
	}
	if err := join(); err != nil {
		t.Fatal(err)
	}
	err = join()
	if err == nil || !errors.Is(err, host.ErrRefused) || !strings.Contains(err.Error(), protocol.JoinRefused) {
		t.Fatalf("second join: %v", err)
	}
	st, err := m.c.Stores(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := st.Identity.NodeTokenReuses(context.Background(), "web1"); n != 1 {
		t.Fatalf("the reuse was remembered %d times, want 1", n)
	}

	// A token for another node, an unknown token and an unknown node are
	// refused too, with the same answer; the log says which.
	other, _ := m.c.TokenIssue(context.Background(), app.TokenRequest{Node: "web2", New: true, TTL: time.Hour})
	for reason, o := range map[string]host.JoinOptions{
		"token of another node": {Token: other.Token, Node: "web1"},
		"unknown token":         {Token: "meshjoin_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", Node: "web2"},
		"unknown token ":        {Token: "meshjoin_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", Node: "web9"},
	} {
		o.Broker, o.State = m.url, filepath.Join(t.TempDir(), "s")
		if _, err := host.Join(context.Background(), o); err == nil || !strings.Contains(err.Error(), protocol.JoinRefused) {
			t.Errorf("%s: got %v", reason, err)
		}
		if !regexp.MustCompile(`msg="join refused" node=` + o.Node + ` source=127\.0\.0\.1 err="` + strings.TrimSpace(reason) + `: `).MatchString(m.logs.String()) {
			t.Errorf("the log does not say %s's join refused (%s):\n%s", o.Node, reason, m.logs.String())
		}
	}
}

func TestMesh_BadSignatureDroppedAndCounted(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	h := m.join("web1")
	checkFor(t, settle, m.beatsAbove(0))
	h.stop()

	// web1's own broker user, but a key that is not the one it joined with.
	st, err := host.Load(h.state.Dir)
	if err != nil {
		t.Fatal(err)
	}
	_, st.HostKey, _ = newEd25519()
	nc := connectAs(t, m.url, st)
	beats := m.count.Beats.Load()
	if err := publishSigned(nc, st, "heartbeat"); err != nil {
		t.Fatal(err)
	}
	checkFor(t, settle, m.droppedFor("web1", "bad signature", 1))
	if m.count.Beats.Load() != beats {
		t.Fatal("a forged heartbeat was absorbed")
	}
	if !m.logs.logged("dropped", "subject", "mesh.node.web1.heartbeat", "node", "web1", "reason", "bad signature") {
		t.Fatalf("the drop was not logged:\n%s", m.logs.String())
	}
}

// externalBroker starts a broker apart from any controller, listening on
// addr and trusting st's operator, as 'broker show --broker' configures
// one; trust starts it again.
func externalBroker(t testing.TB, st *app.Stores, addr string) (*broker.Server, broker.Trust) {
	t.Helper()
	keys, err := app.BrokerKeys(context.Background(), st.Identity)
	if err != nil {
		t.Fatal(err)
	}
	trust, err := keys.Trust(app.JoinUser(), nil)
	if err != nil {
		t.Fatal(err)
	}
	external, err := broker.Start(addr, trust)
	if err != nil {
		t.Fatal(err)
	}
	return external, trust
}

// With --broker the controller uses an existing NATS that trusts its
// operator (configured as broker show --broker prints), instead of embedding one.
func TestMesh_ExternalBroker(t *testing.T) {
	t.Parallel()
	c, st := migrated(t)
	external, _ := externalBroker(t, st, freeAddr(t))
	defer external.Shutdown()
	c.Broker = external.ClientURL()

	m := &testMesh{t: t, c: c, listen: "unused:0", logs: &syncBuffer{}}
	m.start()
	defer m.stop()
	if m.url != external.ClientURL() {
		t.Fatalf("serving on %s, want the external %s", m.url, external.ClientURL())
	}
	m.join("web1")
	m.declare("web1", moduleBody("one", "/srv/one"))
	checkFor(t, settle, m.applied("web1", 1))
	// A broker without a full resolver cannot be given revocations by the
	// controller: the log says what a person must do.
	if !strings.Contains(m.logs.String(), "no broker server took the account JWT: give the broker a full resolver") {
		t.Errorf("the log does not say the broker takes no pushed JWT:\n%s", m.logs)
	}
}
