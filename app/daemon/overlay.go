package daemon

import (
	"context"
	"time"

	"mesh-controller/app/protocol"
	"mesh-controller/contexts/inventory"
)

// maxPeers bounds the overlay peers one heartbeat may report (a node's
// peers are at most the mesh's other nodes); past it the rest are not
// judged.
const maxPeers = 10000

// peerState is what the loop keeps of one node's overlay peer: when it was
// first reported (a peer never heard is silent once that is old enough),
// its last handshake, and whether the store holds it silent.
type peerState struct {
	first  time.Time
	last   *time.Time
	silent bool
	// beat is the heartbeat that last reported it (daemon.peerBeat).
	beat uint64
}

// loadSilentPeers reads what the store says is silent, so that the loop
// writes only flips from it.
func (d *daemon) loadSilentPeers(ctx context.Context) error {
	silent, err := d.st.Inventory.SilentPeers(ctx)
	if err != nil {
		return err
	}
	for _, s := range silent {
		if d.peers[s.Node] == nil {
			d.peers[s.Node] = map[string]*peerState{}
		}
		d.peers[s.Node][s.Peer] = &peerState{first: s.Since, last: s.LastHandshake, silent: true}
	}
	return nil
}

// absorbPeers judges the handshakes a node's heartbeat reports: a direct
// peer (every peer a host reports is one) is silent when its last
// handshake is older than protocol.OverlayPeerSilentAfter, or when none was
// heard since it was first reported that long ago. Only a flip is queued
// for the store; a peer no longer reported is forgotten (heard, if the
// store held it silent). A beat without peers from a node that reported
// some says its overlay is gone: every peer is forgotten too.
func (d *daemon) absorbPeers(node string, at time.Time, reported []protocol.PeerHandshake) {
	known := d.peers[node]
	if len(reported) == 0 && len(known) == 0 {
		return
	}
	if known == nil {
		known = map[string]*peerState{}
		d.peers[node] = known
	}
	// Each beat is numbered, and a peer stamped with the number of the
	// last that reported it: no map made per beat, and only a name not
	// known yet is judged (those known were, when they came).
	d.peerBeat++
	beat := d.peerBeat
	for i, p := range reported {
		if i == maxPeers {
			break
		}
		s := known[p.Node]
		if s == nil {
			if !protocol.ValidName(p.Node) {
				continue
			}
			s = &peerState{first: at}
			known[p.Node] = s
		} else if s.beat == beat {
			continue // repeated in this beat
		}
		s.beat = beat
		s.last = p.At
		since := s.first
		if s.last != nil {
			since = *s.last
		}
		if silent := at.Sub(since) > protocol.OverlayPeerSilentAfter; silent != s.silent {
			s.silent = silent
			d.peerFlips = append(d.peerFlips, inventory.PeerFlip{Node: node, Peer: p.Node, Silent: silent, At: at, LastHandshake: s.last})
		}
	}
	for peer, s := range known {
		if s.beat == beat {
			continue
		}
		if s.silent {
			d.peerFlips = append(d.peerFlips, inventory.PeerFlip{Node: node, Peer: peer, Silent: false, At: at})
		}
		delete(known, peer)
	}
	if len(known) == 0 {
		delete(d.peers, node)
	}
}

// flushPeers writes the queued flips in one transaction.
func (d *daemon) flushPeers(ctx context.Context) {
	if len(d.peerFlips) == 0 {
		return
	}
	flips := d.peerFlips
	d.peerFlips = nil
	if err := d.st.Inventory.RecordPeerFlips(ctx, flips); err != nil {
		d.deposed(err)
		d.log.Error("record overlay peers silent or heard", "count", len(flips), "err", err)
	}
}
