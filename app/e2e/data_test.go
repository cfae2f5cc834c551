package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"mesh-controller/app"
	"mesh-controller/app/host"
	"mesh-controller/app/protocol"
)

// controllerConn connects as a controller user, to watch what is sent.
func (m *testMesh) controllerConn(t *testing.T) *nats.Conn {
	t.Helper()
	st, err := m.c.Stores(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	nc, err := m.c.DialBroker(context.Background(), st.Identity)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// paperlessMesh is a mesh where db1 runs postgres and web1 paperless, bound
// to it, both hosts having applied their declarations.
func paperlessMesh(t *testing.T) (*testMesh, *testHost) {
	t.Helper()
	m := newTestMesh(t)
	m.join("db1")
	web1 := m.join("web1")
	m.addModule(example("postgres"))
	m.addModule(example("paperless"))
	m.assign(t, "db1", "postgres")
	m.assign(t, "web1", "paperless")
	m.settled(t, "db1", "web1")
	return m, web1
}

func (m *testMesh) assign(t *testing.T, node string, modules ...string) {
	t.Helper()
	if _, err := m.c.Assign(context.Background(), node, modules); err != nil {
		t.Fatal(err)
	}
}

func (m *testMesh) settled(t *testing.T, nodes ...string) {
	t.Helper()
	for _, n := range nodes {
		checkFor(t, settle, m.upToDate(n))
	}
}

// A seat handover is never empty in between: at every declaration sent
// during it, some node holds the seat.
func TestData_SeatHandoverNeverEmpty(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	m.join("nas1")
	m.join("nas2")
	m.addModule(example("backup"))
	m.assign(t, "nas1", "backup")
	m.assign(t, "nas2", "backup")
	m.settled(t, "nas1", "nas2")

	nc := m.controllerConn(t)
	var mu sync.Mutex
	holds := map[string]bool{"nas1": true, "nas2": false}
	var seen []string
	var violation string
	sub, err := nc.Subscribe("mesh.node.*.inbox.declaration", func(msg *nats.Msg) {
		var env protocol.Envelope
		json.Unmarshal(msg.Data, &env)
		var body struct {
			Node  string   `json:"node"`
			Seats []string `json:"seats"`
		}
		json.Unmarshal([]byte(env.Declaration), &body)
		mu.Lock()
		defer mu.Unlock()
		holds[body.Node] = false
		for _, s := range body.Seats {
			holds[body.Node] = holds[body.Node] || s == "backup"
		}
		seen = append(seen, body.Node)
		if !holds["nas1"] && !holds["nas2"] && violation == "" {
			violation = "after " + strings.Join(seen, ", ") + " no declaration sent holds the backup seat"
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	nc.Flush()
	h, err := m.c.SeatHandover(context.Background(), app.HandoverRequest{Seat: "backup", To: "nas2/backup", Yes: true, Why: "the old disk is failing"})
	if err != nil || !h.Changed || h.Empty == "" {
		t.Fatalf("handover: %+v, %v", h, err)
	}
	checkFor(t, settle, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(seen) < 2 {
			return fmt.Errorf("%d declarations of the handover seen, not 2", len(seen))
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if violation != "" {
		t.Fatal(violation)
	}
	if !holds["nas2"] || holds["nas1"] {
		t.Fatalf("after the handover: %v", holds)
	}
	// The replacement started empty: the self-check raises it.
	m.settled(t, "nas1", "nas2")
	if _, err := m.c.SelfCheck(context.Background(), app.CheckOptions{}); err != nil {
		t.Fatal(err)
	}
	if !m.open(t, "data.empty-replacement/1") {
		t.Fatal("data.empty-replacement not raised")
	}
}

// A rotate gives provider and consumer the new credential in the same push.
func TestData_RotateBothEnds(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	db1, web1 := m.join("db1"), m.join("web1")
	m.addModule(example("postgres"))
	m.addModule(example("paperless"))
	m.assign(t, "db1", "postgres")
	m.assign(t, "web1", "paperless")
	m.settled(t, "db1", "web1")
	consumerFile := filepath.Join(web1.root, "etc/mesh/modules/paperless/bindings/postgres.credential")
	providerFile := filepath.Join(db1.root, "etc/mesh/modules/postgres/consumers/web1_paperless/postgres.credential")
	read := func(f string) string { b, _ := os.ReadFile(f); return string(b) }
	checkFor(t, settle, func() error {
		if c, p := read(consumerFile), read(providerFile); c == "" || c != p {
			return fmt.Errorf("the ends do not hold one credential: the consumer's %d bytes, the provider's %d", len(c), len(p))
		}
		return nil
	})
	before := read(consumerFile)
	if fileMode(t, consumerFile) != 0o600 || fileMode(t, providerFile) != 0o600 {
		t.Fatal("a credential file is not 0600")
	}

	nc := m.controllerConn(t)
	var mu sync.Mutex
	var sent []string
	sub, _ := nc.Subscribe("mesh.node.*.inbox.declaration", func(msg *nats.Msg) {
		mu.Lock()
		sent = append(sent, protocol.NodeOfSubject(msg.Subject))
		mu.Unlock()
	})
	defer sub.Unsubscribe()
	nc.Flush()
	r, err := m.c.Rotate(context.Background(), "postgres", "", "")
	if err != nil || len(r.Credentials) != 1 || len(r.Pushed) != 2 || !r.Pushed[0].Sent || !r.Pushed[1].Sent {
		t.Fatalf("rotate: %+v, %v", r, err)
	}
	checkFor(t, settle, func() error {
		if c, p := read(consumerFile), read(providerFile); c == before || c != p {
			return fmt.Errorf("the ends do not hold one new credential: the consumer's is new %v, the provider's the same %v", c != before, c == p)
		}
		return nil
	})
	checkFor(t, settle, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(sent) < 2 {
			return fmt.Errorf("the watcher saw declarations for %v, not two", sent)
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if len(sent) != 2 || sent[0] == sent[1] {
		t.Fatalf("one push to both ends, got declarations for %v", sent)
	}
}

// Unassigned data stays, is listed as retired, and is deleted only by
// cleanup delete: the host removes it and reports it gone.
func TestData_CleanupDeleteFlow(t *testing.T) {
	t.Parallel()
	m, web1 := paperlessMesh(t)
	media := filepath.Join(web1.root, "var/lib/paperless/media")
	if err := os.WriteFile(filepath.Join(media, "scan.pdf"), []byte("a scanned letter"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := m.c.Unassign(ctx, "web1", []string{"paperless"}); err != nil {
		t.Fatal(err)
	}
	m.settled(t, "web1")
	checkFor(t, settle, func() error {
		if d := m.dataOf(t, "web1", "paperless", "media"); d == nil || d.State != "retired" || d.Bytes == nil || *d.Bytes != int64(len("a scanned letter")) {
			return fmt.Errorf("data does not list media retired with %d bytes: %s", len("a scanned letter"), jsonText(d))
		}
		return nil
	})
	if _, err := os.Stat(filepath.Join(media, "scan.pdf")); err != nil {
		t.Fatal("unassigning deleted data")
	}
	// Never backed up: it goes only with the digest of its preview.
	asked := app.CleanupRequest{Node: "web1", Module: "paperless", Target: "media", Why: "scanned elsewhere"}
	r, err := m.c.CleanupDelete(ctx, asked)
	if !errors.Is(err, app.ErrNeedsDigest) || len(r.Preview) != 1 {
		t.Fatalf("without a digest: %+v, %v", r, err)
	}
	asked.Yes = r.Preview[0].Digest
	if _, err := m.c.CleanupDelete(ctx, asked); err != nil {
		t.Fatal(err)
	}
	checkFor(t, settle, func() error {
		cls, _ := m.c.Cleanup(ctx)
		for _, cl := range cls {
			if cl.Target == "media" {
				return fmt.Errorf("media is still cleanable: %s", jsonText(cl))
			}
		}
		if _, err := os.Stat(media); !os.IsNotExist(err) {
			return fmt.Errorf("the host has not deleted media: %v", err)
		}
		return nil
	})
	ds, _ := m.c.Data(ctx)
	for _, d := range ds {
		if d.Node == "web1" && d.Name == "media" {
			t.Fatalf("deleted data still listed: %+v", d)
		}
	}
	if _, err := os.Stat(filepath.Join(web1.root, "var/lib/paperless/index")); err != nil {
		t.Fatal("cleanup deleted what it was not asked to")
	}
}

// cleanup delete --older-than deletes nothing without --confirm.
func TestData_OlderThanNeedsConfirm(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	m.join("db1")
	m.join("web1")
	m.addModule(example("postgres"))
	m.addModule(example("paperless"))
	m.assign(t, "db1", "postgres")
	m.assign(t, "web1", "paperless")
	ctx := context.Background()
	if _, err := m.c.Unassign(ctx, "web1", []string{"paperless"}); err != nil {
		t.Fatal(err)
	}
	// A person's command forty days later (the daemon keeps its own clock).
	later := *m.c
	later.Now = func() time.Time { return time.Now().Add(40 * 24 * time.Hour) }
	r, err := later.CleanupDelete(ctx, app.CleanupRequest{OlderThanDays: 30, Why: "tidy"})
	// media (irreplaceable, retired) and index (rebuildable, dropped)
	if err != nil || len(r.Preview) != 2 || r.Deleted != nil || r.Pushed != nil {
		t.Fatalf("without confirm: %+v %v", r, err)
	}
	plan, _ := m.c.PlanShow(ctx, "web1")
	if len(plan.Plan.Body.Delete) != 0 {
		t.Fatalf("deletions asked without --confirm: %+v", plan.Plan.Body.Delete)
	}
	// --confirm deletes the rebuildable index and refuses media: never backed up.
	r, err = later.CleanupDelete(ctx, app.CleanupRequest{OlderThanDays: 30, Why: "tidy", Confirm: true})
	var refused *app.RefusedError
	if !errors.As(err, &refused) || len(r.Deleted) != 1 || r.Deleted[0].Target != "index" || len(r.Refused) != 1 || r.Refused[0].Target != "media" {
		t.Fatalf("with --confirm: %+v, %v", r, err)
	}
	if plan, _ = m.c.PlanShow(ctx, "web1"); len(plan.Plan.Body.Delete) != 1 || plan.Plan.Body.Delete[0].Target != "index" {
		t.Fatalf("with --confirm: %+v", plan.Plan.Body.Delete)
	}
}

// Precious data with no backup holder raises data.no-backup; it clears when
// the backup seat's holder reports a backup of it.
func TestData_NoBackupClearsWhenABackupIsHeard(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	m.join("web1")
	nas1 := m.join("nas1")
	web2 := m.join("web2")
	m.addModule(example("postgres"))
	m.addModule(example("backup"))
	m.assign(t, "web1", "postgres")
	ctx := context.Background()
	key := "data.no-backup/web1/postgres/cluster"
	check := func() {
		if _, err := m.c.SelfCheck(ctx, app.CheckOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	check()
	d, err := m.c.ConditionShow(ctx, key)
	if err != nil || !strings.Contains(d.Summary, "no module holds the backup seat") {
		t.Fatalf("%+v, %v", d, err)
	}
	m.assign(t, "nas1", "backup")
	m.settled(t, "nas1")
	check()
	if d, _ = m.c.ConditionShow(ctx, key); !strings.Contains(d.Summary, "no backup of it heard yet") {
		t.Fatalf("with a holder: %+v", d)
	}
	plan, _ := m.c.PlanShow(ctx, "nas1")
	if len(plan.Plan.Body.BackupLines) == 0 {
		t.Fatal("the backup seat's holder has no backup lines")
	}
	line := protocol.BackupBody{Node: "web1", Module: "postgres", Data: "cluster", At: time.Now().UTC()}
	if err := host.BackupDone(ctx, web2.state, line); err == nil {
		t.Fatal("a node that does not hold the backup seat reported a backup")
	}
	if err := host.BackupDone(ctx, nas1.state, line); err != nil {
		t.Fatal(err)
	}
	// The serving controller judges too: a check of its that read the
	// mesh before the backup was kept may raise the condition again once,
	// and the next check clears it.
	checkFor(t, settle, func() error {
		check()
		if m.open(t, key) {
			return errors.New("data.no-backup still open after a backup was heard")
		}
		return nil
	})
	ds, _ := m.c.Data(ctx)
	for _, dv := range ds {
		if dv.Node == "web1" && dv.Name == "cluster" && (dv.LastBackup == nil || dv.BackupHolder != "nas1/backup") {
			t.Fatalf("data: %+v", dv)
		}
	}
}
