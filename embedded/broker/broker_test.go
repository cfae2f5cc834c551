package broker

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// What these tests hold is what the embedded server really enforces, which
// the mesh's permissions are chosen from (app/broker.go).

var testJoin = JoinUser{
	Permissions:  Permissions{Publish: []string{"mesh.join"}, Subscribe: []string{"_INBOX.join.>"}, MaxPayload: 4096, MaxSubs: 2},
	Services:     []string{"mesh.join"},
	MaxConns:     4,
	AnswerWithin: 10 * time.Second,
}

func newKeys(t *testing.T) Keys {
	t.Helper()
	op, acc, sys, err := NewSeeds()
	if err != nil {
		t.Fatal(err)
	}
	k, err := KeysFromSeeds(op, acc, sys)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func startServer(t *testing.T, k Keys) *Server {
	t.Helper()
	tr, err := k.Trust(testJoin, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Start("127.0.0.1:0", tr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// errs collects a connection's asynchronous errors (permission violations).
type errs chan error

func connect(t *testing.T, s *Server, opts ...nats.Option) (*nats.Conn, errs) {
	t.Helper()
	e := make(errs, 16)
	opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { e <- err }), nats.NoReconnect())
	nc, err := nats.Connect(s.ClientURL(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc, e
}

func connectUser(t *testing.T, s *Server, userJWT string, seed []byte) (*nats.Conn, errs) {
	t.Helper()
	return connect(t, s, nats.UserJWTAndSeed(userJWT, string(seed)))
}

func (e errs) none(t *testing.T) {
	t.Helper()
	select {
	case err := <-e:
		t.Fatalf("refused: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
}

func (e errs) refused(t *testing.T, subject string) {
	t.Helper()
	select {
	case err := <-e:
		if !strings.Contains(err.Error(), "Permissions Violation for Publish to \""+subject+"\"") {
			t.Fatalf("want a publish violation on %s, got %v", subject, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("the server let the user publish on %s", subject)
	}
}

// The join and admit accounts' keys are derived: the same from the same
// seeds, each its own.
func TestKeys_DerivedAccountsAreStable(t *testing.T) {
	op, acc, sys, err := NewSeeds()
	if err != nil {
		t.Fatal(err)
	}
	a, _ := KeysFromSeeds(op, acc, sys)
	b, _ := KeysFromSeeds(op, acc, sys)
	pub := func(k nkeys.KeyPair) string { p, _ := k.PublicKey(); return p }
	if pub(a.Join) != pub(b.Join) || pub(a.Admit) != pub(b.Admit) || !strings.HasPrefix(pub(a.Join), "A") || !strings.HasPrefix(pub(a.Admit), "A") {
		t.Fatalf("join %s then %s, admit %s then %s", pub(a.Join), pub(b.Join), pub(a.Admit), pub(b.Admit))
	}
	if seen := map[string]bool{pub(a.Account): true, pub(a.System): true, pub(a.Join): true, pub(a.Admit): true}; len(seen) != 4 {
		t.Fatal("two accounts share a key")
	}
}

// A NATS response permission (allow_responses) lets a user publish to any
// reply subject it was handed, even one its deny list names: this is why no
// mesh user is given one.
func TestServer_ResponsePermissionIgnoresDeny(t *testing.T) {
	k := newKeys(t)
	s := startServer(t, k)
	ctlJWT, ctlSeed, err := k.NewUser("controller", Permissions{Publish: []string{">"}, Subscribe: []string{">"}})
	if err != nil {
		t.Fatal(err)
	}
	ctl, _ := connectUser(t, s, ctlJWT, ctlSeed)
	alerts, _ := ctl.SubscribeSync("mesh.alert")

	u, _ := nkeys.CreateUser()
	pub, _ := u.PublicKey()
	seed, _ := u.Seed()
	uc := jwt.NewUserClaims(pub)
	uc.Sub.Allow.Add("mesh.module.x")
	uc.Pub.Deny.Add(">", "mesh.>", "mesh.alert")
	uc.Resp = &jwt.ResponsePermission{MaxMsgs: 1}
	userJWT, err := uc.Encode(k.Account)
	if err != nil {
		t.Fatal(err)
	}
	nc, _ := connectUser(t, s, userJWT, seed)
	sub, _ := nc.SubscribeSync("mesh.module.x")
	nc.Flush()
	ctl.PublishRequest("mesh.module.x", "mesh.alert", []byte("ask"))
	m, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	m.Respond([]byte("not an alert"))
	nc.Flush()
	if _, err := alerts.NextMsg(2 * time.Second); err != nil {
		t.Fatalf("the server now stops a response its deny list names (%v): the permissions could use allow_responses again", err)
	}
}

// Answers allowed as plain publish subjects, _INBOX.*.*, reach a
// requester's inbox (nats.go's default request inbox: _INBOX.<id>.<n>), and
// nothing under mesh., nor an inbox one token deeper (a host's:
// _INBOX.<node>.<id>.<n>).
func TestServer_InboxAnswers(t *testing.T) {
	k := newKeys(t)
	s := startServer(t, k)
	ctlJWT, ctlSeed, _ := k.NewUser("controller", Permissions{Publish: []string{">"}, Subscribe: []string{">"}})
	ctl, _ := connectUser(t, s, ctlJWT, ctlSeed)
	userJWT, seed, err := k.NewUser("answers", Permissions{Publish: []string{"_INBOX.*.*"}, Subscribe: []string{"mesh.tool.x.>"}})
	if err != nil {
		t.Fatal(err)
	}
	nc, e := connectUser(t, s, userJWT, seed)
	nc.Subscribe("mesh.tool.x.>", func(m *nats.Msg) { m.Respond([]byte("answer")) })
	nc.Flush()

	if m, err := ctl.Request("mesh.tool.x.t", []byte("ask"), 5*time.Second); err != nil || string(m.Data) != "answer" {
		t.Fatalf("a request to the tool: %v", err)
	}
	e.none(t)
	for _, reply := range []string{"mesh.alert", "mesh.node.web2.inbox.declaration", "_INBOX.web2.abc.1"} {
		ctl.PublishRequest("mesh.tool.x.t", reply, []byte("ask"))
		e.refused(t, reply)
	}
}

// What a connection without credentials can and cannot do through the
// join account.
func TestServer_JoinAccount(t *testing.T) {
	k := newKeys(t)
	s := startServer(t, k)
	ctlJWT, ctlSeed, _ := k.NewUser("controller", Permissions{Publish: []string{"mesh.>", "_INBOX.>"}, Subscribe: []string{"mesh.>", "_INBOX.>"}})
	ctl, _ := connectUser(t, s, ctlJWT, ctlSeed)
	admitJWT, admitSeed, _ := k.NewAdmitter("admit", Permissions{Publish: []string{"_R_.>"}, Subscribe: []string{"mesh.join"}})
	admit, _ := connectUser(t, s, admitJWT, admitSeed)
	asked := make(chan *nats.Msg, 16)
	admitSub, _ := admit.Subscribe("mesh.join", func(m *nats.Msg) {
		asked <- m
		m.Respond([]byte("answer"))
	})
	admit.Flush()
	steered, _ := ctl.SubscribeSync("mesh.node.web2.heartbeat")
	meshJoins, _ := ctl.SubscribeSync("mesh.join")
	ctl.Flush()

	eavesdropper, _ := connect(t, s)
	overheard, _ := eavesdropper.SubscribeSync("_INBOX.join.>")
	eavesdropper.Flush()
	asker, _ := connect(t, s, nats.CustomInboxPrefix("_INBOX.join"))

	t.Run("a request reaches the mesh through the service, with who asked", func(t *testing.T) {
		req := nats.NewMsg("mesh.join")
		req.Data = []byte("ask")
		req.Header.Set(ClientInfoHdr, `{"host":"6.6.6.6"}`) // the server replaces it
		if _, err := asker.RequestMsg(req, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		m := <-asked
		if !strings.HasPrefix(m.Reply, "_R_.") {
			t.Fatalf("the mesh sees the reply %q, not the server's own", m.Reply)
		}
		values := m.Header.Values(ClientInfoHdr)
		var ci struct {
			Host string `json:"host"`
		}
		if len(values) != 1 || json.Unmarshal([]byte(values[0]), &ci) != nil || ci.Host != "127.0.0.1" {
			t.Fatalf("%s: %q", ClientInfoHdr, values)
		}
	})
	t.Run("another anonymous connection reads the answer", func(t *testing.T) {
		// So the broker cannot keep a join answer to its asker: the
		// controller seals it to the asker's own key.
		if _, err := overheard.NextMsg(5 * time.Second); err != nil {
			t.Fatalf("the join account no longer shares answers (%v): sealing them may be unnecessary", err)
		}
	})
	t.Run("a request never reaches the mesh account", func(t *testing.T) {
		if m, err := meshJoins.NextMsg(200 * time.Millisecond); err == nil {
			t.Fatalf("the mesh account heard %q", m.Data)
		}
	})
	t.Run("a reply subject cannot steer the answer into the mesh account", func(t *testing.T) {
		asker.PublishRequest("mesh.join", "mesh.node.web2.heartbeat", []byte("ask"))
		asker.Flush()
		<-asked
		if m, err := steered.NextMsg(500 * time.Millisecond); err == nil {
			t.Fatalf("the answer reached the mesh account's %s: %q", m.Subject, m.Data)
		}
	})
	t.Run("revoking users in the mesh account loses no answer in flight", func(t *testing.T) {
		// The admit account answers late, after the mesh account was updated.
		late, _ := connectUser(t, s, admitJWT, admitSeed)
		held := make(chan *nats.Msg, 1)
		late.QueueSubscribe("mesh.join", "late", func(m *nats.Msg) { held <- m })
		late.Flush()
		// The first answerer leaves before the request: Drain would leave
		// in its own time, and a request sent meanwhile reaches both (a
		// plain subscription and a queue group each get a copy), so the
		// first answer to arrive could be its "answer". The flush returns
		// once the server has taken the unsubscription.
		if err := admitSub.Unsubscribe(); err != nil {
			t.Fatal(err)
		}
		if err := admit.Flush(); err != nil {
			t.Fatal(err)
		}
		replies := make(chan *nats.Msg, 1)
		go func() {
			m, err := asker.Request("mesh.join", []byte("ask"), 5*time.Second)
			if err != nil {
				t.Error(err)
			}
			replies <- m
		}()
		m := <-held
		tr, err := k.Trust(testJoin, map[string]time.Time{"UAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA": time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.UpdateAccount(tr); err != nil {
			t.Fatal(err)
		}
		m.Respond([]byte("late answer"))
		if got := <-replies; got == nil || string(got.Data) != "late answer" {
			t.Fatalf("the answer in flight was lost: %v", got)
		}
	})
	t.Run("nothing of the mesh account can be read or written", func(t *testing.T) {
		nc, e := connect(t, s)
		for _, subject := range []string{"mesh.node.web1.heartbeat", "mesh.alert", "_INBOX.web1.x.y"} {
			nc.Publish(subject, []byte("{}"))
			e.refused(t, subject)
		}
	})
	t.Run("a message over the cap closes the connection", func(t *testing.T) {
		// nats.go knows the cap from the server and refuses itself…
		if err := asker.Publish("mesh.join", make([]byte, 5000)); !errors.Is(err, nats.ErrMaxPayload) {
			t.Fatalf("nats.go sent 5000 bytes: %v", err)
		}
		// …and a client that does not is cut off by the server, before it
		// reads the payload.
		if got := rawPublish(t, s.ClientURL(), "mesh.join", 7<<20); !strings.Contains(got, "Maximum Payload Violation") {
			t.Fatalf("the server answered %q to a 7 MB message", got)
		}
	})
	t.Run("subscriptions and connections are capped", func(t *testing.T) {
		nc, e := connect(t, s)
		for range 3 {
			nc.SubscribeSync("_INBOX.join.x")
		}
		nc.Flush()
		select {
		case err := <-e:
			if !strings.Contains(err.Error(), "maximum subscriptions exceeded") {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a third subscription was allowed")
		}
		// eavesdropper, asker and nc: a fourth is allowed, a fifth not
		connect(t, s)
		if _, err := nats.Connect(s.ClientURL(), nats.NoReconnect()); !errors.Is(err, nats.ErrMaxAccountConnectionsExceeded) {
			t.Fatalf("a fifth anonymous connection: %v", err)
		}
	})
}

// rawPublish publishes size bytes as a client that does not heed the
// server's limit would, and returns what the server answered.
func rawPublish(t *testing.T, url, subject string, size int) string {
	t.Helper()
	conn, r := rawConn(t, url)
	fmt.Fprintf(conn, "CONNECT {\"verbose\":false,\"pedantic\":false,\"protocol\":1}\r\nPING\r\n")
	if line, _ := r.ReadString('\n'); !strings.HasPrefix(line, "PONG") {
		t.Fatalf("connect: %q", line)
	}
	fmt.Fprintf(conn, "PUB %s _INBOX.join.x.1 %d\r\n", subject, size)
	go conn.Write(bytes.Repeat([]byte("x"), size))
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	var got strings.Builder
	for {
		line, err := r.ReadString('\n')
		got.WriteString(line)
		if err != nil || strings.HasPrefix(line, "-ERR") {
			return got.String()
		}
	}
}

// rawConn is a connection to the server at url, as a client that speaks
// the protocol itself, its INFO read; closed as t ends.
func rawConn(t *testing.T, url string) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "nats://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	r := bufio.NewReader(conn)
	if _, err := r.ReadString('\n'); err != nil { // INFO
		t.Fatal(err)
	}
	return conn, r
}

func startJetStream(t *testing.T, k Keys, dir string) *Server {
	t.Helper()
	tr, err := k.Trust(testJoin, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := StartWith(Config{Listen: "127.0.0.1:0", Trust: tr, StoreDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// With a store directory the mesh account has JetStream, in files only and
// bounded; it survives the account's update (a revocation) and a restart;
// a second server on the same store is refused. Without one, as before, no
// account has it.
func TestServer_JetStream(t *testing.T) {
	k := newKeys(t)
	all := Permissions{Publish: []string{">"}, Subscribe: []string{">"}}
	t.Run("off without a store directory", func(t *testing.T) {
		s := startServer(t, k)
		userJWT, seed, _ := k.NewUser("controller", all)
		nc, _ := connectUser(t, s, userJWT, seed)
		js, _ := nc.JetStream()
		if _, err := js.AccountInfo(nats.MaxWait(2 * time.Second)); err == nil {
			t.Fatal("JetStream answered without a store directory")
		}
	})
	dir := t.TempDir()
	s := startJetStream(t, k, dir)
	userJWT, seed, _ := k.NewUser("controller", all)
	nc, _ := connectUser(t, s, userJWT, seed)
	js, _ := nc.JetStream()
	info, err := js.AccountInfo()
	if err != nil {
		t.Fatal(err)
	}
	if info.Limits.MaxStore != MaxStore || info.Limits.MaxMemory != 0 || info.Limits.MaxStreams != maxStreams ||
		info.Limits.MaxConsumers != maxConsumers || !info.Limits.MaxBytesRequired {
		t.Fatalf("limits %+v", info.Limits)
	}
	if _, err := js.AddStream(&nats.StreamConfig{Name: "M", Subjects: []string{"m.>"}, Storage: nats.MemoryStorage, MaxBytes: 1 << 20}); err == nil {
		t.Fatal("a stream in memory was made")
	}
	if _, err := js.AddStream(&nats.StreamConfig{Name: "U", Subjects: []string{"u.>"}, Storage: nats.FileStorage}); err == nil {
		t.Fatal("a stream without max bytes was made")
	}
	if _, err := js.AddStream(&nats.StreamConfig{Name: "F", Subjects: []string{"f.>"}, Storage: nats.FileStorage, MaxBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish("f.1", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	tr, err := k.Trust(testJoin, map[string]time.Time{"UAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA": time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.UpdateAccount(tr); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish("f.2", []byte("after the update")); err != nil {
		t.Fatalf("after the account's update: %v", err)
	}
	if second, err := StartWith(Config{Listen: "127.0.0.1:0", Trust: tr, StoreDir: dir}); !errors.Is(err, ErrStoreInUse) {
		if second != nil {
			second.Shutdown()
		}
		t.Fatalf("a second server on the same store: %v", err)
	}
	nc.Close()
	s.Shutdown()

	s = startJetStream(t, k, dir)
	nc, _ = connectUser(t, s, userJWT, seed)
	js, _ = nc.JetStream()
	m, err := js.GetLastMsg("F", "f.1")
	if err != nil || string(m.Data) != "kept" {
		t.Fatalf("after a restart: %v", err)
	}
}

// The store's lock is not held by a child this process started while the
// server ran (as a fork holds it until it has exec'd): a server stopped
// and started again on the same store is not refused for it. Another
// process that holds the lock keeps a server out.
func TestServer_StoreLockAndChildren(t *testing.T) {
	k := newKeys(t)
	dir := t.TempDir()
	s := startJetStream(t, k, dir)
	// The child is given the lock file's descriptor, as a fork would be.
	child := exec.Command("sleep", "60")
	child.ExtraFiles = []*os.File{s.store.f}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { child.Process.Kill(); child.Wait() })
	s.Shutdown()
	startJetStream(t, k, dir).Shutdown()

	helper := exec.Command(os.Args[0], "-test.run=^TestHelperStoreLock$")
	helper.Env = append(os.Environ(), "BROKER_LOCK_HELPER="+dir)
	out, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { helper.Process.Kill(); helper.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "locked\n" {
		t.Fatalf("the helper did not take the lock: %q, %v", line, err)
	}
	tr, err := k.Trust(testJoin, nil)
	if err != nil {
		t.Fatal(err)
	}
	if second, err := StartWith(Config{Listen: "127.0.0.1:0", Trust: tr, StoreDir: dir}); !errors.Is(err, ErrStoreInUse) {
		if second != nil {
			second.Shutdown()
		}
		t.Fatalf("a server on a store another process holds: %v", err)
	}
}

// TestHelperStoreLock takes the store lock of $BROKER_LOCK_HELPER, says
// so and holds it until killed.
func TestHelperStoreLock(t *testing.T) {
	dir := os.Getenv("BROKER_LOCK_HELPER")
	if dir == "" {
		t.Skip("only run as the helper of TestServer_StoreLockAndChildren")
	}
	if _, err := lockStore(dir); err != nil {
		t.Fatal(err)
	}
	fmt.Println("locked")
	time.Sleep(time.Minute)
}

// Whoever may use the JetStream API chooses where the server answers (the
// request's reply subject) and where a push consumer delivers: the server
// checks neither against the user's permissions. So a user allowed only a
// stream's info, and one allowed only to make a consumer, make the server
// publish onto a subject they may not publish to themselves: what reads a
// mesh subject must not trust a message for the subject it came on
// (app/broker.go).
func TestServer_JetStreamAnswersAnywhere(t *testing.T) {
	k := newKeys(t)
	s := startJetStream(t, k, t.TempDir())
	ctlJWT, ctlSeed, _ := k.NewUser("controller", Permissions{Publish: []string{">"}, Subscribe: []string{">"}})
	ctl, _ := connectUser(t, s, ctlJWT, ctlSeed)
	js, _ := ctl.JetStream()
	if _, err := js.AddStream(&nats.StreamConfig{Name: "S", Subjects: []string{"s.>"}, MaxBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish("s.1", []byte("stored bytes")); err != nil {
		t.Fatal(err)
	}
	alerts, _ := ctl.SubscribeSync("mesh.alert")
	ctl.Flush()

	userJWT, seed, _ := k.NewUser("reader", Permissions{
		Publish:   []string{"$JS.API.STREAM.INFO.S", "$JS.API.CONSUMER.CREATE.S.*.s.>"},
		Subscribe: []string{"_INBOX.reader.>"}})
	nc, e := connectUser(t, s, userJWT, seed)
	nc.PublishRequest("$JS.API.STREAM.INFO.S", "mesh.alert", nil)
	if m, err := alerts.NextMsg(5 * time.Second); err != nil || !strings.Contains(string(m.Data), "stream_info_response") {
		t.Fatalf("the server no longer answers onto any reply subject (%v): the note in app/broker.go may go", err)
	}
	req, _ := json.Marshal(map[string]any{"stream_name": "S", "config": map[string]any{"name": "c1", "deliver_subject": "mesh.alert",
		"filter_subject": "s.1", "ack_policy": "none"}})
	nc.Publish("$JS.API.CONSUMER.CREATE.S.c1.s.1", req)
	if m, err := alerts.NextMsg(5 * time.Second); err != nil || string(m.Data) != "stored bytes" {
		t.Fatalf("the server no longer delivers onto any deliver subject (%v): the note in app/broker.go may go", err)
	}
	nc.Publish("mesh.alert", []byte("itself"))
	e.refused(t, "mesh.alert")
}

// A client whose CONNECT was checked late (a crowd of hosts coming back
// at once) is not pinged before its handshake's PONG: nats.go takes a
// PING there for a failed handshake and drops the connection. By default
// the server pings 2 to 2.4 s after CONNECT; this one waits its ping
// interval.
func TestServer_NoEarlyPing(t *testing.T) {
	t.Parallel()
	s := startServer(t, newKeys(t))
	conn, r := rawConn(t, s.ClientURL())
	// CONNECT alone: the handshake's PING, and so its PONG, not yet sent.
	fmt.Fprintf(conn, "CONNECT {\"verbose\":false,\"pedantic\":false,\"protocol\":1}\r\n")
	conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	if line, err := r.ReadString('\n'); err == nil {
		t.Fatalf("the server sent %q within 3 s of CONNECT, before the client's PING", line)
	} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("the connection ended: %v", err)
	}
}
