package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"mesh-controller/app"
	"mesh-controller/app/host"
	"mesh-controller/app/protocol"
)

// BenchmarkHeartbeatsAbsorbed measures heartbeats carried by the real broker
// over loopback TCP, verified against their node's key and absorbed by the
// daemon (written once a second in batches), from enough joined nodes that
// none beats past its budget (a burst of 40 each; a node sending faster than
// any real host is dropped by design). Beats are signed before the timer
// starts: the figure is the controller's side.
//
//	go test -run '^$' -bench HeartbeatsAbsorbed ./app/
func BenchmarkHeartbeatsAbsorbed(b *testing.B) {
	m := newTestMesh(b)
	nodes := min(max(100, b.N/40+1), 5000)
	states := make([]*host.State, nodes)
	for i := range states {
		name := fmt.Sprintf("n%d", i)
		tok, err := m.c.TokenIssue(context.Background(), app.TokenRequest{Node: name, New: true, TTL: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		if states[i], err = host.Join(context.Background(), host.JoinOptions{Broker: m.url, Token: tok.Token, Node: name,
			State: filepath.Join(b.TempDir(), name)}); err != nil {
			b.Fatal(err)
		}
	}
	// Each beat carries three supervised modules, as a real host's does.
	since := time.Now().UTC()
	modules := []protocol.ModuleState{{Module: "postgres", Version: "16.4.0", State: protocol.StateReady, Serial: 3, Pid: 4100, Since: since},
		{Module: "paperless", Version: "2.14.1", State: protocol.StateReady, Serial: 3, Pid: 4101, Since: since},
		{Module: "backup", Version: "1.2.0", State: protocol.StateStarting, Serial: 3, Pid: 4102, Since: since}}
	msgs := make([][]byte, b.N)
	subjects := make([]string, b.N)
	for i := range msgs {
		st := states[i%nodes]
		var err error
		if msgs[i], err = protocol.Sign(st.HostKey, protocol.HeartbeatBody{At: time.Now(), IntervalS: 10, SerialApplied: int64(i), Modules: modules}); err != nil {
			b.Fatal(err)
		}
		subjects[i] = protocol.NodeSubject(st.Node, protocol.Heartbeat)
	}
	st, err := m.c.Stores(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	nc, err := m.c.DialBroker(context.Background(), st.Identity)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	start := m.count.Beats.Load()
	b.ResetTimer()
	for i := range msgs {
		if err := nc.Publish(subjects[i], msgs[i]); err != nil {
			b.Fatal(err)
		}
	}
	nc.Flush()
	checkFor(b, 60*time.Second, m.beatsAbove(start+int64(b.N)-1))
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "beats/s")
}
