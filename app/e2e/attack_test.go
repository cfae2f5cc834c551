package e2e

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"mesh-controller/app"
	"mesh-controller/app/host"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/health"
)

// The attacks of issue 11 (items 6–10), each performed against the real
// daemon and its embedded broker with exactly the credentials an attacker
// would hold: none (a connection without credentials), a host's, or a
// module's .creds. Each test fails if its attack works again.

// moduleConn connects with the .creds a module on node is issued.
func (m *testMesh) moduleConn(t *testing.T, module, node string) (*nats.Conn, violations) {
	t.Helper()
	creds, err := m.c.ModuleIssue(context.Background(), module, node)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), module+".creds")
	if err := os.WriteFile(f, []byte(creds), 0o600); err != nil {
		t.Fatal(err)
	}
	return connectWith(t, m.url, nats.UserCredentials(f), nats.NoReconnect())
}

// nothingOn fails if a message arrives on sub within a moment (one that
// contains any of like, if given: others are the mesh's own).
func nothingOn(t *testing.T, sub *nats.Subscription, what string, like ...string) {
	t.Helper()
	deadline := time.Now().Add(500 * time.Millisecond)
	for {
		msg, err := sub.NextMsg(time.Until(deadline))
		if err != nil {
			return
		}
		found := len(like) == 0
		for _, l := range like {
			found = found || strings.Contains(string(msg.Data), l)
		}
		if found {
			t.Fatalf("%s: %q arrived on %s", what, msg.Data, msg.Subject)
		}
	}
}

