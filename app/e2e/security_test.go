package e2e

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"mesh-controller/app/daemon"
	"mesh-controller/app/host"
	"mesh-controller/app/protocol"
)

func newEd25519() (ed25519.PublicKey, ed25519.PrivateKey, error) {
	return ed25519.GenerateKey(rand.Reader)
}

// violations collects the broker's asynchronous permission errors.
type violations chan string

func connectWith(t *testing.T, url string, opts ...nats.Option) (*nats.Conn, violations) {
	t.Helper()
	v := make(violations, 16)
	opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { v <- err.Error() }))
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc, v
}

func connectAs(t *testing.T, url string, st *host.State) *nats.Conn {
	t.Helper()
	opts, err := st.ConnectOptions()
	if err != nil {
		t.Fatal(err)
	}
	nc, _ := connectWith(t, url, opts...)
	return nc
}

func publishSigned(nc *nats.Conn, st *host.State, what string) error {
	b, err := protocol.Sign(st.HostKey, protocol.HeartbeatBody{At: time.Now(), IntervalS: 1})
	if err != nil {
		return err
	}
	if err := nc.Publish(protocol.NodeSubject(st.Node, what), b); err != nil {
		return err
	}
	return nc.Flush()
}

// expectViolation waits for the broker to refuse an act, asserted against the live broker.
func (v violations) expect(t *testing.T, what, subject string) {
	t.Helper()
	select {
	case e := <-v:
		if !strings.Contains(strings.ToLower(e), "permissions violation for "+what) || !strings.Contains(e, subject) {
			t.Fatalf("want a %s violation on %s, got %q", what, subject, e)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("the broker allowed %s on %s", what, subject)
	}
}

func TestMesh_BrokerPermissions(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	web1, web2 := m.join("web1"), m.join("web2")
	web1.stop()
	opts, err := web1.state.ConnectOptions()
	if err != nil {
		t.Fatal(err)
	}
	nc, v := connectWith(t, m.url, opts...)

	t.Run("a host cannot read another node's declaration", func(t *testing.T) {
		for _, subject := range []string{"mesh.node.web2.inbox.>", "mesh.node.web2.inbox.declaration", "_INBOX.web2.>", "_INBOX.>", "mesh.>"} {
			if _, err := nc.SubscribeSync(subject); err != nil {
				t.Fatal(err)
			}
			nc.Flush()
			v.expect(t, "subscription", subject)
		}
		// and asking for it as web2 is a publish it may not make
		nc.Publish("mesh.node.web2.declaration", []byte("{}"))
		nc.Flush()
		v.expect(t, "publish", "mesh.node.web2.declaration")
	})
	t.Run("a host cannot publish on another node's subjects", func(t *testing.T) {
		for _, subject := range []string{"mesh.node.web2.heartbeat", "mesh.node.web2.applied", "mesh.node.web2.inbox.declaration", "mesh.join.x", "mesh.alert",
			"_INBOX.web2.x.1", "_INBOX.join.x.1"} {
			nc.Publish(subject, []byte("{}"))
			nc.Flush()
			v.expect(t, "publish", subject)
		}
	})
	t.Run("a host answers in no one's inbox", func(t *testing.T) {
		// nats.go's own request inboxes (_INBOX.<id>.<n>), a module's or a
		// person's command's: a host answers under its own subjects
		// (protocol.AnswerSubject) instead.
		for _, subject := range []string{"_INBOX.askersinbox.1", "_INBOX.askersinbox.logs", "_INBOX.x"} {
			nc.Publish(subject, []byte("{}"))
			nc.Flush()
			v.expect(t, "publish", subject)
		}
	})
	t.Run("a host may answer under its own subjects", func(t *testing.T) {
		nc.Publish(protocol.AnswerSubject("web1", "x1"), []byte("{}"))
		nc.Flush()
		select {
		case e := <-v:
			t.Fatalf("unexpected violation: %s", e)
		case <-time.After(300 * time.Millisecond):
		}
	})
	t.Run("a host may use its own subjects", func(t *testing.T) {
		sub, err := nc.SubscribeSync("mesh.node.web1.inbox.declaration")
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil { // the broker has the subscription before anything is sent
			t.Fatal(err)
		}
		m.declare("web1", `{"modules": []}`)
		if _, err := sub.NextMsg(5 * time.Second); err != nil {
			t.Fatalf("web1 did not receive its own declaration: %v", err)
		}
		select {
		case e := <-v:
			t.Fatalf("unexpected violation: %s", e)
		default:
		}
	})
	t.Run("the join user can do nothing but join", func(t *testing.T) {
		jc, jv := connectWith(t, m.url, nats.CustomInboxPrefix(protocol.JoinInboxPrefix))
		for _, subject := range []string{"mesh.node.web1.heartbeat", "mesh.node.web2.declaration", "mesh.alert", "_INBOX.web2.x"} {
			jc.Publish(subject, []byte("{}"))
			jc.Flush()
			jv.expect(t, "publish", subject)
		}
		for _, subject := range []string{"mesh.>", "mesh.node.web2.inbox.>", "_INBOX.web2.>", "_INBOX.>"} {
			jc.SubscribeSync(subject)
			jc.Flush()
			jv.expect(t, "subscription", subject)
		}
		// asking to join is allowed, and answered
		req, _ := json.Marshal(protocol.JoinRequest{Token: "meshjoin_nope", Node: "web9"})
		msg, err := jc.Request(protocol.JoinSubject, req, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var reply protocol.JoinReply
		json.Unmarshal(msg.Data, &reply)
		if reply.OK || reply.Error == "" {
			t.Fatalf("join answer: %+v", reply)
		}
	})
	_ = web2
}

// A host applies only what its controller signed, and only newer serials.
func TestMesh_HostRefusesForgedAndReplayed(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	m.join("web1")
	ctx := context.Background()
	st, err := m.c.Stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	latest := func() protocol.Envelope {
		d, err := st.Inventory.LatestDeclaration(ctx, "web1")
		if err != nil {
			t.Fatal(err)
		}
		return daemon.EnvelopeOf(*d)
	}
	m.declare("web1", moduleBody("one", "/srv/one"))
	env1 := latest()
	m.declare("web1", moduleBody("two", "/srv/two"))
	env2 := latest()
	checkFor(t, settle, m.applied("web1", 2))

	nc, err := m.c.DialBroker(ctx, st.Identity)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	lastError := func() string {
		n := m.node("web1")
		if n.LastApply == nil || n.LastApply.OK {
			return ""
		}
		return n.LastApply.Error
	}
	refusedWith := func(why string) func() error {
		return func() error {
			if e := lastError(); !strings.Contains(e, why) {
				return fmt.Errorf("web1 has not reported a refusal saying %q; its last error: %q", why, e)
			}
			return nil
		}
	}

	t.Run("signed by another key", func(t *testing.T) {
		_, other, _ := newEd25519()
		env, err := protocol.SealBody(map[string]any{"node": "web1", "serial": 99, "issued_at": time.Now(), "modules": []any{}},
			func(b []byte) []byte { return ed25519.Sign(other, b) }, "forger")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(env)
		nc.Publish(protocol.DeclarationInbox("web1"), b)
		checkFor(t, settle, refusedWith("signature does not verify"))
		if m.node("web1").SerialApplied != 2 {
			t.Fatal("a forged declaration moved the applied serial")
		}
	})
	t.Run("a replayed serial", func(t *testing.T) {
		// The genuine declaration 2 again, exactly as signed, is the one
		// applied (a healer re-sends it so): nothing to do, not reported;
		// the genuine declaration 1, older, is refused and reported. The
		// host takes them in order, so once 1's refusal is heard, 2's
		// would have been.
		for _, env := range []protocol.Envelope{env2, env1} {
			b, _ := json.Marshal(env)
			nc.Publish(protocol.DeclarationInbox("web1"), b)
		}
		checkFor(t, settle, refusedWith("serial 1 is not above the last applied 2"))
		if m.logs.logged("declaration refused or failed", "node", "web1", "serial", 2) {
			t.Fatalf("the applied declaration again was reported as refused:\n%s", m.logs.String())
		}
		if m.node("web1").SerialApplied != 2 {
			t.Fatal("a replay moved the applied serial")
		}
	})
	t.Run("a genuine newer one still applies", func(t *testing.T) {
		m.declare("web1", moduleBody("three", "/srv/three"))
		checkFor(t, settle, allOf(m.applied("web1", 3), func() error {
			if e := lastError(); e != "" {
				return fmt.Errorf("web1's last apply failed: %s", e)
			}
			return nil
		}))
	})
}
