package app

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
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

// nothingOn fails if a message arrives on sub within a moment.
func nothingOn(t *testing.T, sub *nats.Subscription, what string) {
	t.Helper()
	if msg, err := sub.NextMsg(500 * time.Millisecond); err == nil {
		t.Fatalf("%s: %q arrived on %s", what, msg.Data, msg.Subject)
	}
}

// Item 7: two modules relayed through each other. One emits an event with
// a reply subject of its choosing; the other, which consumes it, answers as
// a module does; with a NATS response permission the answer went wherever
// the first had said, mesh.alert or a host's declaration inbox included.
func TestAttack_ModulesRelayThroughEachOther(t *testing.T) {
	m := newTestMesh(t)
	m.join("web1")
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
	alerts, _ := ctl.SubscribeSync(AlertSubject)
	declarations, _ := ctl.SubscribeSync("mesh.node.web1.inbox.>")
	ctl.Flush()

	for _, target := range []struct {
		reply string
		sub   *nats.Subscription
	}{{AlertSubject, alerts}, {"mesh.node.web1.inbox.declaration", declarations}, {"_INBOX.web1.x.1", nil}} {
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
}
