package app

import (
	"context"
	"fmt"
	"mesh-controller/contexts/inventory"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// A converged node listening, reachably, on a port no module there
// declares raises node.unmanaged-listener, naming the listener, its
// addresses and holder; declaring it, or the listener going, clears it.
// A loopback listener, and an adopted node, raise nothing.
func TestUnmanagedListener(t *testing.T) {
	reachable, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
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
	key := fmt.Sprintf("node.unmanaged-listener/web1/tcp/%d", port)
	loKey := fmt.Sprintf("node.unmanaged-listener/web1/tcp/%d", loopback.Addr().(*net.TCPAddr).Port)

	m := newTestMesh(t)
	ctx := context.Background()
	web1 := m.join("web1")
	web2 := m.joinToken("web2", TokenRequest{Node: "web2", New: true, Adopted: true, TTL: time.Hour}, nil)
	for _, h := range []*testHost{web1, web2} {
		h.stop()
		h.factsEvery = 100 * time.Millisecond
		h.start()
	}
	waitFor(t, "web1's listener raised", func() bool { return m.openAfterCheck(t, key) })
	cs, err := m.c.Conditions(ctx, ConditionFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		switch {
		case c.Key == key && (c.Severity != "notice" || !strings.Contains(c.Summary, fmt.Sprintf("web1, converged, listens on tcp/%d at ", port)) || !strings.Contains(c.Summary, "which no module there declares (held by "+comm+")")):
			t.Fatalf("the condition: %+v", c)
		case c.Key == loKey:
			t.Fatalf("a loopback listener raised %s", c.Summary)
		case strings.HasPrefix(c.Key, "node.unmanaged-listener/web2/"):
			t.Fatalf("an adopted node raised %s", c.Summary)
		}
	}

	m.addModule(writeManifest(t, fmt.Sprintf(`{"module": "listens", "version": "1.0.0", "ports": [{"name": "http", "port": %d, "expose": "public"}]}`, port)))
	m.assign(t, "web1", "listens")
	if m.openAfterCheck(t, key) {
		t.Fatal("a declared listener still raised")
	}
	if _, err := m.c.Unassign(ctx, "web1", []string{"listens"}); err != nil {
		t.Fatal(err)
	}
	if !m.openAfterCheck(t, key) {
		t.Fatal("undeclared again, the listener was not raised again")
	}
	reachable.Close()
	waitFor(t, "the listener gone to be cleared", func() bool { return !m.openAfterCheck(t, key) })
}

// What a host sends is judged: a listener named otherwise than
// protocol/port raises nothing (its name would be part of a key).
func TestUnmanagedListener_NamesJudged(t *testing.T) {
	in := &checkInputs{snap: &inventory.Snapshot{}, listeners: map[string][]inventory.Found{"web1": {
		{Kind: "port", Name: "tcp/8080", Addresses: []string{"0.0.0.0"}},
		{Kind: "port", Name: "tcp/8080/../../x", Addresses: []string{"0.0.0.0"}},
		{Kind: "port", Name: "sctp/9", Addresses: []string{"0.0.0.0"}},
		{Kind: "port", Name: "tcp/123456", Addresses: []string{"0.0.0.0"}},
	}}}
	got := unmanagedListeners(in, inventory.Node{Name: "web1", Mode: inventory.Converged})
	if len(got) != 1 || got[0].Name != "tcp/8080" {
		t.Fatalf("got %+v", got)
	}
}
