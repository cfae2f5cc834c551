package app

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"testing"
	"time"

	"mesh-controller/app/host"
	"mesh-controller/embedded/sqlite"
)

// checkFor polls check until it returns nil, failing the test with its last
// error after within.
func checkFor(t testing.TB, within time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v", within, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMesh_RestartUnderLoad stops serve under 200 simulated hosts, moves
// every node's plan while it is away, and starts it again where the hosts
// dial: every host reconnects by itself, is heard again and applies the
// declaration made for it, and none gives up. The simulator is the one
// 'make bench' measures 10,000 hosts with, coming back as real hosts do.
func TestMesh_RestartUnderLoad(t *testing.T) {
	const hosts = 200
	m := newTestMesh(t)
	ctx := context.Background()
	tokens := filepath.Join(t.TempDir(), "tokens")
	if _, err := m.c.TokenIssueMany(ctx, "sim", hosts, false, time.Hour, tokens); err != nil {
		t.Fatal(err)
	}
	simCtx, stopSim := context.WithCancel(ctx)
	simDone := make(chan host.SimStats, 1)
	go func() {
		s, err := host.Simulate(simCtx, host.SimOptions{Broker: m.url, TokensFile: tokens, Heartbeat: time.Second, Out: io.Discard})
		if err != nil {
			t.Error(err)
		}
		simDone <- s
	}()
	t.Cleanup(func() {
		stopSim()
		<-simDone
	})
	st, err := m.c.stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	count := func(query string, args ...any) (int, error) {
		var n int
		err := st.DB("inventory").Reader.QueryRowContext(ctx, query, args...).Scan(&n)
		return n, err
	}
	checkFor(t, 30*time.Second, func() error {
		n, err := count(`SELECT count(*) FROM nodes WHERE last_heard IS NOT NULL`)
		if err == nil && n < hosts {
			err = fmt.Errorf("%d of %d hosts joined and heard", n, hosts)
		}
		return err
	})

	m.stop()
	names, err := st.Inventory.JoinedNodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Something every node depends on changed while serve was away.
	if err := st.Inventory.BumpPlans(ctx, names); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	m.start()
	checkFor(t, 30*time.Second, func() error {
		n, err := count(`SELECT count(*) FROM nodes n JOIN declarations d ON d.node = n.name
			WHERE d.plan_version = n.plan_version AND n.serial_applied >= d.serial AND n.last_heard >= ?`, sqlite.FormatTime(start))
		if err == nil && n < hosts {
			err = fmt.Errorf("%d of %d hosts heard again and caught up since serve started again", n, hosts)
		}
		return err
	})
	t.Logf("every host heard again and caught up %s after serve started again", time.Since(start).Round(time.Millisecond))
	stopSim()
	s := <-simDone
	if s.GaveUp != 0 || s.Reconnects < hosts {
		t.Fatalf("simulated hosts: %d gave up, %d reconnected of %d", s.GaveUp, s.Reconnects, hosts)
	}
	simDone <- s
}
