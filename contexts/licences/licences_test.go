package licences

import (
	"context"
	"errors"
	"testing"
	"time"

	"mesh-controller/embedded/sqlite/sqlitetest"
)

const (
	keyA = "age1qw9z92zmyjj7ef5qdauyxtg2t7qeanlwt0wsencparm9fryhkdcqyh25r9"
	keyB = "age1sf6dmqte8exkxgmrrmx9ktuj50puhsce07t3uajfvxeyt0430prsd2qsaj"
)

func armor(what string) string { return armorPrefix + "\n" + what + "\n" }

func TestStore_AddUseStopForget(t *testing.T) {
	db, _ := sqlitetest.Open(t, "licences")
	s := NewStore(db)
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	exp := now.Add(30 * 24 * time.Hour)
	l := Licence{Name: "translation", Provider: "deepl", Expires: &exp}
	op := Copy{Kind: KindOperator, OperatorKey: keyA, Sealed: armor("v1 to the operator")}
	if err := s.Add(ctx, l, []Copy{op}, now); err != nil {
		t.Fatal(err)
	}
	t.Run("twice", func(t *testing.T) {
		if err := s.Add(ctx, l, []Copy{op}, now); !errors.Is(err, ErrExists) {
			t.Fatalf("added twice: %v", err)
		}
	})
	t.Run("not armor", func(t *testing.T) {
		plain := Copy{Kind: KindOperator, OperatorKey: keyA, Sealed: "the token itself"}
		if err := s.Add(ctx, Licence{Name: "other", Provider: "p"}, []Copy{plain}, now); !errors.Is(err, ErrNotArmor) {
			t.Fatalf("kept a plaintext: %v", err)
		}
		if _, err := s.Licence(ctx, "other"); !errors.Is(err, ErrNoLicence) {
			t.Fatalf("a refused add left a licence: %v", err)
		}
		hc := Copy{Licence: "translation", Version: 1, Node: "web1", Module: "app", NodeRecipient: keyB, OperatorKey: keyA, Sealed: "plain"}
		if err := s.Use(ctx, hc, now); !errors.Is(err, ErrNotArmor) {
			t.Fatalf("used with a plaintext: %v", err)
		}
	})
	got, err := s.OperatorCopy(ctx, "translation", 0)
	if err != nil || got.Version != 1 || got.Sealed != op.Sealed {
		t.Fatalf("operator copy: %+v, %v", got, err)
	}
	use := func(node string, version int64) error {
		return s.Use(ctx, Copy{Licence: "translation", Version: version, Node: node, Module: "app", NodeRecipient: keyB, OperatorKey: keyA,
			Sealed: armor("v1 to " + node)}, now)
	}
	if err := use("web1", 1); err != nil {
		t.Fatal(err)
	}
	if err := use("web2", 1); err != nil {
		t.Fatal(err)
	}
	if err := use("web1", 1); !errors.Is(err, ErrHeld) {
		t.Fatalf("held twice: %v", err)
	}
	if err := use("web3", 2); !errors.Is(err, ErrVersionMoved) {
		t.Fatalf("sealed from another version: %v", err)
	}
	if err := s.Use(ctx, Copy{Licence: "nosuch", Version: 1, Node: "web1", Module: "app", NodeRecipient: keyB, OperatorKey: keyA, Sealed: armor("x")}, now); !errors.Is(err, ErrNoLicence) {
		t.Fatalf("used an unknown licence: %v", err)
	}
	held, err := s.Held(ctx)
	if err != nil || len(held["web1/app"]) != 1 || len(held["web2/app"]) != 1 {
		t.Fatalf("held: %v, %v", held, err)
	}
	ls, err := s.List(ctx)
	if err != nil || len(ls) != 1 || len(ls[0].Holders) != 2 || ls[0].Expires == nil || !ls[0].Expires.Equal(exp) {
		t.Fatalf("list: %+v, %v", ls, err)
	}
	if err := s.Stop(ctx, "translation", "web1", "app", now); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(ctx, "translation", "web1", "app", now); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("stopped twice: %v", err)
	}
	names, err := s.Forget(ctx, []Holder{{Node: "web2", Module: "app"}, {Node: "web3", Module: "app"}}, now)
	if err != nil || len(names) != 1 || len(names["web2/app"]) != 1 || names["web2/app"][0] != "translation" {
		t.Fatalf("forget: %v, %v", names, err)
	}
	if held, _ := s.Held(ctx); len(held) != 0 {
		t.Fatalf("copies stay after stop and forget: %v", held)
	}
	if by, err := s.SealedTo(ctx); err != nil || by[keyA] != 1 || len(by) != 1 {
		t.Fatalf("sealed to: %v, %v", by, err)
	}
	// The operator's copy is all that is left.
	if cs, _ := s.Copies(ctx, "translation"); len(cs) != 1 || cs[0].Kind != KindOperator {
		t.Fatalf("copies: %+v", cs)
	}
	if _, err := s.OperatorCopy(ctx, "translation", 7); !errors.Is(err, ErrNoCopy) {
		t.Fatalf("version 7: %v", err)
	}
}

