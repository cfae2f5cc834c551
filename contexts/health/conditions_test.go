package health

import (
	"context"
	"testing"
	"time"

	"mesh-controller/embedded/sqlite/sqlitetest"
)

func TestStore_Reconcile(t *testing.T) {
	db, _ := sqlitetest.Open(t, "health")
	s := NewStore(db)
	ctx := context.Background()
	t0 := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	silent := Condition{Key: "node.silent/web1", Kind: "node.silent", Scope: "machine", Machine: "web1", Severity: Urgent, Summary: "web1 not heard", Evidence: map[string]any{"a": 1}}
	store := Condition{Key: "controller.store/secrets", Kind: "controller.store", Scope: "mesh", Severity: Urgent, Summary: "broken"}
	all := map[string]bool{"node.silent": true, "controller.store": true}
	events := func(chs []Change) (out []string) {
		for _, c := range chs {
			out = append(out, c.Event+" "+c.Condition.Key)
		}
		return out
	}
	chs, err := s.Reconcile(ctx, []Condition{silent, store}, all, t0)
	if err != nil || len(chs) != 2 || chs[0].Event != "raised" {
		t.Fatalf("raise: %v, %v", events(chs), err)
	}
	// The same findings again change nothing.
	if chs, _ = s.Reconcile(ctx, []Condition{silent, store}, all, t0.Add(time.Minute)); len(chs) != 0 {
		t.Fatalf("again: %v", events(chs))
	}
	// New evidence is a change, kept with its raising time.
	silent.Evidence = map[string]any{"a": 2}
	chs, _ = s.Reconcile(ctx, []Condition{silent, store}, all, t0.Add(2*time.Minute))
	if len(chs) != 1 || chs[0].Event != "changed" {
		t.Fatalf("change: %v", events(chs))
	}
	c, err := s.Condition(ctx, silent.Key)
	if err != nil || !c.RaisedAt.Equal(t0) || !c.ChangedAt.Equal(t0.Add(2*time.Minute)) {
		t.Fatalf("condition: %+v, %v", c, err)
	}
	// Not found again: cleared, but only for kinds that were judged.
	chs, _ = s.Reconcile(ctx, nil, map[string]bool{"node.silent": true}, t0.Add(3*time.Minute))
	if len(chs) != 1 || chs[0].Event != "cleared" || chs[0].Condition.Key != silent.Key {
		t.Fatalf("clear: %v", events(chs))
	}
	open, _ := s.Conditions(ctx)
	if len(open) != 1 || open[0].Key != store.Key {
		t.Fatalf("open: %+v", open)
	}
	// Silence: stays listed, marked, and is in the history.
	if _, err := s.Silence(ctx, store.Key, t0.Add(time.Hour), "known", t0.Add(4*time.Minute)); err != nil {
		t.Fatal(err)
	}
	c, _ = s.Condition(ctx, store.Key)
	if !c.Silenced(t0.Add(30*time.Minute)) || c.Silenced(t0.Add(2*time.Hour)) {
		t.Fatalf("silence: %+v", c)
	}
	h, _ := s.History(ctx, "", t0)
	if len(h) != 5 || h[0].Event != "silenced" || h[len(h)-1].Event != "raised" {
		t.Fatalf("history: %v", events(h))
	}
	if _, err := s.Silence(ctx, "nosuch", t0, "x", t0); err == nil {
		t.Fatal("silenced a condition that is not open")
	}
}

func TestStore_Brake(t *testing.T) {
	db, _ := sqlitetest.Open(t, "health")
	s := NewStore(db)
	ctx := context.Background()
	t0 := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	if b, _ := s.Brake(ctx); b.Engaged {
		t.Fatal("engaged from the start")
	}
	if err := s.ReleaseBrake(ctx, "me", "why", t0); err != ErrBrakeNotEngaged {
		t.Fatalf("release of nothing: %v", err)
	}
	s.EngageBrake(ctx, "11 acts", t0)
	if b, _ := s.Brake(ctx); !b.Engaged || b.Why != "11 acts" {
		t.Fatalf("engaged: %+v", b)
	}
	if err := s.ReleaseBrake(ctx, "me", "looked at it", t0); err != nil {
		t.Fatal(err)
	}
	if b, _ := s.Brake(ctx); b.Engaged || b.ReleasedBy != "me" {
		t.Fatalf("released: %+v", b)
	}
}

