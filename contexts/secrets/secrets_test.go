package secrets

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

func TestStore_KeepAndCount(t *testing.T) {
	db, _ := sqlitetest.Open(t, "secrets")
	s := NewStore(db)
	ctx := context.Background()
	now := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	seal := func(version int64, key string) (string, error) {
		return "-----BEGIN AGE ENCRYPTED FILE-----\nv" + string(rune('0'+version)) + " to " + key + "\n", nil
	}
	c := Copy{Node: "web1", Module: "paperless", Name: "ocr_licence", MadeBy: "person", NodeRecipient: keyB}
	if _, err := s.Keep(ctx, c, "accepted", seal, now); !errors.Is(err, ErrNoOperatorKey) {
		t.Fatalf("kept with no operator key: %v", err)
	}
	if _, err := s.SetOperatorKey(ctx, keyA, false, now); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetOperatorKey(ctx, keyB, false, now); !errors.Is(err, ErrOperatorKeySet) {
		t.Fatalf("second key: %v", err)
	}
	k1, err := s.Keep(ctx, c, "accepted", seal, now)
	if err != nil || k1.Version != 1 || k1.OperatorKey != keyA {
		t.Fatalf("first: %+v, %v", k1, err)
	}
	k2, _ := s.Keep(ctx, c, "accepted", seal, now)
	if k2.Version != 2 {
		t.Fatalf("versions do not grow: %d", k2.Version)
	}
	got, err := s.Copy(ctx, "web1", "paperless", "ocr_licence")
	if err != nil || got.Version != 2 || got.Sealed != k2.Sealed {
		t.Fatalf("copy: %+v, %v", got, err)
	}
	if _, err := s.SetOperatorKey(ctx, keyB, true, now); err != nil {
		t.Fatal(err)
	}
	if cur, older, _ := s.Recoverable(ctx); cur != 0 || older != 1 {
		t.Fatalf("recoverable %d, only older %d", cur, older)
	}
	if held, _ := s.Held(ctx, "paperless"); len(held) != 1 || held[0].Node != "web1" {
		t.Fatalf("held: %v", held)
	}
	if err := s.Forget(ctx, "web1", "paperless", now); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Copy(ctx, "web1", "paperless", "ocr_licence"); !errors.Is(err, ErrNoSecret) {
		t.Fatalf("after forget: %v", err)
	}
	// The history goes on: a new copy after forgetting is version 3, not 1.
	k3, _ := s.Keep(ctx, c, "accepted", seal, now)
	if k3.Version != 3 {
		t.Fatalf("after forget, version %d", k3.Version)
	}
	// Only ciphertext is kept: the store refuses anything that is not age armor.
	bad := func(int64, string) (string, error) { return "plain value", nil }
	if _, err := s.Keep(ctx, c, "accepted", bad, now); err == nil {
		t.Fatal("the store kept something that is not age ciphertext")
	}
}
