package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"mesh-controller/app"
	"mesh-controller/contexts/health"
	"mesh-controller/contexts/inventory"
)

// unmanagedNamed is a node's node.unmanaged-listener, if open, and the
// listeners its evidence names.
func (m *testMesh) unmanagedNamed(t *testing.T, node string) (health.Condition, []string, bool) {
	t.Helper()
	if _, err := m.c.SelfCheck(context.Background(), app.CheckOptions{}); err != nil {
		t.Fatal(err)
	}
	cs, err := m.c.Conditions(context.Background(), app.ConditionFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		if c.Key != "node.unmanaged-listener/"+node {
			continue
		}
		var names []string
		ls, _ := c.Evidence["listeners"].([]any)
		for _, l := range ls {
			e, _ := l.(map[string]any)
			name, _ := e["listener"].(string)
			names = append(names, name)
		}
		return c, names, true
	}
	return health.Condition{}, nil, false
}

// lowListener listens on every address at the lowest free port below 20
// (this process is root, as make test runs it), so that it sorts among the
// first a condition names beside whatever else the machine listens on;
// elsewhere on any free port.
func lowListener(t *testing.T) net.Listener {
	t.Helper()
	for p := 1; p < 20 && os.Geteuid() == 0; p++ {
		if l, err := net.Listen("tcp", fmt.Sprintf("0.0.0.0:%d", p)); err == nil {
			return l
		}
	}
	l, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// A converged node listening, reachably, on a port no module there
// declares raises node.unmanaged-listener, one condition for the node,
// naming the listener, its addresses and holder; declaring it, or the
// listener going, takes it from the condition. A loopback listener, and an
// adopted node, raise nothing.
func TestUnmanagedListener(t *testing.T) {
	t.Parallel()
	reachable := lowListener(t)
	defer reachable.Close()
	loopback, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer loopback.Close()
	port := reachable.Addr().(*net.TCPAddr).Port
	b, err := os.ReadFile("/proc/self/comm") // the holder: this test's process
	if err != nil {
		t.Fatal(err)
	}
	comm := strings.TrimSpace(string(b))
	name := fmt.Sprintf("tcp/%d", port)
	loName := fmt.Sprintf("tcp/%d", loopback.Addr().(*net.TCPAddr).Port)

	m := newTestMesh(t)
	ctx := context.Background()
	web1 := m.join("web1")
	web2 := m.joinToken("web2", app.TokenRequest{Node: "web2", New: true, Adopted: true, TTL: time.Hour}, nil)
	for _, h := range []*testHost{web1, web2} {
		h.stop()
		h.factsEvery = 100 * time.Millisecond
		h.start()
	}
	// named says the condition names the listener; where it does not, the
	// machine's other listeners may sort before it (a machine with as many
	// below port 20 as a condition names), and the test says so.
	named := func() bool {
		c, names, open := m.unmanagedNamed(t, "web1")
		if open && !slices.Contains(names, name) && len(names) == app.UnmanagedShown && app.CompareListeners(names[len(names)-1], name) < 0 {
			t.Skipf("the machine listens on %d ports before %s: %s", app.UnmanagedShown, name, c.Summary)
		}
		return slices.Contains(names, name)
	}
	checkFor(t, settle, func() error {
		if !named() {
			_, names, open := m.unmanagedNamed(t, "web1")
			return fmt.Errorf("web1's listener %s is not raised: node.unmanaged-listener/web1 open %v, naming %q", name, open, names)
		}
		return nil
	})
	c, names, _ := m.unmanagedNamed(t, "web1")
	if c.Severity != "notice" || c.Machine != "web1" || !strings.Contains(c.Summary, "web1, converged, listens on ") ||
		!strings.Contains(c.Summary, name+" at ") || !strings.Contains(c.Summary, "held by "+comm) || slices.Contains(names, loName) {
		t.Fatalf("the condition: %+v", c)
	}
	for _, e := range c.Evidence["listeners"].([]any) {
		if e := e.(map[string]any); e["listener"] == name && fmt.Sprint(e["commands"]) != "["+comm+"]" {
			t.Fatalf("the listener's evidence: %+v", e)
		}
	}
	if _, _, open := m.unmanagedNamed(t, "web2"); open {
		t.Fatal("an adopted node raised node.unmanaged-listener")
	}
	cs, err := m.c.Conditions(ctx, app.ConditionFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		if c.Kind == "node.unmanaged-listener" && c.Key != "node.unmanaged-listener/web1" {
			t.Fatalf("a condition of another shape: %s", c.Key)
		}
	}

	m.addModule(writeManifest(t, fmt.Sprintf(`{"module": "listens", "version": "1.0.0", "ports": [{"name": "http", "port": %d, "expose": "public"}]}`, port)))
	m.assign(t, "web1", "listens")
	if named() {
		t.Fatal("a declared listener still named")
	}
	if _, err := m.c.Unassign(ctx, "web1", []string{"listens"}); err != nil {
		t.Fatal(err)
	}
	if !named() {
		t.Fatal("undeclared again, the listener was not named again")
	}
	reachable.Close()
	checkFor(t, settle, func() error {
		if named() {
			return fmt.Errorf("node.unmanaged-listener/web1 still names %s", name)
		}
		return nil
	})
}

// What a host reports is bounded in effect: a converged node's listeners,
// however many, are one condition, its evidence the count and the first
// few, each word clipped. Reports alternating between two sets of a
// thousand listeners change that condition once a check, never raising or
// clearing one a listener; the same set reported again changes nothing;
// the node's history grows by at most a row a check, each of a bounded
// size.
func TestUnmanagedListener_OneANode(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	ctx := context.Background()
	st, err := m.c.Stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.c.NodeAdd(ctx, "web1", false); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 1024) // as long as the daemon lets a word be
	// Two sets a hostile host alternates between, each as much as one
	// report carries (1,024 found): a thousand listeners with long words,
	// the first few each with several addresses and holders (the most a
	// condition names), and one listener with a thousand long addresses.
	var many, wide []inventory.Found
	for i := range 1004 {
		for k := range 4 {
			if i < app.UnmanagedShown || k == 0 {
				word := fmt.Sprintf("%d%s", k, long)
				many = append(many, inventory.Found{Kind: "port", Name: fmt.Sprintf("tcp/%d", 20000+i), Detail: long, Addresses: []string{word}, Commands: []string{word}})
			}
		}
	}
	for i := range 1024 {
		wide = append(wide, inventory.Found{Kind: "port", Name: "udp/9", Detail: fmt.Sprint(i), Addresses: []string{fmt.Sprintf("%04d%s", i, long)}, Commands: []string{fmt.Sprintf("c%d", i)}})
	}
	if len(many) > 1024 {
		t.Fatalf("%d found, more than a report carries", len(many))
	}
	report := func(found []inventory.Found) {
		t.Helper()
		if _, err := st.Inventory.RecordFacts(ctx, "web1", nil, found, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	check := func() []health.Change {
		t.Helper()
		r, err := m.c.SelfCheck(ctx, app.CheckOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var out []health.Change
		for _, ch := range r.Changes {
			if ch.Condition.Kind == "node.unmanaged-listener" {
				out = append(out, ch)
			}
		}
		n := 0
		for _, c := range r.Open {
			if c.Kind == "node.unmanaged-listener" {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("%d node.unmanaged-listener open, want one", n)
		}
		return out
	}
	report(many)
	if chs := check(); len(chs) != 1 || chs[0].Event != "raised" || chs[0].Condition.Key != "node.unmanaged-listener/web1" {
		t.Fatalf("the first report: %+v", chs)
	}
	c, names, _ := m.unmanagedNamed(t, "web1")
	if c.Evidence["count"] != float64(1004) || !slices.Equal(names, []string{"tcp/20000", "tcp/20001", "tcp/20002", "tcp/20003", "tcp/20004"}) ||
		!strings.Contains(c.Summary, "web1, converged, listens on 1004 ports no module there declares: tcp/20000 at ") ||
		!strings.Contains(c.Summary, " and 999 more: stop them, or declare them in a module") {
		t.Fatalf("the condition: %s %+v", c.Summary, c.Evidence)
	}
	// Pids move while the set does not: a holder restarted changes nothing.
	for i := range many {
		many[i].Detail = "another pid"
	}
	report(many)
	if chs := check(); len(chs) != 0 {
		t.Fatalf("the same set again: %+v", chs)
	}

	const checks = 40
	for i := range checks {
		set := wide
		if i%2 == 1 {
			set = many
		}
		report(set)
		if chs := check(); len(chs) != 1 || chs[0].Event != "changed" {
			t.Fatalf("check %d: %+v", i, chs)
		}
	}
	c, names, _ = m.unmanagedNamed(t, "web1")
	if c.Evidence["count"] != float64(1004) || len(names) != app.UnmanagedShown {
		t.Fatalf("after alternating: %+v", c.Evidence)
	}
	h, err := st.Health.History(ctx, "", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	rows, largest := 0, 0
	for _, ch := range h {
		if ch.Condition.Kind != "node.unmanaged-listener" {
			continue
		}
		rows++
		ev, _ := json.Marshal(ch.Condition.Evidence)
		size := len(ch.Condition.Summary) + len(ev)
		largest = max(largest, size)
	}
	// A raising and a change a check: the bound is the checks, not the
	// listeners; and HistoryPerSubject rows of at most 6 KiB each are what
	// one host can keep in the history, however long it goes on.
	if rows != checks+1 || rows > health.HistoryPerSubject {
		t.Fatalf("%d history rows of node.unmanaged-listener after %d checks", rows, checks+1)
	}
	if largest > 6<<10 {
		t.Fatalf("a history row of %d bytes, over 6 KiB", largest)
	}
	t.Logf("%d rows, the largest %d bytes: at most %d KiB a node kept", rows, largest, health.HistoryPerSubject*largest>>10)
}
