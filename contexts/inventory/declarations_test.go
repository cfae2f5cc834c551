package inventory

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"
)

// TestSaveDeclarations_IfBehind: a request for nodes still behind makes
// nothing for a node whose latest declaration already carries the plan
// version asked (another act declared it), and declares the others: a
// later plan, or a host that applied more than the store ever made.
func TestSaveDeclarations_IfBehind(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	for _, n := range []string{"a", "b", "c"} {
		if _, err := s.AddNode(ctx, n, Converged, now); err != nil {
			t.Fatal(err)
		}
	}
	signs := 0
	sign := func(serial int64, _ time.Time) (string, string, string, error) {
		signs++
		return "{}", "sig", "key", nil
	}
	first := []DeclarationRequest{{Node: "a", PlanVersion: 3, Sign: sign}, {Node: "b", PlanVersion: 3, Sign: sign}, {Node: "c", PlanVersion: 3, Sign: sign}}
	if _, err := s.SaveDeclarations(ctx, first, now); err != nil {
		t.Fatal(err)
	}
	// c's host applied serial 7, which this store never made (a restore).
	if err := s.RecordOutcome(ctx, "c", Outcome{Serial: 7, OK: true, At: now}); err != nil {
		t.Fatal(err)
	}
	signs = 0
	again := []DeclarationRequest{
		{Node: "a", PlanVersion: 3, Sign: sign, IfBehind: true}, // declared already
		{Node: "b", PlanVersion: 4, Sign: sign, IfBehind: true}, // its plan moved on
		{Node: "c", PlanVersion: 3, Sign: sign, IfBehind: true}, // its host is ahead
	}
	ds, err := s.SaveDeclarations(ctx, again, now.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if !ds[0].Declared || ds[0].Serial != 1 {
		t.Errorf("a: got %+v, want nothing made and serial 1 said", ds[0])
	}
	if ds[1].Declared || ds[1].Serial != 2 || ds[1].PlanVersion != 4 {
		t.Errorf("b: got %+v, want serial 2 at plan 4", ds[1])
	}
	if ds[2].Declared || ds[2].Serial != 8 {
		t.Errorf("c: got %+v, want serial 8, above what its host applied", ds[2])
	}
	if signs != 2 {
		t.Errorf("%d signed, want 2: nothing is signed for a node declared already", signs)
	}
	if d, err := s.LatestDeclaration(ctx, "a"); err != nil || d.Serial != 1 {
		t.Errorf("a's latest: %+v, %v; want serial 1 kept", d, err)
	}
}

// TestAnyAhead: the catch-up's one question is true exactly when a node's
// plan moved past its latest declaration or its host applied above it.
func TestAnyAhead(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	ahead := func(want bool, when string) {
		t.Helper()
		if got, err := s.AnyAhead(ctx); err != nil || got != want {
			t.Fatalf("%s: AnyAhead %v, %v; want %v", when, got, err, want)
		}
	}
	ahead(false, "no nodes")
	s.AddNode(ctx, "a", Converged, now)
	ahead(false, "a node with no plan and no declaration")
	if err := s.Apply(ctx, Change{Bump: []string{"a"}}, now); err != nil {
		t.Fatal(err)
	}
	ahead(true, "its plan moved")
	sign := func(int64, time.Time) (string, string, string, error) { return "{}", "s", "k", nil }
	if _, err := s.SaveDeclaration(ctx, "a", CurrentPlan, sign, now); err != nil {
		t.Fatal(err)
	}
	ahead(false, "declared")
	if err := s.RecordOutcome(ctx, "a", Outcome{Serial: 5, OK: true, At: now}); err != nil {
		t.Fatal(err)
	}
	ahead(true, "its host applied a serial this store never made")
}

// TestActUnderWay_Gone: an act whose command's process is gone from this
// machine is under way no more; one alive, or on another machine, is.
func TestActUnderWay_Gone(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	a, err := s.BeginAct(ctx, "assign", now.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	acts, err := s.ActsUnderWay(ctx, now)
	if err != nil || len(acts) != 1 || acts[0].ID != a.ID || acts[0].PID != os.Getpid() {
		t.Fatalf("acts under way: %+v, %v; want this process's", acts, err)
	}
	if acts[0].Gone(a.Host) {
		t.Error("this process's act is said gone")
	}
	ended := exec.Command("true")
	if err := ended.Run(); err != nil {
		t.Fatal(err)
	}
	dead := ActUnderWay{PID: ended.Process.Pid, Host: a.Host}
	if !dead.Gone(a.Host) {
		t.Error("an act whose process ended is not said gone")
	}
	if dead.Gone("another-machine") {
		t.Error("an act on another machine is said gone: its process cannot be seen from here")
	}
	if acts, _ := s.ActsUnderWay(ctx, now.Add(2*time.Minute)); len(acts) != 0 {
		t.Errorf("an act past its time is under way: %+v", acts)
	}
	if err := s.EndAct(ctx, a, now); err != nil {
		t.Fatal(err)
	}
	if acts, _ := s.ActsUnderWay(ctx, now); len(acts) != 0 {
		t.Errorf("an ended act is under way: %+v", acts)
	}
}
