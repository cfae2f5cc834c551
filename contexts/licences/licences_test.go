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
