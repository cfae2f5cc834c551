package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"mesh-controller/app"
	"mesh-controller/app/apptest"
	"mesh-controller/app/host"
	"mesh-controller/app/protocol"
	"mesh-controller/embedded/broker/clustertest"
	"mesh-controller/embedded/sqlite"
)

// natsCluster runs three nats-server processes configured as 'broker show
// --config' prints for c, and points c at them.
func natsCluster(t *testing.T, c *apptest.Mesh) *clustertest.Cluster {
	t.Helper()
	cl := clustertest.Start(t, 3, func(n app.BrokerConfigRequest) (string, error) {
		return c.BrokerConfig(context.Background(), n)
	})
	c.Broker = cl.URLs()
	return cl
}

// clusterMesh is a controller serving through a NATS cluster of three.
func clusterMesh(t *testing.T) (*testMesh, *clustertest.Cluster) {
	t.Helper()
	c, _ := migrated(t)
	cl := natsCluster(t, c)
	m := &testMesh{t: t, c: c, listen: "unused:0", logs: &syncBuffer{}, opts: app.ServeOptions{CatchUpEvery: 200 * time.Millisecond}}
	m.start()
	t.Cleanup(m.stop)
	return m, cl
}

// carryOn declares each host anew and waits until every host was heard after since and applied
// a declaration sent after it.
func (m *testMesh) carryOn(t *testing.T, what string, hosts ...*testHost) {
	t.Helper()
	since := time.Now()
	for _, h := range hosts {
		d := m.declare(h.name, moduleBody("after-"+strings.ReplaceAll(what, " ", "-"), "/srv/"+h.name))
		checkFor(t, 20*time.Second, func() error {
			n := m.node(h.name)
			if n.SerialApplied < d.Serial || n.LastHeard == nil || !n.LastHeard.After(since) {
				return fmt.Errorf("%s %s: applied %d of %d, last heard %s", what, h.name, n.SerialApplied, d.Serial, n.LastHeard)
			}
			return nil
		})
	}
}

// TestMesh_Cluster serves a mesh through a NATS cluster of three
// nats-server processes configured as broker show --config prints: hosts
// are given every server's URL; the archives bucket keeps three copies;
// the server the controller is on, then one a host is on, is killed with
// SIGKILL and the controller and hosts carry on through the other two; a
// removed node's host is refused by every server, the one that was away
// when it was removed included, without anyone reloading anything.
func TestMesh_Cluster(t *testing.T) {
	t.Parallel()
	m, cl := clusterMesh(t)
	if got := strings.Split(m.url, ","); len(got) != 3 {
		t.Fatalf("serving on %s, want the three servers", m.url)
	}
	hosts := []*testHost{m.join("web1"), m.join("web2"), m.join("web3")}
	want := strings.Split(cl.URLs(), ",")
	for _, h := range hosts {
		if !slices.Equal(h.state.BrokerURLs, want) {
			t.Fatalf("%s was given %v, want every server's %v", h.name, h.state.BrokerURLs, want)
		}
	}
	m.carryOn(t, "joined", hosts...)
	// Simulated hosts beating every 30 s: heard again after the kill well
	// before their next beat.
	const simHosts = 30
	simulatedEvery(t, m, simHosts, 30*time.Second)
	countNodes(t, m, 30*time.Second, simHosts, "joined and beating", `SELECT count(*) FROM nodes WHERE name LIKE 'sim%' AND heartbeat_interval_s IS NOT NULL`)

	ctx := context.Background()
	archiveCopies(t, m, 3)

	// The server the controller is on.
	killed := cl.Holding("mesh-controller")
	if killed < 0 {
		t.Fatal("the controller is on no server")
	}
	var onIt, simOn []string
	for _, node := range cl.Hosts(killed) {
		if strings.HasPrefix(node, "sim") {
			simOn = append(simOn, "'"+node+"'")
		} else {
			onIt = append(onIt, node)
		}
	}
	at := time.Now()
	cl.Kill(killed)
	// The hosts on it are heard again soon, not a heartbeat later: a beat
	// sent as a host came back may be lost while the controller's own
	// connection comes back too, and it beats again when its ask is
	// answered (an ask lost into the dead server's route is asked again
	// after protocol.AnswerTimeout, 5 s).
	countNodes(t, m, 8*time.Second, len(simOn), "of the killed server's heard again within 8 s (beating every 30 s)",
		`SELECT count(*) FROM nodes WHERE name IN (`+strings.Join(simOn, ",")+`) AND last_heard >= ?`, sqlite.FormatTime(at))
	t.Logf("killed %s, the controller's server (hosts on it: %v, and %d simulated); heard again in %s",
		cl.Servers[killed].Name, onIt, len(simOn), time.Since(at).Round(time.Millisecond))
	m.carryOn(t, "server "+cl.Servers[killed].Name+" killed", hosts...)
	cl.Restart(killed)

	// A server a host is on, if none was on the controller's.
	if len(onIt) == 0 {
		i := cl.Holding("mesh-host web1")
		cl.Kill(i)
		m.carryOn(t, "server "+cl.Servers[i].Name+" of web1 killed", hosts...)
		cl.Restart(i)
	}

	// web2 removed while one server is away: every server refuses it,
	// the one away too once it is back.
	away := cl.Holding("mesh-host web2")
	cl.Kill(away)
	m.carryOn(t, "server of web2 killed", hosts[0], hosts[2])
	if _, err := m.c.NodeRemove(ctx, app.NodeRemoveRequest{Names: []string{"web2"}, Why: "test"}); err != nil {
		t.Fatal(err)
	}
	hosts[1].stop() // refused from now on, it would try again and again
	cl.Restart(away)
	opts, err := hosts[1].state.ConnectOptions()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range cl.Servers {
		checkFor(t, 10*time.Second, func() error {
			c, err := nats.Connect(s.URL, append(opts, nats.NoReconnect())...)
			if err == nil {
				c.Close()
				return fmt.Errorf("%s let the removed web2 connect", s.Name)
			}
			return nil
		})
	}
	if !strings.Contains(m.logs.String(), "the mesh account's JWT taken by") {
		t.Errorf("no push said in the log:\n%s", m.logs.String())
	}
}