func TestStore_ManagerRefreshDiscard(t *testing.T) {
	db, _ := sqlitetest.Open(t, "licences")
	s := NewStore(db)
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	exp := now.Add(time.Hour)
	op := Copy{Kind: KindOperator, OperatorKey: keyA, Sealed: armor("v1 to the operator")}
	rt := Copy{Kind: KindRefresh, OperatorKey: keyA, Sealed: armor("refresh to the operator")}
	if err := s.Add(ctx, Licence{Name: "chat", Provider: "openai", Refreshable: true, Expires: &exp}, []Copy{op, rt}, now); err != nil {
		t.Fatal(err)
	}
	if err := s.Add(ctx, Licence{Name: "plain", Provider: "deepl"}, []Copy{op}, now); err != nil {
		t.Fatal(err)
	}
	mgr := func(licence, node string) Copy {
		return Copy{Licence: licence, Version: 1, Node: node, Module: "mgr", NodeRecipient: keyB, OperatorKey: keyA, Sealed: armor("refresh to " + node)}
	}
	t.Run("not refreshable", func(t *testing.T) {
		if _, err := s.SetManager(ctx, mgr("plain", "a"), now); !errors.Is(err, ErrNotRefreshable) {
			t.Fatalf("a manager for a plain licence: %v", err)
		}
		if _, err := s.RefreshCopy(ctx, "plain"); !errors.Is(err, ErrNotRefreshable) {
			t.Fatalf("a refresh copy of a plain licence: %v", err)
		}
	})
	t.Run("unknown", func(t *testing.T) {
		if _, err := s.SetManager(ctx, mgr("nosuch", "a"), now); !errors.Is(err, ErrNoLicence) {
			t.Fatalf("a manager for no licence: %v", err)
		}
	})
	if before, err := s.SetManager(ctx, mgr("chat", "a"), now); err != nil || before != "" {
		t.Fatalf("manager: %q, %v", before, err)
	}
	if before, err := s.SetManager(ctx, mgr("chat", "b"), now); err != nil || before != "a" {
		t.Fatalf("manager moved: %q, %v", before, err)
	}
	managed, err := s.Managed(ctx)
	if err != nil || len(managed) != 1 || len(managed["b/mgr"]) != 1 {
		t.Fatalf("managed: %v, %v", managed, err)
	}
	if l, _ := s.Licence(ctx, "chat"); l.ManagerNode != "b" || l.ManagerModule != "mgr" {
		t.Fatalf("licence: %+v", l)
	}
	if c, err := s.RefreshCopy(ctx, "chat"); err != nil || c.Sealed != rt.Sealed {
		t.Fatalf("refresh copy: %+v, %v", c, err)
	}
	for _, n := range []string{"c", "d"} {
		if err := s.Use(ctx, Copy{Licence: "chat", Version: 1, Node: n, Module: "app", NodeRecipient: keyB, OperatorKey: keyA, Sealed: armor("v1 to " + n)}, now); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.RefreshFailed(ctx, "chat", now); err != nil {
		t.Fatal(err)
	}
	if f, err := s.Failing(ctx); err != nil || len(f) != 1 || !f["chat"].Equal(now) {
		t.Fatalf("failing: %v, %v", f, err)
	}
	exp2 := now.Add(2 * time.Hour)
	holder := func(n string) Copy {
		return Copy{Kind: KindHolder, Node: n, Module: "app", NodeRecipient: keyB, OperatorKey: keyA, Sealed: armor("v2 to " + n)}
	}
	r := Refreshed{Licence: "chat", From: 1, Expires: &exp2, Operator: Copy{Kind: KindOperator, OperatorKey: keyA, Sealed: armor("v2 to the operator")},
		Holders: []Copy{holder("c"), holder("d")}}
	t.Run("holders moved", func(t *testing.T) {
		moved := r
		moved.Holders = []Copy{holder("c"), holder("e")}
		if _, err := s.Refresh(ctx, moved, now); !errors.Is(err, ErrVersionMoved) {
			t.Fatalf("refreshed for other holders: %v", err)
		}
	})
	if v, err := s.Refresh(ctx, r, now); err != nil || v != 2 {
		t.Fatalf("refresh: %d, %v", v, err)
	}
	if _, err := s.Refresh(ctx, r, now); !errors.Is(err, ErrVersionMoved) {
		t.Fatalf("refreshed from version 1 twice: %v", err)
	}
	if f, _ := s.Failing(ctx); len(f) != 0 {
		t.Fatalf("still failing after a refresh: %v", f)
	}
	l, _ := s.Licence(ctx, "chat")
	if l.Version != 2 || !l.Expires.Equal(exp2) {
		t.Fatalf("after refresh: %+v", l)
	}
	held, _ := s.Held(ctx)
	if len(held["c/app"]) != 1 || held["c/app"][0].Version != 2 || held["c/app"][0].Sealed != armor("v2 to c") {
		t.Fatalf("held after refresh: %+v", held)
	}
	for _, v := range []int64{1, 2} {
		if _, err := s.OperatorCopy(ctx, "chat", v); err != nil {
			t.Fatalf("version %d not recoverable: %v", v, err)
		}
	}
	// Due at 80 % of version 2's life (made now, 2 h): not a minute before;
	// a licence without a manager never.
	if due, err := s.Due(ctx, 0.8, now.Add(95*time.Minute)); err != nil || len(due) != 0 {
		t.Fatalf("due early: %+v, %v", due, err)
	}
	if due, err := s.Due(ctx, 0.8, now.Add(96*time.Minute)); err != nil || len(due) != 1 || due[0].Name != "chat" || due[0].Version != 2 {
		t.Fatalf("due: %+v, %v", due, err)
	}
	// Within the grace period nothing goes; after it version 1's copies
	// go, the refresh token's stay.
	if n, err := s.Discard(ctx, now.Add(GracePeriod-time.Second), 10); err != nil || n != 0 {
		t.Fatalf("discarded early: %d, %v", n, err)
	}
	if n, err := s.Discard(ctx, now.Add(GracePeriod), 10); err != nil || n != 1 {
		t.Fatalf("discard: %d, %v", n, err)
	}
	if n, err := s.Discard(ctx, now.Add(GracePeriod), 10); err != nil || n != 0 {
		t.Fatalf("discarded twice: %d, %v", n, err)
	}
	if _, err := s.OperatorCopy(ctx, "chat", 1); !errors.Is(err, ErrNoCopy) {
		t.Fatalf("version 1 after its grace: %v", err)
	}
	if _, err := s.RefreshCopy(ctx, "chat"); err != nil {
		t.Fatalf("the refresh token was discarded: %v", err)
	}
	if m, _ := s.Managed(ctx); len(m["b/mgr"]) != 1 {
		t.Fatalf("the manager's copy was discarded: %v", m)
	}
	// The manager unassigned: the licence has none, its copy goes, the
	// operator's refresh token stays.
	if _, err := s.Forget(ctx, []Holder{{Node: "b", Module: "mgr"}}, now); err != nil {
		t.Fatal(err)
	}
	if l, _ := s.Licence(ctx, "chat"); l.ManagerNode != "" || l.ManagerModule != "" {
		t.Fatalf("a forgotten manager is still named: %+v", l)
	}
	if m, _ := s.Managed(ctx); len(m) != 0 {
		t.Fatalf("a forgotten manager's copy stays: %v", m)
	}
	if _, err := s.RefreshCopy(ctx, "chat"); err != nil {
		t.Fatalf("the operator's refresh token went with the manager: %v", err)
	}
}
