package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"mesh-controller/app"
	"mesh-controller/app/host"
	"mesh-controller/app/protocol"
)

// BenchmarkAssignToReady is the time from assign to the example module
// ready on its node, through a real host (heartbeat 50 ms; it beats at once
// when a state changes) and the real controller: each round assigns hello,
// waits for ready, unassigns it and waits for it to stop.
//
//	go test -run '^$' -bench AssignToReady -benchtime 10x ./app/
func BenchmarkAssignToReady(b *testing.B) {
	bin := buildHello(b)
	m := newTestMesh(b)
	web1 := m.join("web1")
	web1.install(b, "hello", "bin/hello", bin)
	m.addModule(helloOnFreePort(b))
	ctx := context.Background()
	var took []float64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if _, err := m.c.Assign(ctx, "web1", []string{"hello"}); err != nil {
			b.Fatal(err)
		}
		checkFor(b, settle, m.moduleIn("web1", "hello", protocol.StateReady))
		took = append(took, float64(time.Since(start).Microseconds())/1000)
		b.StopTimer()
		if _, err := m.c.Unassign(ctx, "web1", []string{"hello"}); err != nil {
			b.Fatal(err)
		}
		checkFor(b, settle, m.moduleGone("web1", "hello"))
		b.StartTimer()
	}
	slices.Sort(took)
	b.ReportMetric(took[len(took)/2], "p50-ms")
	b.ReportMetric(took[len(took)-1], "max-ms")
}

// BenchmarkRollOutTogether100 rolls a new version of the example module out
// to 100 simulated hosts at once (roll-out --together), until every host
// reports it ready: the controller's and the broker's share of a roll-out
// (a simulated host applies at once and reports its modules ready).
//
//	go test -run '^$' -bench RollOutTogether100 -benchtime 3x ./app/
func BenchmarkRollOutTogether100(b *testing.B) {
	const hosts = 100
	m := newTestMesh(b)
	ctx := context.Background()
	m.simulate(b, hosts, host.SimOptions{Heartbeat: time.Second, Joins: 16})
	checkFor(b, settle, func() error {
		if joined := m.joinedNodes(b); len(joined) != hosts {
			return fmt.Errorf("%d of %d simulated hosts joined", len(joined), hosts)
		}
		return nil
	})
	base, err := os.ReadFile(helloManifest)
	if err != nil {
		b.Fatal(err)
	}
	m.addModule(writeManifest(b, string(base)))
	for i := 1; i <= hosts; i++ {
		if _, err := m.c.Assign(ctx, fmt.Sprintf("sim%d", i), []string{"hello"}); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		v := fmt.Sprintf("1.0.%d", i+1)
		m.addModule(writeManifest(b, strings.Replace(string(base), `"1.0.0"`, `"`+v+`"`, 1)))
		b.StartTimer()
		out, err := m.c.Upgrade(ctx, app.UpgradeRequest{Module: "hello", Action: "roll-out", Together: true, Wait: time.Minute})
		if err != nil {
			b.Fatal(err)
		}
		for _, s := range out.Steps {
			if !s.Ready {
				b.Fatalf("%s not ready: %+v", s.Node, s)
			}
		}
		if len(out.Steps) != hosts {
			b.Fatalf("%d steps", len(out.Steps))
		}
	}
}

// BenchmarkRollOutRollBack100 rolls a new version of the example module
// out to 100 simulated hosts and one node whose host never joined, last:
// canary, then batches of half; the last batch fails, and every node moved
// goes back. It reports the whole roll-out, and the time from the failure
// being said (rolling back) to the rollback's end; each holds one --wait
// (1s) spent on the silent node, forward and back.
//
//	go test -run '^$' -bench RollOutRollBack100 -benchtime 1x ./app/e2e/
func BenchmarkRollOutRollBack100(b *testing.B) { benchRollBack(b, 100, true) }

// BenchmarkRollOutRollBack1000 rolls a new version out to 1,000 simulated
// hosts: a canary, then batches of half; the last host of the last batch
// reports the module failed at the new version (as a module that exits at
// once), and every host moved goes back. It reports the whole roll-out,
// the time to detect (the failing host sent its declaration, to the
// roll-out saying it rolls back) and to return all (that, to the last host
// back on the version it ran).
//
//	go test -run '^$' -bench RollOutRollBack1000 -benchtime 1x -timeout 30m ./app/e2e/
func BenchmarkRollOutRollBack1000(b *testing.B) { benchRollBack(b, 1000, false) }

