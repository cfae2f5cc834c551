package inventory

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A host release is kept once per version (the same one again is no
// change, another binary under its version refused), newest first; a
// node's host version is what its host said at join and in its beats (a
// beat that says none leaves it), and its declared release is moved by a
// change, with its plan; the hosts' roll-out is kept beside the modules'.
func TestHostReleases(t *testing.T) {
	s, _ := newStore(t)
	ctx, now := context.Background(), time.Now()
	r := HostRelease{Version: "v0.3.0", Archive: Archive{Digest: "aa", Bytes: 10, UnpackedBytes: 20}, OS: "linux", Arch: "amd64", Who: "ann"}
	for i, want := range []bool{true, false} {
		if added, err := s.AddHostRelease(ctx, r, now); err != nil || added != want {
			t.Fatalf("add %d: added %v, %v", i, added, err)
		}
	}
	other := r
	other.Archive.Digest = "bb"
	if _, err := s.AddHostRelease(ctx, other, now); !errors.Is(err, ErrHostReleaseExists) {
		t.Fatalf("another binary under v0.3.0: %v", err)
	}
	newer := r
	newer.Version, newer.Archive.Digest = "v0.10.0", "cc"
	if _, err := s.AddHostRelease(ctx, newer, now); err != nil {
		t.Fatal(err)
	}
	all, err := s.HostReleases(ctx)
	if err != nil || len(all) != 2 || all[0].Version != "v0.10.0" || all[1].Archive != r.Archive || all[1].Arch != "amd64" {
		t.Fatalf("releases: %+v %v", all, err)
	}

	if _, err := s.AddNode(ctx, "web1", Converged, now); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordJoins(ctx, []Join{{Node: "web1", HostVersion: "v0.2.0"}}, now); err != nil {
		t.Fatal(err)
	}
	hostVersion := func(want string) {
		t.Helper()
		if n, err := s.Node(ctx, "web1"); err != nil || n.HostVersion != want {
			t.Fatalf("host version %q, want %q (%v)", n.HostVersion, want, err)
		}
	}
	hostVersion("v0.2.0")
	if err := s.RecordBeats(ctx, []Beat{{Node: "web1", HeardAt: now, IntervalS: 1}}); err != nil {
		t.Fatal(err)
	}
	hostVersion("v0.2.0")
	if err := s.RecordBeats(ctx, []Beat{{Node: "web1", HeardAt: now, IntervalS: 1, HostVersion: "v0.3.0"}}); err != nil {
		t.Fatal(err)
	}
	hostVersion("v0.3.0")

	before, _ := s.Node(ctx, "web1")
	if err := s.Apply(ctx, Change{HostReleases: []NodeHostRelease{{Node: "web1", Version: "v0.10.0"}}, Bump: []string{"web1"}}, now); err != nil {
		t.Fatal(err)
	}
	snap, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := snap.Nodes["web1"]; n.HostRelease != "v0.10.0" || n.HostVersion != "v0.3.0" || n.PlanVersion <= before.PlanVersion {
		t.Fatalf("declared: %+v", n)
	}
	if snap.HostReleases["v0.10.0"].Archive.Digest != "cc" {
		t.Fatalf("snapshot's releases: %+v", snap.HostReleases)
	}
	if err := s.Apply(ctx, Change{HostReleases: []NodeHostRelease{{Node: "nope", Version: "v0.10.0"}}}, now); !errors.Is(err, ErrNodeNotFound) {
		t.Fatalf("a release declared to no node: %v", err)
	}

	host := RollOut{ID: "h", Kind: RollOutOfHost, Module: HostRollOut, To: "v0.10.0", Batch: "1", Phase: RollOutRunning,
		Nodes: []RollOutNode{{Node: "web1", From: "v0.3.0", Result: "waiting"}}}
	mod := RollOut{ID: "m", Module: "store", To: "2.0.0", Batch: "1", Phase: RollOutRunning}
	for _, ro := range []RollOut{host, mod} {
		if err := s.StartRollOut(ctx, ro, now); err != nil {
			t.Fatal(err)
		}
	}
	if under, err := s.RollOutsUnderWay(ctx); err != nil || len(under) != 2 || under[0] != HostRollOut {
		t.Fatalf("under way: %q %v", under, err)
	}
	if got, ok, err := s.RollOut(ctx, HostRollOut); err != nil || !ok || got.Kind != RollOutOfHost || got.Nodes[0].From != "v0.3.0" {
		t.Fatalf("the hosts' roll-out: %+v %v", got, err)
	}
	if got, _, _ := s.RollOut(ctx, "store"); got.Kind != RollOutOfModule {
		t.Fatalf("a module's roll-out is of kind %q", got.Kind)
	}
	if from, err := s.RollOutFromVersions(ctx); err != nil || len(from[HostRollOut]) != 1 || from[HostRollOut][0] != "v0.3.0" {
		t.Fatalf("from versions: %v %v", from, err)
	}
}
