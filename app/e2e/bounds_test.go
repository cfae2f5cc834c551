package e2e

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"mesh-controller/app/protocol"
)

// count runs a count query on a store through the process's own handle.
func (m *testMesh) countRows(t *testing.T, store, query string, args ...any) int64 {
	t.Helper()
	st, err := m.c.Stores(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var n sql.NullInt64
	if err := st.DB(store).Reader.QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n.Int64
}

// What hosts report cannot grow the stores without bound (issue 11, item 3):
// a host, signing as a real one does with its own key and broker user,
// sends a report carrying 50,000 tiers (before: 20 of them added 111 MB in
// 8 s), which the broker refuses as over a host's 1 MiB; one carrying 10,000,
// which the controller refuses whole; and a burst of 500 apply reports, past
// the node's budget, which is dropped: both refusals are counted. Heartbeats
// are kept as one aggregate row per node and hour.
func TestMesh_ReportsAreBounded(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	web1 := m.join("web1")
	web1.stop() // its reports are this test's alone
	nc := connectAs(t, m.url, web1.state)
	publish := func(what string, body any) {
		b, err := protocol.Sign(web1.state.HostKey, body)
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Publish(protocol.NodeSubject("web1", what), b); err != nil {
			t.Fatal(err)
		}
	}
	tiers := func(n int) []protocol.Tier {
		out := make([]protocol.Tier, n)
		for i := range out {
			out[i] = protocol.Tier{Tier: fmt.Sprintf("t%d", i), MS: 1}
		}
		return out
	}
	big, err := protocol.Sign(web1.state.HostKey, protocol.AppliedBody{Serial: 1, OK: true, Tiers: tiers(50000)})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish(protocol.NodeSubject("web1", protocol.Applied), big); err == nil || !strings.Contains(err.Error(), "maximum payload") {
		t.Fatalf("a %d-byte report from a host: %v", len(big), err)
	}
	publish(protocol.Applied, protocol.AppliedBody{Serial: 1, OK: true, Tiers: tiers(10000)})
	for i := 0; i < 500; i++ {
		publish(protocol.Applied, protocol.AppliedBody{Serial: int64(i + 1), OK: false, Error: "x", Tiers: []protocol.Tier{{Tier: "verify", MS: 1}}})
	}
	for i := 0; i < 500; i++ {
		publish(protocol.Heartbeat, protocol.HeartbeatBody{At: time.Now(), IntervalS: 1})
	}
	nc.Flush()
	checkFor(t, settle, func() error {
		large := m.countRows(t, "health", `SELECT sum(count) FROM dropped_messages WHERE node = 'web1' AND reason = 'too large'`)
		many := m.countRows(t, "health", `SELECT sum(count) FROM dropped_messages WHERE node = 'web1' AND reason = 'too many applied reports'`)
		if large != 1 || many == 0 {
			return fmt.Errorf("web1's messages refused as too large: %d, not 1; as too many applied reports: %d", large, many)
		}
		return nil
	})
	m.stop() // writes the heartbeat aggregates
	if n := m.countRows(t, "health", `SELECT count(*) FROM durations WHERE kind = 'tier'`); n > 60 {
		t.Fatalf("%d tier durations kept from one node's burst", n)
	}
	if n := m.countRows(t, "health", `SELECT count(*) FROM durations WHERE kind = 'apply'`); n > 60 {
		t.Fatalf("%d apply durations kept from one node's burst", n)
	}
	if n := m.countRows(t, "health", `SELECT count(*) FROM heartbeat_hours WHERE node = 'web1'`); n < 1 || n > 2 {
		t.Fatalf("web1's heartbeats kept as %d rows, want one per hour", n)
	}
}
