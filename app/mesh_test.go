package app

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

	"mesh-controller/app/host"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/health"
	"mesh-controller/embedded/broker"
)

// A mesh on loopback for end-to-end tests: the real daemon with its embedded
// broker, real SQLite files, and real hosts. Nothing is mocked.
type testMesh struct {
	t      testing.TB
	c      *Controller
	listen string
	url    string
	count  *Counters
	cancel context.CancelFunc
	done   chan error
	logs   *syncBuffer
	// operator is the operator key's private half, kept off the mesh.
	operator *age.X25519Identity
	// opts are extra serve options (bounds, check interval, healer limits).
	opts ServeOptions
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

// migrated is a controller on migrated stores in a temporary dir, no daemon,
// and its stores.
func migrated(t testing.TB) (*Controller, *Stores) {
	t.Helper()
	c := New(t.TempDir())
	c.Getenv = func(string) string { return "" }
	if _, err := c.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	st, err := c.stores(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return c, st
}

// withOperator sets a new operator key on c and returns its identity, which
// opens what is sealed to the operator (backups, break-glass copies).
func withOperator(t testing.TB, c *Controller) *age.X25519Identity {
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
	c := New(t.TempDir())
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
	ready := make(chan Ready, 1)
	m.count = &Counters{}
	m.cancel, m.done = cancel, make(chan error, 1)
	go func() {
		o := m.opts
		o.Listen, o.Log, o.FlushEvery, o.Counters, o.Ready = m.listen, m.logs, 20*time.Millisecond, m.count, func(r Ready) { ready <- r }
		m.done <- m.c.Serve(ctx, o)
	}()
	select {
	case r := <-ready:
		m.url = r.BrokerURL
	case err := <-m.done:
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
	return m.joinToken(name, TokenRequest{Node: name, New: true, TTL: time.Hour}, sup)
}

// joinToken joins a host with a token issued as r asks (a new adopted
// node, say), its runner using sup if given.
func (m *testMesh) joinToken(name string, r TokenRequest, sup *host.Supervisor) *testHost {
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

// waitFor polls cond until it holds, failing the test after a deadline.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 15s for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (m *testMesh) node(name string) NodeDetail {
	m.t.Helper()
	n, err := m.c.NodeShow(context.Background(), name)
	if err != nil {
		m.t.Fatal(err)
	}
	return n
}

func (m *testMesh) declare(node, body string) Declared {
	m.t.Helper()
	d, err := m.c.Declare(context.Background(), DeclareRequest{Node: node, Body: []byte(body), From: "test", Why: "test"})
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
	m := newTestMesh(t)
	hosts := []*testHost{m.join("web1"), m.join("web2"), m.join("web3")}
	for _, h := range hosts {
		waitFor(t, h.name+"'s facts and beats", func() bool {
			n := m.node(h.name)
			return n.Joined && len(n.Facts) > 0 && n.HeartbeatS > 0
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
	waitFor(t, "web1 to apply declaration 1", func() bool { return m.node("web1").SerialApplied == 1 })
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
	waitFor(t, "web1 to apply declaration 2", func() bool { return m.node("web1").SerialApplied == 2 })
	if _, err := os.Stat(filepath.Join(h.root, "etc/mesh/modules/paperless/module.json")); !os.IsNotExist(err) {
		t.Errorf("an undeclared module's file was kept: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(media, "scan.pdf")); err != nil || string(b) != "precious" {
		t.Fatalf("data of an undeclared module was touched: %v", err)
	}
	// The data report has the new module's data set, and still the old one's:
	// data no longer declared stays, and stays reported, until deleted.
	waitFor(t, "web1's data report", func() bool {
		ds := m.node("web1").Data
		return len(ds) == 2 && ds[0].Module == "paperless" && ds[0].Bytes == int64(len("precious")) && ds[1].Module == "smtp-relay" && ds[1].Path == "/var/spool/relay"
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
	m := newTestMesh(t)
	h := m.join("web1")
	waitFor(t, "web1 to beat", func() bool { return m.node("web1").LastHeard != nil })

	h.stop()
	m.declare("web1", moduleBody("one", "/srv/one"))
	m.declare("web1", moduleBody("two", "/srv/two"))
	h.start()
	waitFor(t, "web1 to apply the latest, 2", func() bool { return m.node("web1").SerialApplied == 2 })
	if _, err := os.Stat(filepath.Join(h.root, "etc/mesh/modules/two/module.json")); err != nil {
		t.Fatal(err)
	}

	m.stop()
	d := m.declare("web1", moduleBody("three", "/srv/three"))
	if d.Sent || !strings.Contains(d.NotSent, "no controller is serving") {
		t.Fatalf("declared while down: %+v", d)
	}
	m.start() // same address: the host reconnects by itself
	waitFor(t, "web1 to apply 3 after the controller came back", func() bool { return m.node("web1").SerialApplied == 3 })
}

func TestMesh_TokenUsedTwice(t *testing.T) {
	m := newTestMesh(t)
	tok, err := m.c.TokenIssue(context.Background(), TokenRequest{Node: "web1", New: true, TTL: time.Hour})
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
	st, err := m.c.stores(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := st.Identity.NodeTokenReuses(context.Background(), "web1"); n != 1 {
		t.Fatalf("the reuse was remembered %d times, want 1", n)
	}

	// A token for another node, an unknown token and an unknown node are
	// refused too, with the same answer; the log says which.
	other, _ := m.c.TokenIssue(context.Background(), TokenRequest{Node: "web2", New: true, TTL: time.Hour})
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
	m := newTestMesh(t)
	h := m.join("web1")
	waitFor(t, "web1 to beat", func() bool { return m.count.Beats.Load() > 0 })
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
	waitFor(t, "the forged heartbeat to be counted", func() bool {
		for _, d := range m.node("web1").Dropped {
			if d.Reason == "bad signature" && d.Count == 1 {
				return true
			}
		}
		return false
	})
	if m.count.Beats.Load() != beats {
		t.Fatal("a forged heartbeat was absorbed")
	}
	if !m.logs.logged("dropped", "subject", "mesh.node.web1.heartbeat", "node", "web1", "reason", "bad signature") {
		t.Fatalf("the drop was not logged:\n%s", m.logs.String())
	}
}

func TestDeclare_RecordsTheHandAct(t *testing.T) {
	c := New(t.TempDir())
	c.Getenv = func(string) string { return "" }
	ctx := context.Background()
	if _, err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.NodeAdd(ctx, "web1", false); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Declare(ctx, DeclareRequest{Node: "web1", Body: []byte(`{}`), From: "x.json"}); !errors.Is(err, health.ErrNoWhy) {
		t.Fatalf("no why: %v", err)
	}
	if _, err := c.Declare(ctx, DeclareRequest{Node: "web1", Body: []byte(`{"modules": []}`), From: "x.json", Why: "testing"}); err != nil {
		t.Fatal(err)
	}
	st, err := c.stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	acts, err := st.Health.HandActs(ctx, time.Time{})
	if err != nil || len(acts) != 1 || acts[0].Why != "testing" || acts[0].What != "declare web1 serial 1 from x.json" || acts[0].Who == "" {
		t.Fatalf("hand acts: %+v, %v", acts, err)
	}
}

// externalBroker starts a broker apart from any controller, listening on
// addr and trusting st's operator, as 'broker show --broker' configures
// one; trust starts it again.
func externalBroker(t testing.TB, st *Stores, addr string) (*broker.Server, broker.Trust) {
	t.Helper()
	keys, err := brokerKeys(context.Background(), st.Identity)
	if err != nil {
		t.Fatal(err)
	}
	trust, err := keys.Trust(joinUser(), nil)
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
	waitFor(t, "web1 to apply through the external broker", func() bool { return m.node("web1").SerialApplied == 1 })
	// A broker without a full resolver cannot be given revocations by the
	// controller: the log says what a person must do.
	if !strings.Contains(m.logs.String(), "no broker server took the account JWT: give the broker a full resolver") {
		t.Errorf("the log does not say the broker takes no pushed JWT:\n%s", m.logs)
	}
}
