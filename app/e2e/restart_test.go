package e2e

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"mesh-controller/app"
	"mesh-controller/app/host"
	"mesh-controller/embedded/broker"
	"mesh-controller/embedded/sqlite"
)

// simulated starts hosts simulated hosts joining m, beating every second,
// until the test ends; stop ends them and returns what they did.
func simulated(t *testing.T, m *testMesh, hosts int) (stop func() host.SimStats) {
	t.Helper()
	return simulatedEvery(t, m, hosts, time.Second)
}

// simulatedEvery is simulated, the hosts beating every beat.
func simulatedEvery(t *testing.T, m *testMesh, hosts int, beat time.Duration) (stop func() host.SimStats) {
	t.Helper()
	tokens := filepath.Join(t.TempDir(), "tokens")
	if _, err := m.c.TokenIssueMany(context.Background(), "sim", hosts, false, time.Hour, tokens); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan host.SimStats, 1)
	go func() {
		s, err := host.Simulate(ctx, host.SimOptions{Broker: m.url, TokensFile: tokens, Heartbeat: beat, Out: io.Discard})
		if err != nil {
			t.Error(err)
		}
		done <- s
	}()
	var once sync.Once
	var stats host.SimStats
	stop = func() host.SimStats {
		once.Do(func() {
			cancel()
			stats = <-done
		})
		return stats
	}
	t.Cleanup(func() { stop() })
	return stop
}

