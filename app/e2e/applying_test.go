package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"mesh-controller/app/protocol"
)

// What a host's beat says of the declaration it is applying is what node
// show and node list say of the node, until a beat says nothing of it: a
// host signing as the real one does, with its own key and broker user,
// beats to the serving controller.
func TestMesh_BeatSaysApplying(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	web1 := m.join("web1")
	web1.stop() // its beats are this test's alone
	nc := connectAs(t, m.url, web1.state)
	beat := func(a *protocol.Applying) {
		t.Helper()
		b, err := protocol.Sign(web1.state.HostKey, protocol.HeartbeatBody{At: time.Now(), IntervalS: 1, Applying: a})
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Publish(protocol.NodeSubject("web1", protocol.Heartbeat), b); err != nil {
			t.Fatal(err)
		}
	}
	since := time.Now().UTC().Add(-3 * time.Minute).Truncate(time.Millisecond)
	beat(&protocol.Applying{Serial: 7, Since: since, Phase: "archives"})
	checkFor(t, 15*time.Second, func() error {
		n := m.node("web1")
		if a := n.Applying; a == nil || a.Serial != 7 || !a.Since.Equal(since) || a.Phase != "archives" {
			return fmt.Errorf("node show says applying %+v", a)
		}
		return nil
	})
	nodes, err := m.c.NodeList(context.Background())
	if err != nil || len(nodes) != 1 || nodes[0].Applying == nil || nodes[0].Applying.Serial != 7 {
		t.Fatalf("node list: %+v, %v", nodes, err)
	}
	beat(nil)
	checkFor(t, 15*time.Second, func() error {
		if a := m.node("web1").Applying; a != nil {
			return fmt.Errorf("after a beat between applies, node show says applying %+v", a)
		}
		return nil
	})
}
