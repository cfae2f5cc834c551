package host

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"mesh-controller/app/protocol"
	"mesh-controller/embedded/broker"
)

// liveMesh is a real host (Runner) of node n1 on the real embedded broker,
// connected as a host's user with a host's permissions (app/broker.go).
// The controller's part is played by a connection of the controller's
// user: it declares, answers the host's asks for its latest declaration
// and hears its apply reports, each checked to be signed by the host.
type liveMesh struct {
	t      *testing.T
	srv    *broker.Server
	ctl    *nats.Conn
	ctlKey ed25519.PrivateKey
	st     *State
	root   string
	log    *syncBuf
	// reports are the host's apply reports, in the order heard.
	reports chan protocol.AppliedBody

	mu     sync.Mutex
	latest *protocol.Envelope
	serial int

	stop func() // stops the host running
}

// newLiveMesh starts the broker (with JetStream, for the archives bucket,
// when archives) and makes n1's state; run starts its host.
func newLiveMesh(t *testing.T, archives bool) *liveMesh {
	t.Helper()
	op, acc, sys, err := broker.NewSeeds()
	if err != nil {
		t.Fatal(err)
	}
	keys, err := broker.KeysFromSeeds(op, acc, sys)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := keys.Trust(broker.JoinUser{Services: []string{protocol.JoinSubject}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := broker.Config{Listen: "127.0.0.1:0", Trust: tr}
	if archives {
		c.StoreDir = filepath.Join(t.TempDir(), "broker")
	}
	srv, err := broker.StartWith(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	m := &liveMesh{t: t, srv: srv, log: &syncBuf{}, reports: make(chan protocol.AppliedBody, 16), stop: func() {}}

	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	// The host's user, as app/broker.go's hostPermissions.
	hostJWT, err := keys.IssueUser("host n1", pub, broker.Permissions{
		Publish:   []string{"mesh.node.n1.>"},
		Subscribe: []string{"mesh.node.n1.inbox.>", protocol.HostInboxPrefix("n1") + ".>"},
	}, false)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := broker.Creds(hostJWT, seed)
	if err != nil {
		t.Fatal(err)
	}
	ctlPub, ctlKey, _ := ed25519.GenerateKey(rand.Reader)
	_, hostKey, _ := ed25519.GenerateKey(rand.Reader)
	id, _ := age.GenerateX25519Identity()
	wg, _ := wgtypes.GeneratePrivateKey()
	m.ctlKey = ctlKey
	m.st = &State{Dir: filepath.Join(t.TempDir(), "state"), Node: "n1", HostKey: hostKey, Age: id, Creds: creds,
		ControllerKey: ctlPub, BrokerURLs: []string{srv.ClientURL()}, WireGuard: wg}
	if err := m.st.save(); err != nil {
		t.Fatal(err)
	}
	m.root = filepath.Join(t.TempDir(), "root")

	// The controller's user, as app/broker.go's controllerPermissions.
	ctlJWT, ctlSeed, err := keys.NewUser("controller", broker.Permissions{Publish: []string{"mesh.>", "_INBOX.>", "$JS.API.>", "$JS.FC.>", "$O.>"},
		Subscribe: []string{"mesh.>", "_INBOX.>"}})
	if err != nil {
		t.Fatal(err)
	}
	m.ctl, err = nats.Connect(srv.ClientURL(), nats.UserJWTAndSeed(ctlJWT, string(ctlSeed)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.ctl.Close)
	m.answer(protocol.NodeSubject("n1", protocol.DeclarationAsk), func(*nats.Msg) any {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.latest == nil {
			return protocol.None{None: true}
		}
		return m.latest
	})
	m.answer(protocol.NodeSubject("n1", protocol.Applied), func(msg *nats.Msg) any {
		var body protocol.AppliedBody
		if err := m.opened(msg, &body); err != nil {
			t.Errorf("an applied report: %v", err)
			return protocol.OKReply{Error: err.Error()}
		}
		m.reports <- body
		return protocol.OKReply{OK: true}
	})
	return m
}

// opened opens a message the host signed.
func (m *liveMesh) opened(msg *nats.Msg, v any) error {
	return protocol.Open(msg.Data, m.st.HostKey.Public().(ed25519.PublicKey), v)
}

// answer answers requests on subject with what f says.
func (m *liveMesh) answer(subject string, f func(*nats.Msg) any) {
	m.t.Helper()
	if _, err := m.ctl.Subscribe(subject, func(msg *nats.Msg) {
		b, _ := json.Marshal(f(msg))
		msg.Respond(b)
	}); err != nil {
		m.t.Fatal(err)
	}
}

// run runs r, a runner of n1's state beneath m.root, until the test ends
// or m.stop is called, once it is heard beating.
func (m *liveMesh) run(r *Runner) {
	m.t.Helper()
	r.State, r.Root, r.Log, r.NoOverlayInterface = m.st, m.root, slog.New(slog.NewTextHandler(m.log, nil)), true
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	beats, err := m.ctl.SubscribeSync(protocol.NodeSubject("n1", protocol.Heartbeat))
	if err != nil {
		m.t.Fatal(err)
	}
	defer beats.Unsubscribe()
	go func() { done <- r.Run(ctx) }()
	if _, err := beats.NextMsg(20 * time.Second); err != nil {
		m.t.Fatalf("the host does not beat: %v; its log:\n%s", err, m.log.String())
	}
	var once sync.Once
	m.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				m.t.Errorf("the host: %v", err)
			}
		})
	}
	m.t.Cleanup(m.stop)
}

// push declares body to n1 with the next serial, and returns the serial:
// pushed on its inbox, and its latest when asked.
func (m *liveMesh) push(body map[string]any) int64 {
	m.t.Helper()
	m.mu.Lock()
	m.serial++
	body["node"], body["serial"] = "n1", m.serial
	if body["modules"] == nil {
		body["modules"] = []any{}
	}
	env := sealed(m.t, m.ctlKey, body)
	m.latest = &env
	serial := int64(m.serial)
	m.mu.Unlock()
	b, _ := json.Marshal(env)
	if err := m.ctl.Publish(protocol.DeclarationInbox("n1"), b); err != nil {
		m.t.Fatal(err)
	}
	return serial
}

// report waits for the host's next apply report.
func (m *liveMesh) report(within time.Duration) protocol.AppliedBody {
	m.t.Helper()
	select {
	case r := <-m.reports:
		return r
	case <-time.After(within):
		m.t.Fatalf("no apply report within %s; the host's log:\n%s", within, m.log.String())
	}
	return protocol.AppliedBody{}
}

// declare pushes body and waits until the host applied it: any other
// report meanwhile, or one that it failed, fails the test.
func (m *liveMesh) declare(body map[string]any) {
	m.t.Helper()
	serial := m.push(body)
	for {
		r := m.report(20 * time.Second)
		if !r.OK {
			m.t.Fatalf("declaration %d not applied: %s", r.Serial, r.Error)
		}
		if r.Serial == serial {
			return
		}
	}
}

// syncBuf is a log many goroutines write.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