// archiveCopies waits until the archives bucket keeps want copies.
func archiveCopies(t *testing.T, m *testMesh, want int) {
	t.Helper()
	ctx := context.Background()
	js, _ := jetstream.New(m.controllerConn(t))
	checkFor(t, 20*time.Second, func() error {
		stream, err := js.Stream(ctx, "OBJ_"+protocol.ArchiveBucket)
		if err == nil && stream.CachedInfo().Config.Replicas != want {
			err = fmt.Errorf("the archives bucket keeps %d copies, want %d", stream.CachedInfo().Config.Replicas, want)
		}
		return err
	})
}

// serve given every server of a cluster of which one is away when it
// starts serves through the others, and hosts join and apply.
func TestMesh_ClusterServerAwayAtStart(t *testing.T) {
	t.Parallel()
	c, _ := migrated(t)
	cl := natsCluster(t, c)
	cl.Kill(0)
	m := &testMesh{t: t, c: c, listen: "unused:0", logs: &syncBuffer{}, opts: app.ServeOptions{CatchUpEvery: 200 * time.Millisecond}}
	m.start()
	t.Cleanup(m.stop)
	h := m.join("web1")
	m.carryOn(t, "one server away at start", h)
	// Three copies of the archives need the third server: the bucket is
	// made once it is back.
	cl.Restart(0)
	archiveCopies(t, m, 3)
}

// A host asking to join while no controller answers joins yet (one about
// to serve, or its connection moving to another server of a cluster) asks
// again, and joins once one does.
func TestMesh_JoinBeforeServe(t *testing.T) {
	t.Parallel()
	c, st := migrated(t)
	external, _ := externalBroker(t, st, freeAddr(t))
	defer external.Shutdown()
	c.Broker = external.ClientURL()
	tok, err := c.TokenIssue(context.Background(), app.TokenRequest{Node: "web1", New: true, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	joined := make(chan error, 1)
	go func() {
		_, err := host.Join(context.Background(), host.JoinOptions{Broker: c.Broker, Token: tok.Token, Node: "web1", State: filepath.Join(t.TempDir(), "state")})
		joined <- err
	}()
	m := &testMesh{t: t, c: c, listen: "unused:0", logs: &syncBuffer{}}
	m.start()
	defer m.stop()
	select {
	case err := <-joined:
		if err != nil {
			t.Fatalf("join asked before serve: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("join asked before serve: not done after 30s")
	}
}
