package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mesh-controller/app"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

func (m *testMesh) addModule(file string) {
	m.t.Helper()
	if _, err := m.c.ModuleAdd(context.Background(), file, ""); err != nil {
		m.t.Fatal(err)
	}
}

func example(name string) string {
	return filepath.Join("..", "..", "contexts", "inventory", "testdata", name+".json")
}

func writeManifest(t testing.TB, body string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "mesh.json")
	if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// The examples checked, added, assigned judged together, pushed and applied by hosts.
func TestMesh_AssignPushApply(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	web1, db1 := m.join("web1"), m.join("db1")
	for _, n := range []string{"paperless", "postgres", "smtp-relay"} {
		m.addModule(example(n))
	}
	ctx := context.Background()
	if _, err := m.c.Assign(ctx, "web1", []string{"paperless"}); err == nil {
		t.Fatal("paperless assigned with no postgres in the mesh")
	}
	r, err := m.c.Assign(ctx, "db1", []string{"postgres", "smtp-relay"})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Pushed) != 1 || !r.Pushed[0].Sent {
		t.Fatalf("pushed: %+v", r.Pushed)
	}
	r, err = m.c.Assign(ctx, "web1", []string{"paperless"})
	if err != nil {
		t.Fatal(err)
	}
	// db1's plan names its new consumer, so it is sent too.
	if len(r.Pushed) != 2 {
		t.Fatalf("pushed: %+v", r.Pushed)
	}
	checkFor(t, settle, allOf(m.upToDate("web1"), m.notBehind("db1")))
	b, err := os.ReadFile(filepath.Join(web1.root, "etc/mesh/modules/paperless/settings.json"))
	if err != nil || !strings.Contains(string(b), `"workers": 2`) {
		t.Fatalf("settings.json: %s, %v", b, err)
	}
	var part map[string]any
	b, _ = os.ReadFile(filepath.Join(web1.root, "etc/mesh/modules/paperless/module.json"))
	json.Unmarshal(b, &part)
	if bs, _ := json.Marshal(part["bindings"]); !strings.Contains(string(bs), `db1/postgres`) {
		t.Fatalf("paperless's bindings: %s", bs)
	}
	if _, err := os.Stat(filepath.Join(db1.root, "var/lib/postgres/data")); err != nil {
		t.Fatal(err)
	}

	// Settings change: the node is sent and applies the new result.
	if _, err := m.c.SettingsSet(ctx, app.SettingsRequest{Module: "paperless", Node: "web1", Body: []byte(`{"workers": 6}`), From: "x"}); err != nil {
		t.Fatal(err)
	}
	checkFor(t, settle, func() error {
		if b, err := os.ReadFile(filepath.Join(web1.root, "etc/mesh/modules/paperless/settings.json")); !strings.Contains(string(b), `"workers": 6`) {
			return fmt.Errorf("web1 has not applied its new settings: %s %v", b, err)
		}
		return nil
	})
	checkFor(t, settle, m.notBehind("web1"))

	// push --behind sends nothing when nobody is behind.
	pushed, err := m.c.Push(ctx, app.PushRequest{Behind: true})
	if err != nil || len(pushed) != 0 {
		t.Fatalf("push --behind: %+v, %v", pushed, err)
	}
}

