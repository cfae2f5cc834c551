package app

import (
	"testing"

	"mesh-controller/contexts/inventory"
)

// A roll-out's running line counts its nodes forward (ready, failed, the
// rest waiting), and, once it goes back, only the nodes it moved (back,
// not back, the rest returning).
func TestTallyOf(t *testing.T) {
	nodes := func(ns ...inventory.RollOutNode) []inventory.RollOutNode { return ns }
	for _, c := range []struct {
		name string
		ro   inventory.RollOut
		want RollOutTally
	}{
		{"none sent", inventory.RollOut{To: "2.0.0", Phase: inventory.RollOutRunning, Nodes: nodes(
			inventory.RollOutNode{Node: "a", From: "1.0.0", Result: "waiting"},
			inventory.RollOutNode{Node: "b", From: "1.0.0", Batch: 1, Result: "waiting"})},
			RollOutTally{To: "2.0.0", Phase: "running", Total: 2, Waiting: 2}},
		{"canary ready, batch sent", inventory.RollOut{To: "2.0.0", Phase: inventory.RollOutSoaking, Nodes: nodes(
			inventory.RollOutNode{Node: "a", From: "1.0.0", Moved: true, Serial: 3, Result: "ready"},
			inventory.RollOutNode{Node: "b", From: "1.0.0", Batch: 1, Moved: true, Serial: 4, Result: "moved"},
			inventory.RollOutNode{Node: "c", From: "1.0.0", Batch: 1, Moved: true, Serial: 4, Result: "failed"},
			inventory.RollOutNode{Node: "d", From: "1.0.0", Batch: 2, Result: "waiting"})},
			RollOutTally{To: "2.0.0", Phase: "soaking", Batch: 1, Total: 4, Done: 1, Failed: 1, Waiting: 2}},
		{"going back", inventory.RollOut{To: "2.0.0", Phase: inventory.RollOutRollingBack, Nodes: nodes(
			inventory.RollOutNode{Node: "a", From: "1.0.0", Moved: true, Serial: 3, Result: "ready", Back: "returned"},
			inventory.RollOutNode{Node: "b", From: "1.0.0", Batch: 1, Moved: true, Serial: 4, Result: "failed", Back: "returning"},
			inventory.RollOutNode{Node: "c", From: "1.0.0", Batch: 1, Moved: true, Serial: 4, Result: "failed"},
			inventory.RollOutNode{Node: "d", From: "2.0.0", Batch: 1, Moved: true, Serial: 4, Result: "ready"},
			inventory.RollOutNode{Node: "e", From: "1.0.0", Batch: 2, Result: "waiting"})},
			RollOutTally{To: "2.0.0", Phase: "rolling-back", Batch: 1, Back: true, Total: 3, Done: 1, Waiting: 2}},
		{"rolled back, one not back", inventory.RollOut{To: "2.0.0", Phase: inventory.RollOutRolledBack, Nodes: nodes(
			inventory.RollOutNode{Node: "a", From: "1.0.0", Moved: true, Serial: 3, Result: "ready", Back: "returned"},
			inventory.RollOutNode{Node: "b", From: "1.0.0", Moved: true, Serial: 3, Result: "failed", Back: "not-returned"})},
			RollOutTally{To: "2.0.0", Phase: "rolled-back", Back: true, Total: 2, Done: 1, Failed: 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := TallyOf(c.ro); got != c.want {
				t.Errorf("TallyOf = %+v, want %+v", got, c.want)
			}
		})
	}
}
