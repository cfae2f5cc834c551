package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"mesh-controller/app"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/inventory"
)

// The converge preview from what a host reported: the same reports, the
// same bytes and digest; a listener no module declares named as not kept;
// the filter rendered with the SSH port the host saw; --yes refusing a
// digest of another preview, or one the node no longer matches (saying
// what changed); a node converged already refused; --close-ssh without a
// filter refused; a node that never reported refused.
func TestConverge_Preview(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	ctx := context.Background()
	st, err := m.c.Stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.c.NodeAdd(ctx, "db1", true); err != nil {
		t.Fatal(err)
	}
	if _, err := m.c.NodeAdd(ctx, "quiet", true); err != nil {
		t.Fatal(err)
	}
	m.addModule(writeManifest(t, `{"module": "site", "version": "1.0.0", "ports": [{"name": "http", "port": 8080, "expose": "public"}]}`))
	m.addModule(writeManifest(t, `{"module": "other", "version": "1.0.0", "ports": [{"name": "x", "port": 7000}]}`))
	m.assign(t, "db1", "site")
	report := func(found ...inventory.Found) {
		t.Helper()
		facts := []inventory.Fact{{Name: protocol.FactSSHPort, Value: "2222", Why: "sshd (pid 9) listens on tcp/2222 at 0.0.0.0"}}
		if _, err := st.Inventory.RecordFacts(ctx, "db1", facts, found, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	sshd := inventory.Found{Kind: "port", Name: "tcp/2222", Detail: "sshd", Addresses: []string{"0.0.0.0"}, Commands: []string{"sshd"}}
	site := inventory.Found{Kind: "port", Name: "tcp/8080", Detail: "site", Addresses: []string{"0.0.0.0"}, Commands: []string{"oldsite"}}
	stray := inventory.Found{Kind: "port", Name: "tcp/6379", Detail: "redis", Addresses: []string{"0.0.0.0", "[::]"}, Commands: []string{"redis-server"}}
	lo := inventory.Found{Kind: "port", Name: "tcp/631", Detail: "cups", Addresses: []string{"127.0.0.1"}, Commands: []string{"cupsd"}}
	unit := inventory.Found{Kind: "service", Name: "cron.service", Detail: "active"}
	report(sshd, site, stray, lo, unit)

	preview := func(r app.ConvergeRequest) app.ConvergePreview {
		t.Helper()
		p, done, err := m.c.Converge(ctx, r)
		if err != nil || done != nil {
			t.Fatalf("preview %+v: %v %+v", r, err, done)
		}
		return p
	}
	p := preview(app.ConvergeRequest{Node: "db1", Filter: "nftables"})
	again := preview(app.ConvergeRequest{Node: "db1", Filter: "nftables"})
	a, _ := json.Marshal(p)
	b, _ := json.Marshal(again)
	if string(a) != string(b) || len(p.Digest) != 16 {
		t.Fatalf("the same reports, two previews:\n%s\n%s", a, b)
	}
	if len(p.Unmanaged) != 1 || p.Unmanaged[0].Name != "tcp/6379" || strings.Join(p.Unmanaged[0].Addresses, " ") != "0.0.0.0 [::]" {
		t.Fatalf("not kept: %+v", p.Unmanaged)
	}
	if len(p.Loopback) != 1 || p.Loopback[0].Name != "tcp/631" || len(p.Units) != 1 || p.Units[0] != "cron.service" {
		t.Fatalf("loopback %+v, units %v", p.Loopback, p.Units)
	}
	if p.SSHPort != 2222 || !p.SSHReported || !strings.Contains(p.Ruleset, "tcp dport 2222 accept") {
		t.Fatalf("ssh %d %v:\n%s", p.SSHPort, p.SSHReported, p.Ruleset)
	}
	if !strings.Contains(strings.Join(p.Does, "\n"), "no longer keep tcp/6379 at 0.0.0.0 [::] (held by redis-server): closed by the filter") {
		t.Fatalf("does: %v", p.Does)
	}
	closed := preview(app.ConvergeRequest{Node: "db1", Filter: "nftables", CloseSSH: true})
	if closed.Digest == p.Digest || closed.SSHPort != 0 || strings.Contains(closed.Ruleset, "tcp dport 2222 accept") {
		t.Fatalf("--close-ssh: %+v", closed)
	}
	none := preview(app.ConvergeRequest{Node: "db1"})
	if none.Ruleset != "" || none.Digest == p.Digest {
		t.Fatalf("no filter: %+v", none)
	}

	refused := func(r app.ConvergeRequest, want error, says string) {
		t.Helper()
		_, done, err := m.c.Converge(ctx, r)
		if !errors.Is(err, want) || !strings.Contains(err.Error(), says) || done != nil {
			t.Fatalf("%+v: %v, want %v saying %q", r, err, want, says)
		}
	}
	refused(app.ConvergeRequest{Node: "db1", Filter: "nftables", Yes: "0123456789abcdef"}, app.ErrConvergeDigestUnknown, "its preview's digest is "+p.Digest)
	refused(app.ConvergeRequest{Node: "db1", Filter: "nftables", CloseSSH: true, Yes: "0123456789abcdef"}, app.ErrConvergeDigestUnknown, "")
	refused(app.ConvergeRequest{Node: "db1", CloseSSH: true}, app.ErrCloseSSHWithoutFilter, "")
	refused(app.ConvergeRequest{Node: "quiet", Filter: "nftables"}, app.ErrNoFacts, "node quiet has not reported what runs there yet")
	refused(app.ConvergeRequest{Node: "nine"}, inventory.ErrNodeNotFound, "")
	// A take's digest is not a converge's, though kept beside them.
	if err := st.Inventory.ShowTakePreview(ctx, inventory.TakePreview{Digest: "feedfacefeedface", Node: "db1", Module: "other", Preview: "{}", ShownAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	refused(app.ConvergeRequest{Node: "db1", Yes: "feedfacefeedface"}, app.ErrConvergeDigestUnknown, "")

	// Another listener since the preview: its digest is stale, and the
	// refusal says what changed.
	report(sshd, site, stray, lo, unit, inventory.Found{Kind: "port", Name: "tcp/9000", Addresses: []string{"0.0.0.0"}, Commands: []string{"nc"}})
	refused(app.ConvergeRequest{Node: "db1", Filter: "nftables", Yes: p.Digest}, app.ErrConvergeChanged, "listener tcp/9000 was not there, now at 0.0.0.0, held by nc")
	if n := m.node("db1"); n.Mode != "adopted" {
		t.Fatalf("a refused converge changed the node: %s", n.Mode)
	}

	now := preview(app.ConvergeRequest{Node: "db1", Filter: "nftables"})
	_, done, err := m.c.Converge(ctx, app.ConvergeRequest{Node: "db1", Filter: "nftables", Yes: now.Digest})
	if err != nil || done == nil || done.Pushed.Serial == 0 {
		t.Fatalf("converge --yes: %v %+v", err, done)
	}
	pv, err := m.c.PlanShow(ctx, "db1")
	if err != nil {
		t.Fatal(err)
	}
	var decl protocol.Declaration
	if err := json.Unmarshal(pv.JSON, &decl); err != nil {
		t.Fatal(err)
	}
	if decl.Mode != "converged" || decl.Filter == nil || decl.Filter.Ruleset != now.Ruleset {
		t.Fatalf("the plan after converging: %s", pv.JSON)
	}
	refused(app.ConvergeRequest{Node: "db1", Filter: "nftables"}, app.ErrConvergedAlready, "node db1 is converged already, with the mesh's nftables filter")
	acts, err := m.c.HandActs(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if s := fmt.Sprintf("%+v", acts); !strings.Contains(s, "converge db1") || !strings.Contains(s, now.Digest) {
		t.Fatalf("the hand act: %s", s)
	}
}
