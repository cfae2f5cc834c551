package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"mesh-controller/app"
	"mesh-controller/app/host"
	"mesh-controller/embedded/sqlite"
)

// BenchmarkFanOut2000 is one change to every node of a mesh of 2,000
// simulated hosts, from the act's start until every host's apply report is
// recorded: a mesh-wide settings change, and a roll-out --together of a
// new version (serve drives it). Serve, its broker, the hosts and the act
// share one process here (a process may hold 20,000 descriptors: 2,000
// hosts are 4,000 of them), so it measures what they cost together on
// this machine's cores; the load bench measures 10,000 in three processes.
// p50-ms and p99-ms are of the hosts' reports as the controller recorded
// them (applied_at), act-ms how long the act's call took.
//
//	go test -run '^$' -bench FanOut2000 -benchtime 3x ./app/e2e/
func BenchmarkFanOut2000(b *testing.B) {
	const hosts = 2000
	m := newTestMesh(b)
	ctx := context.Background()
	m.simulate(b, hosts, host.SimOptions{Heartbeat: 10 * time.Second})
	st, err := m.c.Stores(ctx)
	if err != nil {
		b.Fatal(err)
	}
	// The hosts that joined within 3 minutes are the mesh measured (on a
	// busy machine a few may not).
	var nodes []string
	for deadline := time.Now().Add(3 * time.Minute); len(nodes) < hosts && time.Now().Before(deadline); time.Sleep(time.Second) {
		nodes = m.joinedNodes(b)
	}
	if len(nodes) < hosts*9/10 {
		b.Fatalf("%d of %d simulated hosts joined", len(nodes), hosts)
	}
	manifest := func(version string) string {
		return writeManifest(b, `{"module": "fan", "version": "`+version+`", "data": [{"name": "d", "path": "/srv/fan", "precious": "rebuildable"}],
			"settings": {"schema": {"type": "object"}, "defaults": {}}}`)
	}
	m.addModule(manifest("1.0.0"))
	// applied waits until every host applied its latest declaration, and
	// says when each report was recorded after start.
	db := st.DB("inventory")
	applied := func(b *testing.B, start time.Time) []time.Duration {
		checkFor(b, time.Minute, func() error {
			behind, err := st.Inventory.Behind(ctx)
			if err != nil {
				return err
			}
			if len(behind) > 0 {
				return fmt.Errorf("%d of %d hosts have not applied their latest declaration", len(behind), len(nodes))
			}
			return nil
		})
		var lat []time.Duration
		rows, err := db.Reader.QueryContext(ctx, `SELECT applied_at FROM nodes WHERE applied_at IS NOT NULL`)
		if err != nil {
			b.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				b.Fatal(err)
			}
			if at, err := sqlite.ParseTime(s); err == nil && at.After(start) {
				lat = append(lat, at.Sub(start))
			}
		}
		slices.Sort(lat)
		if len(lat) < len(nodes) {
			b.Fatalf("%d of %d hosts' reports recorded after the act began", len(lat), len(nodes))
		}
		return lat
	}
	report := func(b *testing.B, act time.Duration, lat [][]time.Duration) {
		var p50, p99 time.Duration
		for _, l := range lat {
			p50 += l[len(l)/2]
			p99 += l[len(l)*99/100]
		}
		n := float64(len(lat))
		b.ReportMetric(act.Seconds()*1000/n, "act-ms")
		b.ReportMetric(p50.Seconds()*1000/n, "p50-ms")
		b.ReportMetric(p99.Seconds()*1000/n, "p99-ms")
	}
	start := time.Now()
	if _, err := m.c.AssignMany(ctx, app.ManyRequest{Nodes: nodes, Modules: []string{"fan"}}); err != nil {
		b.Fatal(err)
	}
	applied(b, start)

	b.Run("settings", func(b *testing.B) {
		var act time.Duration
		var lat [][]time.Duration
		for i := 0; b.Loop(); i++ {
			start := time.Now()
			if _, err := m.c.SettingsSet(ctx, app.SettingsRequest{Module: "fan", Body: fmt.Appendf(nil, `{"workers": %d}`, i), From: "benchmark"}); err != nil {
				b.Fatal(err)
			}
			act += time.Since(start)
			lat = append(lat, applied(b, start))
		}
		report(b, act, lat)
	})
	version := 0 // the runs of a sub-benchmark each roll out new versions
	b.Run("roll-out", func(b *testing.B) {
		var act time.Duration
		var lat [][]time.Duration
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			version++
			m.addModule(manifest(fmt.Sprintf("1.0.%d", version)))
			b.StartTimer()
			start := time.Now()
			out, err := m.c.Upgrade(ctx, app.UpgradeRequest{Module: "fan", Action: "roll-out", Together: true, Wait: time.Minute})
			if err != nil {
				b.Fatal(err)
			}
			act += time.Since(start)
			if len(out.Steps) != len(nodes) {
				b.Fatalf("%d steps", len(out.Steps))
			}
			lat = append(lat, applied(b, start))
		}
		report(b, act, lat)
	})
}
