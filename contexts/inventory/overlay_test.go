package inventory

import (
	"context"
	"errors"
	"maps"
	"net/netip"
	"slices"
	"testing"
	"time"
)

// Each node takes an overlay index when it is recorded, one at a time in
// both ways of adding nodes; a removed node's index is never given again;
// the mesh's ULA prefix is made once.
func TestStore_OverlayIndexes(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	now := time.Now()
	if _, err := s.AddNode(ctx, "a1", Converged, now); err != nil {
		t.Fatal(err)
	}
	if err := s.AddNodes(ctx, []string{"b1", "b2"}, Converged, now); err != nil {
		t.Fatal(err)
	}
	indexes := func() map[string]int64 {
		t.Helper()
		o, err := s.ReadOverlay(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if p, err := netip.ParsePrefix(o.Prefix6); err != nil || p.String() != o.Prefix6 || p.Bits() != 48 || p.Addr().As16()[0] != 0xfd {
			t.Fatalf("prefix %q", o.Prefix6)
		}
		out := map[string]int64{}
		for _, n := range o.Nodes {
			out[n.Name] = n.Index
		}
		return out
	}
	first, _ := s.ReadOverlay(ctx)
	if got := indexes(); got["a1"] != 1 || got["b1"] != 2 || got["b2"] != 3 {
		t.Fatalf("indexes %v", got)
	}
	if _, err := s.RemoveNodes(ctx, []string{"b2"}, nil, 0, now); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddNode(ctx, "c1", Converged, now); err != nil {
		t.Fatal(err)
	}
	if got := indexes(); got["c1"] != 4 || len(got) != 3 {
		t.Fatalf("after removing b2 and adding c1: %v (b2's index 3 must not be given again)", got)
	}
	if err := s.EnsureOverlayPrefix(ctx); err != nil {
		t.Fatal(err)
	}
	if again, _ := s.ReadOverlay(ctx); again.Prefix6 != first.Prefix6 {
		t.Errorf("the prefix moved: %s, then %s", first.Prefix6, again.Prefix6)
	}
	t.Run("duplicate takes nothing", func(t *testing.T) {
		if err := s.AddNodes(ctx, []string{"d1", "a1"}, Converged, now); !errors.Is(err, ErrNodeExists) {
			t.Fatal(err)
		}
		if _, err := s.AddNode(ctx, "d1", Converged, now); err != nil {
			t.Fatal(err)
		}
		if got := indexes(); got["d1"] != 5 {
			t.Errorf("d1 took %d, want 5: a refused act moved the counter", got["d1"])
		}
	})
}

// A placement is kept and in the snapshot; a change moves the plans of the
// nodes the application names, the same placement again moves nothing. A
// WireGuard key reported new or changed moves the plans of every node with
// a key; the same key again does not.
func TestStore_Placement(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	now := time.Now()
	if err := s.AddNodes(ctx, []string{"pub1", "nat1", "idle1"}, Converged, now); err != nil {
		t.Fatal(err)
	}
	plans := func() map[string]int64 {
		t.Helper()
		out := map[string]int64{}
		for _, n := range []string{"pub1", "nat1", "idle1"} {
			node, err := s.Node(ctx, n)
			if err != nil {
				t.Fatal(err)
			}
			out[n] = node.PlanVersion
		}
		return out
	}
	p := Placement{Endpoint: "203.0.113.1:51820", Reach: Public}
	var seen [2]Overlay
	moved := func(before, after Overlay) []string {
		seen = [2]Overlay{before, after}
		return []string{"pub1", "nat1"}
	}
	before := plans()
	changed, err := s.SetPlacement(ctx, "pub1", p, moved)
	if err != nil || !changed {
		t.Fatalf("changed %v, %v", changed, err)
	}
	after := plans()
	if after["pub1"] != before["pub1"]+1 || after["nat1"] != before["nat1"]+1 || after["idle1"] != before["idle1"] {
		t.Errorf("plans %v, then %v", before, after)
	}
	if seen[0].Nodes[2].Placement.Reach != "" || seen[1].Nodes[2].Placement != p {
		t.Errorf("the application saw %+v, then %+v", seen[0].Nodes[2], seen[1].Nodes[2])
	}
	if changed, err := s.SetPlacement(ctx, "pub1", p, moved); err != nil || changed {
		t.Fatalf("the same again: changed %v, %v", changed, err)
	}
	if again := plans(); !maps.Equal(again, after) {
		t.Errorf("the same placement moved plans: %v", again)
	}
	if _, err := s.SetPlacement(ctx, "nope", p, moved); !errors.Is(err, ErrNodeNotFound) {
		t.Errorf("unknown node: %v", err)
	}
	snap, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(snap.Overlay.Nodes, func(n OverlayNode) bool { return n.Name == "pub1" })
	if i < 0 || snap.Overlay.Nodes[i].Placement != p {
		t.Errorf("snapshot: %+v", snap.Overlay)
	}

	key := Fact{Name: factWireGuardKey, Value: "PQgYbFGLUB9b7UOnSVANK4FEdbwJx1UzXSydpgMQs5U=", Why: "wg pubkey"}
	if _, err := s.RecordFacts(ctx, "pub1", []Fact{key}, nil, now); err != nil {
		t.Fatal(err)
	}
	b := plans()
	if _, err := s.RecordFacts(ctx, "nat1", []Fact{{Name: factWireGuardKey, Value: "m3mapGBXZdz2eBKeGszGRMOQMbWN0SL9sUkjMnARZGU=", Why: "wg pubkey"}}, nil, now); err != nil {
		t.Fatal(err)
	}
	a := plans()
	if a["pub1"] != b["pub1"]+1 || a["nat1"] != b["nat1"]+1 || a["idle1"] != b["idle1"] {
		t.Errorf("a new key: plans %v, then %v", b, a)
	}
	if _, err := s.RecordFacts(ctx, "pub1", []Fact{key, {Name: "arch", Value: "amd64", Why: "uname -m"}}, nil, now); err != nil {
		t.Fatal(err)
	}
	if again := plans(); !maps.Equal(again, a) {
		t.Errorf("the same key again moved plans: %v, then %v", a, again)
	}
	if snap, _ := s.Snapshot(ctx); snap.Overlay.Nodes[slices.IndexFunc(snap.Overlay.Nodes, func(n OverlayNode) bool { return n.Name == "nat1" })].Key == "" {
		t.Error("the snapshot has no key for nat1")
	}
	// Removing a node of the overlay moves the plans of those with a key.
	before = plans()
	if _, err := s.RemoveNodes(ctx, []string{"nat1"}, nil, 0, now); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"pub1", "idle1"} {
		node, err := s.Node(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		if moved := node.PlanVersion > before[n]; moved != (n == "pub1") {
			t.Errorf("removing nat1: %s's plan moved %v", n, moved)
		}
	}
}

// A new prefix is written as netip writes it, so that text compared with a
// prefix parsed back is the same (a group such as 0506 was once written
// with its leading zero, and one time in a few a test saw two spellings).
func TestNewOverlayPrefix_Canonical(t *testing.T) {
	for range 500 {
		p, err := newOverlayPrefix()
		if err != nil {
			t.Fatal(err)
		}
		parsed, err := netip.ParsePrefix(p)
		if err != nil || parsed.String() != p || parsed.Bits() != 48 || parsed.Addr().As16()[0] != 0xfd {
			t.Fatalf("%q: parsed %v, %v", p, parsed, err)
		}
	}
}

// A WireGuard key another node holds is refused: not recorded as the
// reporter's (the rest of its report is), the holder keeps it, and the
// refusal is kept, naming both, until the reporter reports a key of its
// own. Of two nodes holding one key already (written behind the check),
// the one recorded first keeps it when either reports it again.
func TestStore_KeyRefused(t *testing.T) {
	s, db := newStore(t)
	ctx := context.Background()
	t0 := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	if err := s.AddNodes(ctx, []string{"a1", "b1", "c1"}, Converged, t0); err != nil {
		t.Fatal(err)
	}
	keyA, keyB, keyC := "PQgYbFGLUB9b7UOnSVANK4FEdbwJx1UzXSydpgMQs5U=", "m3mapGBXZdz2eBKeGszGRMOQMbWN0SL9sUkjMnARZGU=", "Xk2cTrWv0n0XRqz4xKMIk1ULJ2dEvU8nPZyEF6VY9mE="
	report := func(node, key string, at time.Time) *KeyRefusal {
		t.Helper()
		r, err := s.RecordFacts(ctx, node, []Fact{{Name: "arch", Value: "amd64", Why: "uname -m"}, {Name: factWireGuardKey, Value: key, Why: "wg"}}, nil, at)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	keys := func() map[string]string {
		t.Helper()
		o, err := s.ReadOverlay(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, n := range o.Nodes {
			out[n.Name] = n.Key
		}
		return out
	}
	refusals := func() []KeyRefusal {
		t.Helper()
		rs, err := s.KeyRefusals(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	plan := func(node string) int64 {
		t.Helper()
		n, err := s.Node(ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		return n.PlanVersion
	}
	for node, key := range map[string]string{"a1": keyA, "b1": keyB, "c1": keyC} {
		if r := report(node, key, t0); r != nil {
			t.Fatalf("%s: refused %+v", node, r)
		}
	}
	before := plan("a1")
	t1 := t0.Add(time.Minute)
	r := report("c1", keyA, t1)
	if r == nil || *r != (KeyRefusal{Node: "c1", Holder: "a1", Key: keyA, Since: t1}) {
		t.Fatalf("refused %+v", r)
	}
	if k := keys(); k["a1"] != keyA || k["c1"] != "" || k["b1"] != keyB {
		t.Fatalf("keys %v", k)
	}
	if facts, _, _ := s.Facts(ctx, "c1"); len(facts) != 1 || facts[0].Name != "arch" {
		t.Errorf("c1's other facts: %+v", facts)
	}
	if plan("a1") != before+1 {
		t.Error("c1's key gone did not move a1's plan, which had c1 as a peer")
	}
	if rs := refusals(); len(rs) != 1 || rs[0] != *r {
		t.Fatalf("kept %+v", rs)
	}
	// Reported again later: still refused, since when kept.
	if r := report("c1", keyA, t1.Add(time.Minute)); r == nil || r.Holder != "a1" {
		t.Fatalf("again: %+v", r)
	}
	if rs := refusals(); len(rs) != 1 || !rs[0].Since.Equal(t1) {
		t.Fatalf("again: kept %+v", rs)
	}
	if plan("a1") != before+1 {
		t.Error("the same refusal again moved a1's plan")
	}
	// The holder reporting its own key is not refused by the refusal.
	if r := report("a1", keyA, t1); r != nil {
		t.Fatalf("a1's own key: %+v", r)
	}
	// A key of its own: taken, the refusal forgotten.
	if r := report("c1", keyC, t1); r != nil || len(refusals()) != 0 || keys()["c1"] != keyC {
		t.Fatalf("its own key: %+v, %+v, %v", r, refusals(), keys())
	}

	// Two holders written behind the check: b1 (recorded after a1) is
	// refused when it reports the key again, a1 keeps it.
	if _, err := db.Writer.ExecContext(ctx, `UPDATE node_facts SET value = ? WHERE node = 'b1' AND name = ?`, keyA, factWireGuardKey); err != nil {
		t.Fatal(err)
	}
	if r := report("a1", keyA, t1); r != nil {
		t.Fatalf("a1, recorded first: %+v", r)
	}
	if r := report("b1", keyA, t1); r == nil || r.Holder != "a1" {
		t.Fatalf("b1, recorded later: %+v", r)
	}
	if k := keys(); k["a1"] != keyA || k["b1"] != "" {
		t.Fatalf("keys %v", k)
	}
	// A node removed takes its refusal with it.
	if _, err := s.RemoveNodes(ctx, []string{"b1"}, nil, 0, t1); err != nil {
		t.Fatal(err)
	}
	if rs := refusals(); len(rs) != 0 {
		t.Fatalf("after removing b1: %+v", rs)
	}
}