// A change recorded while no controller serves is sent when serve starts.
func TestMesh_ServeCatchesUp(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	web1 := m.join("web1")
	m.addModule(example("postgres"))
	checkFor(t, settle, m.heard("web1"))
	m.stop()
	r, err := m.c.Assign(context.Background(), "web1", []string{"postgres"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Pushed[0].Sent || !strings.Contains(r.Pushed[0].NotSent, "no controller is serving") {
		t.Fatalf("pushed while down: %+v", r.Pushed)
	}
	m.start()
	checkFor(t, settle, func() error {
		if _, err := os.Stat(filepath.Join(web1.root, "etc/mesh/modules/postgres/module.json")); err != nil {
			return fmt.Errorf("web1 has not applied what was assigned while the controller was down: %w", err)
		}
		return m.notBehind("web1")()
	})
}

// A roll-out sends one node at a time: the second is not sent the new
// version before the first reports it applied; a failing node stops it.
func TestMesh_RollOut(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	hosts := []*testHost{m.join("db1"), m.join("db2"), m.join("db3")}
	ctx := context.Background()
	v1 := writeManifest(t, `{"module": "store", "version": "1.0.0", "data": [{"name": "d", "path": "/srv/store", "precious": "costly"}]}`)
	v2 := writeManifest(t, `{"module": "store", "version": "2.0.0", "data": [{"name": "d", "path": "/srv/store", "precious": "costly"}, {"name": "e", "path": "/srv/extra/e", "precious": "rebuildable"}]}`)
	m.addModule(v1)
	for _, h := range hosts {
		if _, err := m.c.Assign(ctx, h.name, []string{"store"}); err != nil {
			t.Fatal(err)
		}
	}
	checkFor(t, settle, allOf(m.upToDate("db1"), m.upToDate("db2"), m.upToDate("db3")))
	m.addModule(v2)

	// Watch the order: while db1 has not applied its new declaration, db2 must not have been sent one.
	before := map[string]int64{}
	for _, h := range hosts {
		before[h.name] = m.node(h.name).SerialDeclared
	}
	var violated atomic.Value
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-time.After(5 * time.Millisecond):
			case <-ctx.Done():
				return
			}
			db1, db2 := m.node("db1"), m.node("db2")
			if db2.SerialDeclared > before["db2"] && db1.SerialApplied <= before["db1"] {
				violated.Store("db2 was sent the new version before db1 applied it")
			}
			if db2.SerialApplied > before["db2"] {
				return
			}
		}
	}()
	// db3 cannot apply: a file stands where its new data directory must go.
	if err := os.WriteFile(filepath.Join(hosts[2].root, "srv", "extra"), []byte("in the way"), 0o600); err != nil {
		t.Fatal(err)
	}
	var progress []string
	v, err := m.c.Upgrade(ctx, app.UpgradeRequest{Module: "store", Action: "roll-out", Wait: 10 * time.Second,
		Progress: func(s string) { progress = append(progress, s) }})
	<-done
	if msg := violated.Load(); msg != nil {
		t.Fatal(msg)
	}
	// It stops at db3, and every node it moved goes back.
	if !errors.Is(err, app.ErrRollOutRolledBack) || !strings.Contains(err.Error(), "db3: declaration") || v.Stopped != "db3" {
		t.Fatalf("roll-out: %v, %+v", err, v)
	}
	if !v.Steps[0].Applied || !v.Steps[1].Applied || v.Steps[2].Applied || v.Steps[2].Error == "" {
		t.Fatalf("steps: %+v", v.Steps)
	}
	want := []string{"db1 sent", "db1 applied", "db2 sent", "db2 applied", "db3 sent"}
	progress = slices.DeleteFunc(progress, func(s string) bool { return !regexp.MustCompile(`^db[0-9] (sent|applied) `).MatchString(s) })
	if len(progress) != len(want) {
		t.Fatalf("progress: %q", progress)
	}
	for i, w := range want {
		if !strings.HasPrefix(progress[i], w) {
			t.Fatalf("progress[%d] = %q, want %q…", i, progress[i], w)
		}
	}
}

