package identity

import (
	"context"
	"errors"
	"testing"
	"time"

	"mesh-controller/embedded/sqlite"
)

// Each take of the lease is a new generation, one above any before, even
// after the lease was given back; a live lease is refused to another
// holder; and once taken over, the deposed holder's renewal is refused by
// the store's fence, whatever its process believes.
func TestStore_LeaseGenerations(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	take := func(holder string, at time.Time) (Lease, error) {
		return s.TakeLease(ctx, Lease{Holder: holder, PID: 1, Host: "h", ExpiresAt: at.Add(10 * time.Second)}, at)
	}
	a, err := take("a", now)
	if err != nil || a.Generation != 1 {
		t.Fatalf("first take: generation %d, %v", a.Generation, err)
	}
	if err := s.ReleaseLease(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if a, err = take("a", now); err != nil || a.Generation != 2 {
		t.Fatalf("taken again after giving it back: generation %d, %v (want 2: generations are never issued twice)", a.Generation, err)
	}

	t.Run("held", func(t *testing.T) {
		_, err := take("b", now.Add(9*time.Second))
		var held *LeaseHeldError
		if !errors.As(err, &held) || held.Lease.Holder != "a" || held.Lease.Generation != 2 {
			t.Fatalf("got %v, want a's live lease named", err)
		}
	})

	t.Run("deposed", func(t *testing.T) {
		b, err := take("b", now.Add(11*time.Second))
		if err != nil || b.Generation != 3 {
			t.Fatalf("take over a lapsed lease: generation %d, %v", b.Generation, err)
		}
		// a was paused past its lease: its renewal, carrying generation
		// 2, is refused by the fence, not by the lease row alone.
		err = s.RenewLease(sqlite.WithFence(ctx, a.Generation), "b", now.Add(time.Minute), "")
		var fenced *sqlite.FencedError
		if !errors.Is(err, ErrLeaseLost) || !errors.As(err, &fenced) || fenced.Mine != 2 || fenced.Fence != 3 {
			t.Fatalf("a deposed controller's renewal: %v", err)
		}
		if err := s.RenewLease(sqlite.WithFence(ctx, b.Generation), "b", now.Add(time.Minute), "nats://x"); err != nil {
			t.Fatalf("the holder's renewal: %v", err)
		}
		if l, _ := s.Lease(ctx); l.Holder != "b" || l.Generation != 3 || l.BrokerURL != "nats://x" {
			t.Fatalf("lease %+v", l)
		}
	})
}

// Standbys are listed while heard, and forgotten once they take the lease.
func TestStore_Standbys(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	for _, h := range []string{"x", "y"} {
		if err := s.StandBy(ctx, Standby{Holder: h, PID: 7, Host: "h", Since: now, ExpiresAt: now.Add(10 * time.Second)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.StandBy(ctx, Standby{Holder: "x", PID: 7, Host: "h", Since: now, ExpiresAt: now.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if sbs, err := s.Standbys(ctx, now.Add(30*time.Second)); err != nil || len(sbs) != 1 || sbs[0].Holder != "x" {
		t.Fatalf("after y lapsed: %+v, %v", sbs, err)
	}
	if _, err := s.TakeLease(ctx, Lease{Holder: "x", ExpiresAt: now.Add(time.Minute)}, now); err != nil {
		t.Fatal(err)
	}
	if sbs, err := s.Standbys(ctx, now); err != nil || len(sbs) != 1 || sbs[0].Holder != "y" {
		t.Fatalf("after x took the lease: %+v, %v", sbs, err)
	}
}