// benchRollBack rolls out to hosts simulated hosts, the failure either a
// node whose host never joined (silent) or the last host reporting failed.
func benchRollBack(b *testing.B, hosts int, silent bool) {
	m := newTestMesh(b)
	ctx := context.Background()
	tokens := filepath.Join(b.TempDir(), "tokens")
	if _, err := m.c.TokenIssueMany(ctx, "sim", hosts, false, time.Hour, tokens); err != nil {
		b.Fatal(err)
	}
	// The roll-out moves its nodes in name order: the last is the one to fail.
	failing := "zzdead"
	if !silent {
		names := make([]string, hosts)
		for i := range names {
			names[i] = fmt.Sprintf("sim%d", i+1)
		}
		slices.Sort(names)
		failing = names[len(names)-1]
	}
	sctx, stop := context.WithCancel(ctx)
	simDone := make(chan error, 1)
	go func() {
		_, err := host.Simulate(sctx, host.SimOptions{Broker: m.url, TokensFile: tokens, Heartbeat: time.Second, Joins: 16, Out: &strings.Builder{},
			Fails: func(node, module, version string) bool { return node == failing && version != "1.0.0" }})
		simDone <- err
	}()
	b.Cleanup(func() { stop(); <-simDone })
	checkFor(b, 2*settle, func() error {
		ns, err := m.c.NodeList(ctx)
		if err != nil {
			return err
		}
		joined := 0
		for _, n := range ns {
			if n.Joined {
				joined++
			}
		}
		if joined != hosts {
			return fmt.Errorf("%d of %d simulated hosts joined", joined, hosts)
		}
		return nil
	})
	if silent {
		if _, err := m.c.NodeAdd(ctx, "zzdead", false); err != nil {
			b.Fatal(err)
		}
	}
	base, err := os.ReadFile(helloManifest)
	if err != nil {
		b.Fatal(err)
	}
	m.addModule(writeManifest(b, string(base)))
	all := make([]string, 0, hosts+1)
	for i := 1; i <= hosts; i++ {
		all = append(all, fmt.Sprintf("sim%d", i))
	}
	if silent {
		all = append(all, "zzdead")
	}
	if _, err := m.c.AssignMany(ctx, app.ManyRequest{Nodes: all, Modules: []string{"hello"}}); err != nil {
		b.Fatal(err)
	}
	checkFor(b, 2*settle, func() error {
		ns, err := m.c.NodeList(ctx)
		if err != nil {
			return err
		}
		for _, n := range ns {
			if n.Joined && n.SerialApplied != n.SerialDeclared {
				return fmt.Errorf("%s applied %d of %d", n.Name, n.SerialApplied, n.SerialDeclared)
			}
		}
		return nil
	})
	var total, detect, back []float64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		v := fmt.Sprintf("1.0.%d", i+1)
		m.addModule(writeManifest(b, strings.Replace(string(base), `"1.0.0"`, `"`+v+`"`, 1)))
		b.StartTimer()
		start := time.Now()
		var sent, detected time.Time
		out, err := m.c.Upgrade(ctx, app.UpgradeRequest{Module: "hello", Action: "roll-out", Canary: 1, Batch: "50%", Wait: time.Second,
			Progress: func(s string) {
				switch {
				case strings.HasPrefix(s, failing+" sent declaration"):
					sent = time.Now()
				case strings.HasPrefix(s, "rolling back"):
					detected = time.Now()
				}
			}})
		if !errors.Is(err, app.ErrRollOutRolledBack) || detected.IsZero() {
			b.Fatalf("the roll-out: %v", err)
		}
		returned := 0
		for _, n := range out.RollOut.Nodes {
			if n.Back == "returned" {
				returned++
			}
		}
		if returned < hosts {
			b.Fatalf("%d of %d returned: %v", returned, hosts, err)
		}
		total = append(total, float64(time.Since(start).Milliseconds()))
		if !sent.IsZero() {
			detect = append(detect, float64(detected.Sub(sent).Milliseconds()))
		}
		back = append(back, float64(time.Since(detected).Milliseconds()))
	}
	b.ReportMetric(slices.Max(total), "rollout-ms")
	if len(detect) > 0 {
		b.ReportMetric(slices.Max(detect), "detect-ms")
	}
	b.ReportMetric(slices.Max(back), "return-all-ms")
}

// simulate plays hosts simulated hosts (sim1…) against the mesh, with o's
// options (its broker and tokens set here), until the benchmark ends.
func (m *testMesh) simulate(b *testing.B, hosts int, o host.SimOptions) {
	b.Helper()
	tokens := filepath.Join(b.TempDir(), "tokens")
	if _, err := m.c.TokenIssueMany(context.Background(), "sim", hosts, false, time.Hour, tokens); err != nil {
		b.Fatal(err)
	}
	o.Broker, o.TokensFile, o.Out = m.url, tokens, &strings.Builder{}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := host.Simulate(ctx, o)
		done <- err
	}()
	b.Cleanup(func() { stop(); <-done })
}

// joinedNodes are the names of the mesh's joined nodes.
func (m *testMesh) joinedNodes(b *testing.B) []string {
	b.Helper()
	ns, err := m.c.NodeList(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	var joined []string
	for _, n := range ns {
		if n.Joined {
			joined = append(joined, n.Name)
		}
	}
	return joined
}