// A roll-out that stops leaves the nodes after it on the old version.
func TestMesh_RollOutStopsAtFirstFailure(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	hosts := []*testHost{m.join("db1"), m.join("db2")}
	ctx := context.Background()
	m.addModule(writeManifest(t, `{"module": "store", "version": "1.0.0"}`))
	for _, h := range hosts {
		if _, err := m.c.Assign(ctx, h.name, []string{"store"}); err != nil {
			t.Fatal(err)
		}
	}
	checkFor(t, settle, allOf(m.notBehind("db1"), m.notBehind("db2")))
	m.addModule(writeManifest(t, `{"module": "store", "version": "2.0.0", "data": [{"name": "d", "path": "/srv/new", "precious": "costly"}]}`))
	os.WriteFile(filepath.Join(hosts[0].root, "srv"), []byte("in the way"), 0o600)
	declared := m.node("db2").SerialDeclared
	_, err := m.c.Upgrade(ctx, app.UpgradeRequest{Module: "store", Action: "roll-out", Wait: 10 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "stopped and was rolled back: 1 node failed, past --max-failures 0: db1: ") {
		t.Fatalf("roll-out: %v", err)
	}
	if m.node("db2").SerialDeclared != declared {
		t.Fatal("db2 was sent the new version after db1 failed")
	}
	snapVersion := func(node string) string {
		st, _ := m.c.Stores(ctx)
		snap, _ := st.Inventory.Snapshot(ctx)
		return snap.VersionOn(node, "store")
	}
	if v := snapVersion("db2"); v != "1.0.0" {
		t.Fatalf("db2 plans %s", v)
	}
}

// A module's broker user may publish what it emits and nothing else.
func TestMesh_ModuleIssue(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	m.join("web1")
	ctx := context.Background()
	for _, n := range []string{"paperless", "postgres"} {
		m.addModule(example(n))
	}
	if _, err := m.c.ModuleIssue(ctx, "paperless", "web1"); err == nil {
		t.Fatal("issued for a module not on the node")
	}
	if _, err := m.c.Assign(ctx, "web1", []string{"paperless", "postgres"}); err != nil {
		t.Fatal(err)
	}
	creds, err := m.c.ModuleIssue(ctx, "paperless", "web1")
	if err != nil {
		t.Fatal(err)
	}
	credsFile := filepath.Join(t.TempDir(), "paperless.creds")
	os.WriteFile(credsFile, []byte(creds), 0o600)
	nc, v := connectWith(t, m.url, nats.UserCredentials(credsFile), nats.NoReconnect())

	// It may publish what it emits…
	if err := nc.Publish("mesh.module.documents.added", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	select {
	case e := <-v:
		t.Fatalf("publishing an emitted subject was refused: %s", e)
	case <-time.After(300 * time.Millisecond):
	}
	// …and subscribe to what it consumes, and nothing else.
	if _, err := nc.SubscribeSync("mesh.module.mail.received"); err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	for _, subject := range []string{"mesh.module.mail.received", "mesh.module.documents.removed", "mesh.node.web1.heartbeat", "mesh.join", "mesh.alert"} {
		nc.Publish(subject, []byte("{}"))
		nc.Flush()
		v.expect(t, "publish", subject)
	}
	nc.SubscribeSync("mesh.node.web1.inbox.>")
	nc.Flush()
	v.expect(t, "subscription", "mesh.node.web1.inbox.>")

	// Unassigning the module from its node revokes the user issued for it
	// there and closes its connection; one for another node stays.
	m.join("web2")
	if _, err := m.c.Assign(ctx, "web2", []string{"paperless"}); err != nil {
		t.Fatal(err)
	}
	other, err := m.c.ModuleIssue(ctx, "paperless", "web2")
	if err != nil {
		t.Fatal(err)
	}
	otherFile := filepath.Join(t.TempDir(), "paperless-web2.creds")
	os.WriteFile(otherFile, []byte(other), 0o600)
	nc2, _ := connectWith(t, m.url, nats.UserCredentials(otherFile), nats.NoReconnect())
	if _, err := m.c.Unassign(ctx, "web1", []string{"paperless"}); err != nil {
		t.Fatal(err)
	}
	checkFor(t, settle, disconnected(nc, "the revoked user's connection"))
	if _, err := nats.Connect(m.url, nats.UserCredentials(credsFile), nats.NoReconnect()); err == nil {
		t.Fatal("a user issued for a module unassigned connected again")
	}
	if !nc2.IsConnected() {
		t.Fatal("the user issued for paperless on web2 was closed with web1's")
	}
	// Forgetting the module revokes what is left of it.
	if _, err := m.c.Unassign(ctx, "web2", []string{"paperless"}); err != nil {
		t.Fatal(err)
	}
	checkFor(t, settle, disconnected(nc2, "web2's issued user's connection"))
	f, err := m.c.ModuleForget(ctx, app.ForgetRequest{Name: "paperless", AndWhatItHolds: true, Why: "paperless left the mesh"})
	if err != nil {
		t.Fatalf("forget: %+v, %v", f, err)
	}
	// and stays revoked across a restart of the controller
	m.stop()
	m.start()
	if _, err := nats.Connect(m.url, nats.UserCredentials(credsFile), nats.NoReconnect()); err == nil {
		t.Fatal("a revoked user connected after a restart")
	}
}