// The history is bounded per subject, in the transaction that writes it: a
// machine whose findings alternate at every check (as a hostile host's
// reports can make them) keeps HistoryPerSubject rows, its newest, however
// many checks there were and whichever of its conditions changed; another
// machine's rows, and a condition about no machine, keep theirs.
func TestStore_HistoryPerSubject(t *testing.T) {
	db, _ := sqlitetest.Open(t, "health")
	s := NewStore(db)
	ctx := context.Background()
	t0 := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	listeners := Condition{Key: "node.unmanaged-listener/web1", Kind: "node.unmanaged-listener", Scope: "machine", Machine: "web1", Severity: Notice, Summary: "web1 listens"}
	silent := Condition{Key: "node.silent/web1", Kind: "node.silent", Scope: "machine", Machine: "web1", Severity: Urgent, Summary: "web1 not heard"}
	other := Condition{Key: "node.silent/web2", Kind: "node.silent", Scope: "machine", Machine: "web2", Severity: Urgent, Summary: "web2 not heard"}
	store := Condition{Key: "controller.store/secrets", Kind: "controller.store", Scope: "mesh", Severity: Urgent, Summary: "broken"}
	all := map[string]bool{"node.unmanaged-listener": true, "node.silent": true, "controller.store": true}
	rows := func(subject string) (n int) {
		t.Helper()
		if err := db.Reader.QueryRowContext(ctx, `SELECT count(*) FROM condition_history WHERE subject = ?`, subject).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if _, err := s.Reconcile(ctx, []Condition{other, store}, all, t0); err != nil {
		t.Fatal(err)
	}
	checks := 2*HistoryPerSubject + 100
	for i := 1; i <= checks; i++ {
		listeners.Evidence = map[string]any{"count": i % 2, "check": i}
		found := []Condition{listeners, other, store}
		if i%3 == 0 {
			found = append(found, silent) // raised, and cleared at the next check
		}
		if _, err := s.Reconcile(ctx, found, all, t0.Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
		if n := rows("web1"); n > HistoryPerSubject {
			t.Fatalf("after check %d web1 has %d history rows, over %d", i, n, HistoryPerSubject)
		}
	}
	if n := rows("web1"); n != HistoryPerSubject {
		t.Fatalf("web1 has %d history rows, want %d", n, HistoryPerSubject)
	}
	// The newest kept, the oldest gone: the raising is no longer there,
	// the last check's change is.
	h, err := s.History(ctx, listeners.Key, t0)
	if err != nil {
		t.Fatal(err)
	}
	if h[0].Event != "changed" || h[0].Condition.Evidence["check"] != float64(checks) || h[len(h)-1].Event == "raised" {
		t.Fatalf("web1's history runs from %+v to %+v", h[len(h)-1], h[0])
	}
	if rows("web2") != 1 || rows(store.Key) != 1 {
		t.Fatalf("web1's checks took another's history: web2 %d, %s %d", rows("web2"), store.Key, rows(store.Key))
	}
	open, _ := s.Conditions(ctx)
	if len(open) != 3 {
		t.Fatalf("open: %+v", open)
	}
	// A silencing is bounded too, and so is forgetting the machine.
	if _, err := s.Silence(ctx, listeners.Key, t0.Add(time.Hour), "known", t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if n := rows("web1"); n != HistoryPerSubject {
		t.Fatalf("silenced, web1 has %d history rows", n)
	}
	if _, err := s.ForgetMachines(ctx, []string{"web1"}, "removed", nil, t0.Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if n := rows("web1"); n != HistoryPerSubject {
		t.Fatalf("forgotten, web1 has %d history rows", n)
	}
}

// A machine both silent and behind is counted silent only; one behind
// twice over (two conditions naming it) once.
func TestStore_CountSilentBehind(t *testing.T) {
	db, _ := sqlitetest.Open(t, "health")
	s := NewStore(db)
	ctx := context.Background()
	var found []Condition
	for _, c := range [][3]string{{"node.silent", "quiet", ""}, {"node.behind", "quiet", ""}, {"node.behind", "late", ""}, {"node.behind", "late", "/again"}, {"node.apply-failed", "other", ""}} {
		found = append(found, Condition{Key: c[0] + "/" + c[1] + c[2], Kind: c[0], Scope: "machine", Machine: c[1], Severity: Warning, Summary: c[1]})
	}
	if _, err := s.Reconcile(ctx, found, map[string]bool{"node.silent": true, "node.behind": true, "node.apply-failed": true}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if silent, behind, err := s.CountSilentBehind(ctx); err != nil || silent != 1 || behind != 1 {
		t.Fatalf("silent %d, behind %d, %v; want 1 and 1", silent, behind, err)
	}
}