// simulate --for counts from when the joins are over: however short, it
// cuts no join (a busy machine's joins took longer than a --for 1s, and
// were counted failed).
func TestSimulate_ForAfterTheJoins(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	tokens := filepath.Join(t.TempDir(), "tokens")
	if _, err := m.c.TokenIssueMany(context.Background(), "sim", 5, false, time.Hour, tokens); err != nil {
		t.Fatal(err)
	}
	s, err := host.Simulate(context.Background(), host.SimOptions{Broker: m.url, TokensFile: tokens, Heartbeat: time.Second, For: time.Millisecond, Out: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	if s.Joined != 5 || s.JoinFailed != 0 {
		t.Fatalf("%d of 5 joined, %d failed", s.Joined, s.JoinFailed)
	}
}

// countNodes polls query, a count of nodes, until it reaches want.
func countNodes(t *testing.T, m *testMesh, within time.Duration, want int, what, query string, args ...any) {
	t.Helper()
	st, err := m.c.Stores(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	checkFor(t, within, func() error {
		var n int
		err := st.DB("inventory").Reader.QueryRow(query, args...).Scan(&n)
		if err == nil && n < want {
			err = fmt.Errorf("%d of %d hosts %s", n, want, what)
		}
		return err
	})
}

// caughtUp counts the nodes that applied the declaration of their plan as
// it is and were heard since.
const caughtUp = `SELECT count(*) FROM nodes n JOIN declarations d ON d.node = n.name
	WHERE d.plan_version = n.plan_version AND n.serial_applied >= d.serial AND n.last_heard >= ?`

// explainBehind, when the test failed, says which nodes were not heard
// since and caught up, and what the controller logged.
func explainBehind(t *testing.T, m *testMesh, since time.Time) {
	if !t.Failed() {
		return
	}
	st, err := m.c.Stores(context.Background())
	if err != nil {
		return
	}
	rows, err := st.DB("inventory").Reader.Query(`SELECT n.name, n.serial_applied, coalesce(d.serial, 0), n.plan_version, coalesce(d.plan_version, 0), coalesce(n.last_heard, '')
		FROM nodes n LEFT JOIN declarations d ON d.node = n.name
		WHERE NOT (d.plan_version = n.plan_version AND n.serial_applied >= d.serial AND n.last_heard >= ?)`, sqlite.FormatTime(since))
	if err != nil {
		return
	}
	defer rows.Close()
	for rows.Next() {
		var name, heard string
		var applied, serial, plan, declaredPlan int64
		rows.Scan(&name, &applied, &serial, &plan, &declaredPlan, &heard)
		t.Logf("%s: applied %d of %d; plan %d, declared from %d; heard %s", name, applied, serial, plan, declaredPlan, heard)
	}
	t.Log(m.logs.String())
}

// bumpAll moves every joined node's plan, as a change every node depends on
// does.
func bumpAll(t *testing.T, m *testMesh) {
	t.Helper()
	ctx := context.Background()
	st, err := m.c.Stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	names, err := st.Inventory.JoinedNodes(ctx)
	if err == nil {
		err = st.Inventory.BumpPlans(ctx, names)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestMesh_RestartUnderLoad stops serve under 200 simulated hosts, moves
// every node's plan while it is away, and starts it again where the hosts
// dial: every host reconnects by itself, is heard again and applies the
// declaration made for it, and none gives up. The simulator is the one
// 'make bench' measures 10,000 hosts with, coming back as real hosts do.
func TestMesh_RestartUnderLoad(t *testing.T) {
	t.Parallel()
	const hosts = 200
	m := newTestMesh(t)
	stop := simulated(t, m, hosts)
	countNodes(t, m, 30*time.Second, hosts, "joined and beating", `SELECT count(*) FROM nodes WHERE heartbeat_interval_s IS NOT NULL`)

	m.stop()
	bumpAll(t, m)
	start := time.Now()
	m.start()
	defer explainBehind(t, m, start)
	countNodes(t, m, 30*time.Second, hosts, "heard again and caught up since serve started again", caughtUp, sqlite.FormatTime(start))
	t.Logf("every host heard again and caught up %s after serve started again", time.Since(start).Round(time.Millisecond))
	if s := stop(); s.GaveUp != 0 || s.Reconnects < hosts {
		t.Fatalf("simulated hosts: %d gave up, %d reconnections for %d hosts", s.GaveUp, s.Reconnects, hosts)
	}
}

// TestMesh_ExternalBrokerAway takes an external broker away from a serving
// controller and 50 simulated hosts, for long enough that every plan moves
// and is declared meanwhile (sent into nothing), then starts it again at
// the same address: the controller's connections and the hosts' come back
// by themselves, and every host is heard again and applies its latest.
func TestMesh_ExternalBrokerAway(t *testing.T) {
	t.Parallel()
	const hosts = 50
	c, st := migrated(t)
	ctx := context.Background()
	addr := freeAddr(t)
	external, trust := externalBroker(t, st, addr)
	c.Broker = external.ClientURL()
	m := &testMesh{t: t, c: c, listen: "unused:0", logs: &syncBuffer{}, opts: app.ServeOptions{CatchUpEvery: 100 * time.Millisecond}}
	m.start()
	t.Cleanup(m.stop)
	stop := simulated(t, m, hosts)
	countNodes(t, m, 30*time.Second, hosts, "joined and beating", `SELECT count(*) FROM nodes WHERE heartbeat_interval_s IS NOT NULL`)

	external.Shutdown()
	away := time.Now()
	bumpAll(t, m)
	declared := func() error {
		behind, err := st.Inventory.Behind(ctx)
		if err == nil && len(behind) < hosts {
			err = fmt.Errorf("%d of %d nodes declared anew while the broker is away", len(behind), hosts)
		}
		return err
	}
	checkFor(t, 30*time.Second, declared)
	t.Logf("every node declared anew %s after the broker went away", time.Since(away).Round(time.Millisecond))
	back := time.Now()
	external, err := broker.Start(addr, trust)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(external.Shutdown)
	defer explainBehind(t, m, back)
	countNodes(t, m, 30*time.Second, hosts, "heard again and caught up since the broker came back", caughtUp, sqlite.FormatTime(back))
	t.Logf("every host heard again and caught up %s after the broker came back", time.Since(back).Round(time.Millisecond))
	if s := stop(); s.GaveUp != 0 {
		t.Fatalf("simulated hosts: %d gave up", s.GaveUp)
	}
}
