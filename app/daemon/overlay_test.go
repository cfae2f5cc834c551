package daemon

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"mesh-controller/app/protocol"
)

// The loop queues a flip only when a pair turns silent or is heard again:
// a peer never heard is silent once it has been reported that long; one
// no longer reported, or a beat with no peers at all, is heard (forgotten).
func TestAbsorbPeers(t *testing.T) {
	d := &daemon{peers: map[string]map[string]*peerState{}}
	t0 := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	flips := func() []string {
		var out []string
		for _, f := range d.peerFlips {
			out = append(out, map[bool]string{true: "silent ", false: "heard "}[f.Silent]+f.Node+"/"+f.Peer)
		}
		d.peerFlips = nil
		return out
	}
	heard := t0.Add(-time.Minute)
	beat := func(at time.Time, peers ...protocol.PeerHandshake) { d.absorbPeers("nat1", at, peers) }
	never := protocol.PeerHandshake{Node: "pub1"}
	recent := protocol.PeerHandshake{Node: "pub2", At: &heard}

	beat(t0, never, recent)
	if got := flips(); len(got) != 0 {
		t.Fatalf("first beat: %v", got)
	}
	beat(t0.Add(2*time.Minute), never, recent)
	if got := flips(); len(got) != 0 {
		t.Fatalf("2 minutes on: %v", got)
	}
	beat(t0.Add(4*time.Minute), never, recent)
	if got := flips(); !slices.Equal(got, []string{"silent nat1/pub1", "silent nat1/pub2"}) {
		t.Fatalf("4 minutes on: %v", got)
	}
	beat(t0.Add(5*time.Minute), never, recent)
	if got := flips(); len(got) != 0 {
		t.Fatalf("still silent, written again: %v", got)
	}
	now := t0.Add(6 * time.Minute)
	beat(now, protocol.PeerHandshake{Node: "pub1", At: &now}, recent)
	if got := flips(); !slices.Equal(got, []string{"heard nat1/pub1"}) {
		t.Fatalf("pub1 heard: %v", got)
	}
	beat(now.Add(time.Second), protocol.PeerHandshake{Node: "pub1", At: &now})
	if got := flips(); !slices.Equal(got, []string{"heard nat1/pub2"}) {
		t.Fatalf("pub2 no longer a peer: %v", got)
	}
	beat(now.Add(2 * time.Second))
	if got := flips(); len(got) != 0 || len(d.peers) != 0 {
		t.Fatalf("no overlay: %v, %v", got, d.peers)
	}
	beat(now, protocol.PeerHandshake{Node: "Not A Name", At: &heard}, protocol.PeerHandshake{Node: "pub3"})
	if _, ok := d.peers["nat1"]["Not A Name"]; ok {
		t.Error("a peer that is not a name was kept")
	}
}

// BenchmarkAbsorbPeers measures one heartbeat's peers judged: a public
// node reporting 100 peers, each heard a minute ago, nothing flipping.
//
//	go test -run '^$' -bench AbsorbPeers ./app/daemon/
func BenchmarkAbsorbPeers(b *testing.B) {
	d := &daemon{peers: map[string]map[string]*peerState{}}
	at := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	heard := at.Add(-time.Minute)
	var peers []protocol.PeerHandshake
	for i := range 100 {
		peers = append(peers, protocol.PeerHandshake{Node: "nat" + strconv.Itoa(i), At: &heard})
	}
	b.ReportAllocs()
	for b.Loop() {
		d.absorbPeers("pub1", at, peers)
	}
	if len(d.peerFlips) != 0 || len(d.peers["pub1"]) != 100 {
		b.Fatalf("%d flips, %d peers known", len(d.peerFlips), len(d.peers["pub1"]))
	}
}