// Item 7: two modules relayed through each other. One emits an event with
// a reply subject of its choosing; the other, which consumes it, answers as
// a module does; with a NATS response permission the answer went wherever
// the first had said, mesh.alert or a host's declaration inbox included.
func TestAttack_ModulesRelayThroughEachOther(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	web1 := m.join("web1")
	ctx := context.Background()
	m.addModule(writeManifest(t, `{"module": "teller", "version": "1.0.0", "emits": ["news.told"]}`))
	m.addModule(writeManifest(t, `{"module": "listener", "version": "1.0.0", "consumes": ["news.told"], "tools": [{"name": "echo", "description": "says it back"}]}`))
	if _, err := m.c.Assign(ctx, "web1", []string{"teller", "listener"}); err != nil {
		t.Fatal(err)
	}
	teller, _ := m.moduleConn(t, "teller", "web1")
	listener, lv := m.moduleConn(t, "listener", "web1")
	// The listener answers whatever it is asked, as a naive module would.
	answer := func(msg *nats.Msg) { msg.Respond([]byte(`{"event":"raised","key":"node.silent/web1"}`)) }
	if _, err := listener.Subscribe("mesh.module.news.told", answer); err != nil {
		t.Fatal(err)
	}
	if _, err := listener.Subscribe("mesh.tool.listener.>", answer); err != nil {
		t.Fatal(err)
	}
	listener.Flush()
	ctl := m.controllerConn(t)
	alerts, _ := ctl.SubscribeSync(app.AlertSubject)
	declarations, _ := ctl.SubscribeSync("mesh.node.web1.inbox.>")
	ctl.Flush()

	for _, target := range []struct {
		reply string
		sub   *nats.Subscription
	}{{app.AlertSubject, alerts}, {"mesh.node.web1.inbox.declaration", declarations}, {"_INBOX.web1.x.1", nil}} {
		t.Run("onto "+target.reply, func(t *testing.T) {
			if err := teller.PublishRequest("mesh.module.news.told", target.reply, []byte("{}")); err != nil {
				t.Fatal(err)
			}
			teller.Flush()
			lv.expect(t, "publish", target.reply)
			if target.sub != nil {
				nothingOn(t, target.sub, "the relayed answer")
			}
		})
	}
	t.Run("a module still answers the controller's requests", func(t *testing.T) {
		if _, err := ctl.Request("mesh.tool.listener.echo", []byte("{}"), 5*time.Second); err != nil {
			t.Fatal(err)
		}
	})
	if n := m.node("web1"); n.LastApply != nil && !n.LastApply.OK {
		t.Fatalf("web1 reported a failed apply: %+v", n.LastApply)
	}
	t.Run("a reader tells the controller's alerts from anything else", func(t *testing.T) {
		id, err := m.c.IdentityShow(ctx)
		if err != nil {
			t.Fatal(err)
		}
		key, _ := base64.StdEncoding.DecodeString(id.PublicKey)
		plain := `{"event":"raised","condition":{"key":"node.silent/web1"}}`
		ctl.Publish(app.AlertSubject, []byte(plain))
		ctl.Flush()
		var msg *nats.Msg
		for msg == nil || string(msg.Data) != plain {
			if msg, err = alerts.NextMsg(5 * time.Second); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := protocol.OpenAlert(msg.Data, key); !errors.Is(err, protocol.ErrBadSignature) {
			t.Fatalf("a plain message on %s passed for an alert: %v", app.AlertSubject, err)
		}
		web1.stop()
		checkFor(t, settle, func() error {
			if n := m.node("web1"); n.LastHeard == nil || time.Since(*n.LastHeard) <= time.Second {
				return fmt.Errorf("web1 is not silent for a second: last heard from at %s", timeOf(n.LastHeard))
			}
			return nil
		})
		if _, err := m.c.SelfCheck(ctx, app.CheckOptions{NC: ctl}); err != nil {
			t.Fatal(err)
		}
		for {
			msg, err := alerts.NextMsg(5 * time.Second)
			if err != nil {
				t.Fatalf("no alert for node.silent/web1: %v", err)
			}
			a, err := protocol.OpenAlert(msg.Data, key)
			if err != nil {
				t.Fatalf("the controller's alert does not verify: %v", err)
			}
			if a.Event == "raised" && strings.Contains(string(a.Condition), "node.silent/web1") {
				break
			}
		}
	})
}

// Issue 33: a host no longer answers in an inbox of the requester's
// (_INBOX.*.*, which every host and module could publish to) but under its
// own subjects: each request the controller sends it names a reply subject
// mesh.node.N.answer.<unique> (protocol.AnswerSubject). No other host, no
// module and no anonymous connection may read or forge an answer there,
// and the controller, following a host's log, answers that host's parts
// in that host's own inbox only, whatever reply subject a part names.
func TestAttack_HostAnswerSubjects(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	web1, web2 := m.join("web1"), m.join("web2")
	web1.stop()
	web2.stop() // the test answers as web2's host, with its credentials
	ctx := context.Background()
	m.addModule(writeManifest(t, `{"module": "teller", "version": "1.0.0"}`))
	if _, err := m.c.Assign(ctx, "web1", []string{"teller"}); err != nil {
		t.Fatal(err)
	}
	teller, tv := m.moduleConn(t, "teller", "web1")
	opts1, err := web1.state.ConnectOptions()
	if err != nil {
		t.Fatal(err)
	}
	host1, hv := connectWith(t, m.url, opts1...)
	anon, av := m.anonymous(t)
	opts2, err := web2.state.ConnectOptions()
	if err != nil {
		t.Fatal(err)
	}
	host2, _ := connectWith(t, m.url, opts2...)
	asks, err := host2.SubscribeSync(protocol.NodeSubject("web2", protocol.LogsInbox))
	if err != nil {
		t.Fatal(err)
	}
	host2.Flush()
	ctl := m.controllerConn(t)
	hijacked := []*nats.Subscription{}
	hijacks := []string{"mesh.node.web1.inbox.attack", "_INBOX.web1.x.1", "_INBOX.web2x.1"}
	for _, subject := range hijacks {
		sub, err := ctl.SubscribeSync(subject)
		if err != nil {
			t.Fatal(err)
		}
		hijacked = append(hijacked, sub)
	}
	ctl.Flush()

	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lines := make(chan string, 64)
	done := make(chan error, 1)
	go func() {
		done <- m.c.Logs(lctx, "web2", "teller", 10, true, func(ls []string) error {
			for _, l := range ls {
				lines <- l
			}
			return nil
		})
	}()
	ask, err := asks.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("the logs request did not reach web2's host: %v", err)
	}
	if !regexp.MustCompile(`^mesh\.node\.web2\.answer\.[A-Za-z0-9]+$`).MatchString(ask.Reply) {
		t.Fatalf("the logs request asks to be answered on %q, not under web2's own subjects", ask.Reply)
	}
	part := func(line string, end bool) []byte {
		b, _ := json.Marshal(protocol.LogsAnswer{Lines: []string{line}, End: end})
		return b
	}
	// As a following host does: each part a request, answered in its inbox.
	if _, err := host2.Request(ask.Reply, part("first", false), 5*time.Second); err != nil {
		t.Fatalf("web2's first part, asked from its own inbox, was not answered: %v", err)
	}

	for _, a := range []struct {
		name     string
		nc       *nats.Conn
		v        violations
		subjects []string
	}{
		{"another host", host1, hv, []string{ask.Reply, "mesh.node.web2.answer.>"}},
		{"a module", teller, tv, []string{ask.Reply, "mesh.node.web2.answer.>", "mesh.node.web1.answer.>"}},
		{"an anonymous connection", anon, av, []string{ask.Reply, "mesh.node.*.answer.>"}},
	} {
		t.Run(a.name+" reads or forges web2's answer", func(t *testing.T) {
			for _, subject := range a.subjects {
				if _, err := a.nc.SubscribeSync(subject); err != nil {
					t.Fatal(err)
				}
				a.nc.Flush()
				a.v.expect(t, "subscription", subject)
			}
			a.nc.Publish(ask.Reply, part("forged by "+a.name, true))
			a.nc.Flush()
			a.v.expect(t, "publish", ask.Reply)
		})
	}
	t.Run("a host answers into another node's subjects or an inbox not its own", func(t *testing.T) {
		for _, subject := range []string{protocol.AnswerSubject("web2", "x1"), "_INBOX.Xq3kP9.1"} {
			host1.Publish(subject, part("forged by web1", true))
			host1.Flush()
			hv.expect(t, "publish", subject)
		}
	})
	t.Run("the controller answers web2's part outside web2's inbox", func(t *testing.T) {
		for _, reply := range hijacks {
			if err := host2.PublishRequest(ask.Reply, reply, part("to "+reply, false)); err != nil {
				t.Fatal(err)
			}
		}
		// The parts are read in order: once this one is answered, so would
		// the ones before have been.
		if _, err := host2.Request(ask.Reply, part("last", false), 5*time.Second); err != nil {
			t.Fatalf("web2's part from its own inbox was not answered: %v", err)
		}
		for i, sub := range hijacked {
			nothingOn(t, sub, "the controller's answer to a part asking it onto "+hijacks[i])
		}
	})

	if err := host2.Publish(ask.Reply, part("end", true)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("following ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("following did not end with web2's last part")
	}
	close(lines)
	var got []string
	for l := range lines {
		got = append(got, l)
	}
	if want := "first to mesh.node.web1.inbox.attack to _INBOX.web1.x.1 to _INBOX.web2x.1 last end"; strings.Join(got, " ") != want {
		t.Fatalf("the lines followed: %q, want %q (web2's own, nothing forged)", got, want)
	}
}

// anonymous connects as a machine with no credentials does, with the join
// inbox a joining host uses.
func (m *testMesh) anonymous(t *testing.T) (*nats.Conn, violations) {
	t.Helper()
	return connectWith(t, m.url, nats.CustomInboxPrefix(protocol.JoinInboxPrefix), nats.NoReconnect())
}

// askJoin asks to join with a token that is not one and returns the
// answer: the join worker takes requests in order, so once it is answered
// every earlier request was handled.
func askJoin(t *testing.T, nc *nats.Conn) protocol.JoinReply {
	t.Helper()
	req, _ := json.Marshal(protocol.JoinRequest{Token: "meshjoin_nope", Node: "web9"})
	return askJoinWith(t, nc, req)
}

// askJoinWith asks to join with req and returns the answer.
func askJoinWith(t *testing.T, nc *nats.Conn, req []byte) protocol.JoinReply {
	t.Helper()
	msg, err := nc.Request(protocol.JoinSubject, req, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var reply protocol.JoinReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		t.Fatal(err)
	}
	return reply
}

// selfCheck runs the self-check now and says whether key is open.
func (m *testMesh) openAfterCheck(t *testing.T, key string) bool {
	t.Helper()
	if _, err := m.c.SelfCheck(context.Background(), app.CheckOptions{}); err != nil {
		t.Fatal(err)
	}
	return m.open(t, key)
}

// Item 6: the reply subject of a request is the asker's word. The
// controller's answer, sent with its own mesh.> permission, went wherever
// it said: a join answer onto a node's heartbeat raised an urgent
// node.bad-signature, onto a host's declaration inbox made the host refuse
// and report a failed apply, and a host asking for its own declaration
// with another node's inbox as reply raised node.apply-failed on that node.
func TestAttack_RepliesSteerTheControllersAnswers(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	web1, web2 := m.join("web1"), m.join("web2")
	checkFor(t, settle, m.heard("web2"))
	m.declare("web1", moduleBody("one", "/srv/one"))
	checkFor(t, settle, m.applied("web1", 1))
	ctl := m.controllerConn(t)
	// Only the attacker's messages arrive on web2's subjects from now.
	web2.stop()
	watch := func(subject string) *nats.Subscription {
		sub, err := ctl.SubscribeSync(subject)
		if err != nil {
			t.Fatal(err)
		}
		ctl.Flush()
		return sub
	}
	failedApply := func(node string) bool {
		n := m.node(node)
		return n.LastApply != nil && !n.LastApply.OK
	}

	t.Run("a join answer onto a node's heartbeat", func(t *testing.T) {
		heartbeats := watch("mesh.node.web2.heartbeat")
		nc, _ := m.anonymous(t)
		req, _ := json.Marshal(protocol.JoinRequest{Token: "meshjoin_nope", Node: "web2"})
		if err := nc.PublishRequest(protocol.JoinSubject, "mesh.node.web2.heartbeat", req); err != nil {
			t.Fatal(err)
		}
		askJoin(t, nc)
		// A join answer says "ok"; a beat web2 sent as it stopped may still
		// arrive, and is web2's own.
		nothingOn(t, heartbeats, "the join answer", `"ok":`)
		if d := m.node("web2").Dropped; len(d) != 0 {
			t.Fatalf("messages claiming to be web2's were dropped: %+v", d)
		}
		if m.openAfterCheck(t, "node.bad-signature/web2") {
			t.Fatal("node.bad-signature/web2 was raised")
		}
	})
	t.Run("a join answer onto a host's declaration inbox", func(t *testing.T) {
		web2.start()
		defer web2.stop()
		declarations := watch("mesh.node.web2.inbox.>")
		nc, _ := m.anonymous(t)
		req, _ := json.Marshal(protocol.JoinRequest{Token: "meshjoin_nope", Node: "web2"})
		nc.PublishRequest(protocol.JoinSubject, protocol.DeclarationInbox("web2"), req)
		askJoin(t, nc)
		nothingOn(t, declarations, "the join answer")
		if failedApply("web2") {
			t.Fatalf("web2 reported a failed apply: %+v", m.node("web2").LastApply)
		}
	})
	t.Run("a host's own declaration onto another node's inboxes", func(t *testing.T) {
		declarations, inbox, alerts := watch("mesh.node.web2.inbox.>"), watch("_INBOX.web2.>"), watch(app.AlertSubject)
		nc := connectAs(t, m.url, web1.state)
		ask, err := protocol.Sign(web1.state.HostKey, protocol.DeclarationAskBody{})
		if err != nil {
			t.Fatal(err)
		}
		for _, reply := range []string{protocol.DeclarationInbox("web2"), "_INBOX.web2.x.1", "mesh.alert"} {
			if err := nc.PublishRequest(protocol.NodeSubject("web1", protocol.DeclarationAsk), reply, ask); err != nil {
				t.Fatal(err)
			}
		}
		nc.Flush()
		nothingOn(t, declarations, "web1's declaration")
		nothingOn(t, inbox, "web1's declaration")
		nothingOn(t, alerts, "web1's declaration", "serial")
		checkFor(t, settle, m.droppedFor("web1", "answer outside its inbox", 3))
		if failedApply("web2") || m.openAfterCheck(t, "node.apply-failed/web2") {
			t.Fatal("web2 failed to apply web1's declaration")
		}
	})
}

// joinRequest is a well-formed join request, with keys of its own.
func joinRequest(t *testing.T, token, node string) []byte {
	t.Helper()
	pub, _, err := newEd25519()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := age.GenerateX25519Identity()
	nk, _ := nkeys.CreateUser()
	nkPub, _ := nk.PublicKey()
	b, _ := json.Marshal(protocol.JoinRequest{Token: token, Node: node, HostKey: base64.StdEncoding.EncodeToString(pub),
		AgeRecipient: id.Recipient().String(), NKey: nkPub, HostVersion: "attacker"})
	return b
}

// Item 10: join answers were readable by any connection without
// credentials subscribed to the join inbox (they held the host's JWT); an
// unknown node and an unknown token had different answers (names could be
// probed); 300 wrong tokens in 10 s raised nothing; and a node could be
// named join, sharing the join inbox.
func TestAttack_JoinAnswersAndRefusals(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	ctx := context.Background()

	t.Run("another anonymous connection reads a join answer", func(t *testing.T) {
		eavesdropper, _ := m.anonymous(t)
		overheard, err := eavesdropper.SubscribeSync(protocol.JoinInboxPrefix + ".>")
		if err != nil {
			t.Fatal(err)
		}
		eavesdropper.Flush()
		m.join("web1")
		msg, err := overheard.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("nothing overheard (%v): the answers are no longer shared, the test should say how it knows", err)
		}
		var reply struct {
			protocol.JoinReply
			Creds string `json:"creds"`
		}
		if err := json.Unmarshal(msg.Data, &reply); err != nil {
			t.Fatal(err)
		}
		// Nothing but ok, the sealed grant and the protocol the controller
		// speaks: no JWT (eyJ…) outside the age armor, whose base64 may
		// hold those letters by chance.
		var fields map[string]any
		json.Unmarshal(msg.Data, &fields)
		if fields["protocol"] != protocol.Version {
			t.Errorf("the join answer says protocol %v, want %s", fields["protocol"], protocol.Version)
		}
		delete(fields, "ok")
		delete(fields, "sealed")
		delete(fields, "protocol")
		armor, _ := json.Marshal(reply.Sealed)
		outside := strings.Replace(string(msg.Data), string(armor), `""`, 1)
		if !reply.OK || reply.Creds != "" || len(fields) > 0 || !strings.HasPrefix(reply.Sealed, "-----BEGIN AGE ENCRYPTED FILE-----") ||
			outside == string(msg.Data) || strings.Contains(outside, "eyJ") {
			t.Fatalf("the overheard answer holds the grant in clear: %s", msg.Data)
		}
		mine, _ := age.GenerateX25519Identity()
		if _, err := protocol.OpenJoinGrant(reply.Sealed, mine, "web1"); err == nil {
			t.Fatal("the eavesdropper opened the grant")
		}
	})

	t.Run("every refusal is answered alike", func(t *testing.T) {
		tok := func(node string, ttl time.Duration) string {
			t.Helper()
			it, err := m.c.TokenIssue(ctx, app.TokenRequest{Node: node, New: true, TTL: ttl})
			if err != nil {
				t.Fatal(err)
			}
			return it.Token
		}
		other := tok("web2", time.Hour)
		expired := tok("web3", time.Millisecond)
		replaced := tok("web4", time.Hour)
		if _, err := m.c.TokenIssue(ctx, app.TokenRequest{Node: "web4", TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
		used := tok("web5", time.Hour)
		if _, err := host.Join(ctx, host.JoinOptions{Broker: m.url, Token: used, Node: "web5", State: filepath.Join(t.TempDir(), "s")}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
		valid := func(token, node string) []byte { return joinRequest(t, token, node) }
		nc, _ := m.anonymous(t)
		var first []byte
		for what, req := range map[string][]byte{
			"an unknown token for a node that exists":   valid("meshjoin_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "web2"),
			"an unknown token for a node that does not": valid("meshjoin_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "web9"),
			"a token of another node":                   valid(other, "web9"),
			"an expired token":                          valid(expired, "web3"),
			"a replaced token":                          valid(replaced, "web4"),
			"a used token":                              valid(used, "web5"),
			"a reserved name":                           valid(other, "join"),
			"not JSON":                                  []byte("{"),
		} {
			msg, err := nc.Request(protocol.JoinSubject, req, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if first == nil {
				first = msg.Data
			}
			if string(msg.Data) != string(first) {
				t.Errorf("%s is answered %s, another refusal %s", what, msg.Data, first)
			}
		}
		var reply protocol.JoinReply
		if json.Unmarshal(first, &reply); reply.OK || reply.Error != protocol.JoinRefused {
			t.Fatalf("the refusal: %s", first)
		}
		for _, reason := range []string{"unknown token", "token of another node", "expired token", "replaced token", "used token", "bad node name", "malformed request"} {
			if !strings.Contains(m.logs.String(), ` err="`+reason+`: `) {
				t.Errorf("the log does not keep the reason %q", reason)
			}
		}
	})

	t.Run("a join asked again is answered again, and only for the same keys", func(t *testing.T) {
		it, err := m.c.TokenIssue(ctx, app.TokenRequest{Node: "web6", New: true, TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		nc, _ := m.anonymous(t)
		// As a host whose first answer did not reach it asks again.
		req := joinRequest(t, it.Token, "web6")
		for i := range 2 {
			if reply := askJoinWith(t, nc, req); !reply.OK {
				t.Fatalf("ask %d: %+v", i+1, reply)
			}
		}
		if !strings.Contains(m.logs.String(), "answered again") {
			t.Errorf("the log does not say the join was answered again:\n%s", m.logs.String())
		}
		if reply := askJoinWith(t, nc, joinRequest(t, it.Token, "web6")); reply.OK || reply.Error != protocol.JoinRefused {
			t.Fatalf("the used token with other keys: %+v", reply)
		}
	})

	t.Run("300 wrong tokens in 10 s raise join.refused, with the count and the source", func(t *testing.T) {
		nc, _ := m.anonymous(t)
		start := time.Now()
		for i := range 300 {
			msg := nats.NewMsg(protocol.JoinSubject)
			msg.Data = joinRequest(t, fmt.Sprintf("meshjoin_%032d", i), "web2")
			// Whoever asks cannot choose the source the controller sees.
			msg.Header.Set("Nats-Request-Info", `{"host":"192.0.2.66"}`)
			msg.Header["nats-request-info"] = []string{`{"host":"192.0.2.67"}`}
			if _, err := nc.RequestMsg(msg, 10*time.Second); err != nil {
				t.Fatal(err)
			}
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Fatalf("the rule's premise does not hold: 300 refusals took %s, past its 10 s window", took)
		}
		var c *health.Condition
		checkFor(t, settle, func() error {
			c = nil
			if !m.openAfterCheck(t, "join.refused/127.0.0.1") {
				return fmt.Errorf("join.refused/127.0.0.1 is not open after a self-check")
			}
			cs, _ := m.c.Conditions(ctx, app.ConditionFilter{})
			for i := range cs {
				if cs[i].Key == "join.refused/127.0.0.1" {
					c = &cs[i]
				}
			}
			if c == nil {
				return fmt.Errorf("join.refused/127.0.0.1 closed again")
			}
			if n, _ := c.Evidence["count"].(float64); n < 300 {
				return fmt.Errorf("join.refused/127.0.0.1 counts %v refusals, not 300: %+v", c.Evidence["count"], c)
			}
			return nil
		})
		if c.Evidence["source"] != "127.0.0.1" || c.Severity != "warning" || !strings.Contains(c.Summary, "unknown token") {
			t.Fatalf("join.refused: %+v", c)
		}
		for _, forged := range []string{"192.0.2.66", "192.0.2.67"} {
			if m.open(t, "join.refused/"+forged) {
				t.Fatalf("the asker chose its source %s", forged)
			}
		}
	})

	t.Run("a node cannot be named join", func(t *testing.T) {
		if _, err := m.c.NodeAdd(ctx, "join", false); !errors.Is(err, app.ErrReservedName) {
			t.Fatalf("node add join: %v", err)
		}
		if _, err := m.c.TokenIssue(ctx, app.TokenRequest{Node: "join", New: true, TTL: time.Hour}); !errors.Is(err, app.ErrReservedName) {
			t.Fatalf("token issue --new join: %v", err)
		}
	})
}

// Item 9: after a machine re-joined a node with a new token, the old
// machine's broker user still connected and still received the node's
// next declaration.
func TestAttack_RejoinedNodesOldCredentials(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	ctx := context.Background()
	joinAs := func(node string, fresh bool) *host.State {
		t.Helper()
		tok, err := m.c.TokenIssue(ctx, app.TokenRequest{Node: node, New: fresh, TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		st, err := host.Join(ctx, host.JoinOptions{Broker: m.url, Token: tok.Token, Node: node, State: filepath.Join(t.TempDir(), "state")})
		if err != nil {
			t.Fatalf("%v\n%s", err, m.logs.String())
		}
		return st
	}
	old := joinAs("web1", true)
	other := joinAs("web2", true)
	opts, _ := old.ConnectOptions()
	oldNC, _ := connectWith(t, m.url, append(opts, nats.NoReconnect())...)
	otherNC := connectAs(t, m.url, other)
	heard, err := oldNC.SubscribeSync(protocol.DeclarationInbox("web1"))
	if err != nil {
		t.Fatal(err)
	}
	oldNC.Flush()

	// The machine is replaced: a new token for the node, a new machine.
	replacement := joinAs("web1", false)
	checkFor(t, settle, connClosed(oldNC, "the old machine's connection"))
	m.declare("web1", moduleBody("one", "/srv/one"))
	if msg, err := heard.NextMsg(500 * time.Millisecond); err == nil {
		t.Fatalf("the old machine received web1's declaration: %.60q…", msg.Data)
	}
	if nc, err := nats.Connect(m.url, append(opts, nats.NoReconnect())...); err == nil {
		nc.Close()
		t.Fatal("the old machine's user connected again")
	}
	// The new machine is web1 now, and the other node was not touched.
	nc := connectAs(t, m.url, replacement)
	if _, err := nc.SubscribeSync(protocol.DeclarationInbox("web1")); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if !otherNC.IsConnected() {
		t.Fatal("web2's connection was closed")
	}
	if !m.logs.logged("re-joined: its earlier host users revoked (1): revoked users disconnected", "node", "web1") {
		t.Fatalf("the log does not say so:\n%s", m.logs.String())
	}
	// and it stays so across a restart of the controller
	m.stop()
	m.start()
	if nc, err := nats.Connect(m.url, append(opts, nats.NoReconnect())...); err == nil {
		nc.Close()
		t.Fatal("the old machine's user connected after a restart")
	}
}

// rawJoin publishes one mesh.join of size bytes as a client that does not
// heed the broker's limit would (the stock nats CLI and nats.go learn it
// from the server and refuse by themselves), and returns what the server
// answered.
func rawJoin(t *testing.T, url string, size int) string {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "nats://"))
	if err != nil {
		t.Error(err)
		return ""
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	r.ReadString('\n') // INFO
	fmt.Fprintf(conn, "CONNECT {\"verbose\":false,\"pedantic\":false,\"protocol\":1}\r\nPUB %s _INBOX.join.x.1 %d\r\n", protocol.JoinSubject, size)
	go func() {
		conn.Write(make([]byte, size))
		conn.Write([]byte("\r\nPING\r\n"))
	}()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	var got strings.Builder
	for {
		line, err := r.ReadString('\n')
		got.WriteString(line)
		if err != nil || strings.HasPrefix(line, "-ERR") || strings.HasPrefix(line, "PONG") {
			return got.String()
		}
	}
}

// heapInUse is the test process's live heap after a collection: the
// controller and its broker run in it.
func heapInUse() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}

// Item 8: 40 join messages of 7 MB from connections without credentials
// took the controller from 31 to 395 MiB, closed its own broker connection
// (controller.broker) and made healthy nodes look silent.
func TestAttack_AnonymousFlood(t *testing.T) {
	m := newTestMesh(t)
	m.join("web1")
	checkFor(t, settle, m.beatsAbove(0))
	controllerConnLost := func() bool {
		// The daemon's own connection to the mesh account logs as
		// connection=mesh-controller; the join connection as "… joins".
		return strings.Contains(m.logs.String(), " connection=mesh-controller ")
	}

	t.Run("40 messages of 7 MB", func(t *testing.T) {
		before := heapInUse()
		var wg sync.WaitGroup
		answers := make(chan string, 40)
		for range 40 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				answers <- rawJoin(t, m.url, 7<<20)
			}()
		}
		wg.Wait()
		close(answers)
		for a := range answers {
			if !strings.Contains(a, "Maximum Payload Violation") {
				t.Fatalf("the broker took a 7 MB join: %q", a)
			}
		}
		after := heapInUse()
		t.Logf("heap in use: %d MiB before, %d MiB after", before>>20, after>>20)
		if after-before > 32<<20 {
			t.Fatalf("the flood grew the heap from %d to %d MiB", before>>20, after>>20)
		}
	})

	t.Run("a flood of small joins does not starve heartbeats", func(t *testing.T) {
		req := joinRequest(t, "meshjoin_notatokennotatokennotatoken00", "web1")
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range 4 {
			nc, _ := m.anonymous(t)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					for range 100 {
						nc.PublishRequest(protocol.JoinSubject, "_INBOX.join.flood.1", req)
					}
					nc.Flush()
				}
			}()
		}
		// Beats go on being absorbed, every second of the flood.
		for range 4 {
			beats := m.count.Beats.Load()
			time.Sleep(time.Second)
			if m.count.Beats.Load() == beats {
				close(stop)
				t.Fatal("no heartbeat was absorbed for a second of the flood")
			}
		}
		close(stop)
		wg.Wait()
		if controllerConnLost() {
			t.Fatalf("the controller's own broker connection failed:\n%s", m.logs.String())
		}
		// and a host still joins
		m.join("web2")
	})
	if m.openAfterCheck(t, "node.silent/web1") || m.open(t, "controller.broker") {
		t.Fatal("a healthy node looks silent, or the broker unreachable")
	}
}
