package daemon

import (
	"testing"
	"time"

	"mesh-controller/app/protocol"
	"mesh-controller/contexts/health"
)

// A node's report budget: a burst up to its size passes, the next is
// refused, and the budget refills at its rate; nodes do not share one.
func TestLimiter(t *testing.T) {
	l := limiter{buckets: map[[2]string]*bucket{}}
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	burst, rate := budgets[protocol.Applied][0], budgets[protocol.Applied][1]
	for i := 0; i < int(burst); i++ {
		if !l.allow("web1", protocol.Applied, t0) {
			t.Fatalf("report %d of a burst of %v refused", i+1, burst)
		}
	}
	if l.allow("web1", protocol.Applied, t0) {
		t.Fatal("a report past the burst passed")
	}
	if !l.allow("web2", protocol.Applied, t0) {
		t.Fatal("another node shares web1's budget")
	}
	if !l.allow("web1", protocol.Applied, t0.Add(time.Duration(float64(time.Second)/rate))) {
		t.Fatal("the budget did not refill at its rate")
	}
	if !l.allow("web1", "something-else", t0) {
		t.Fatal("a kind with no budget was refused")
	}
}

// The brake engages past the limits: too many acts in the window, or the
// same act on the same subject too often.
func TestBrakeWhy(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	l := DefaultHealerLimits()
	act := func(subject string, ago time.Duration) health.HealerAct {
		return health.HealerAct{Healer: "redeclare", Subject: subject, At: now.Add(-ago)}
	}
	if why := BrakeWhy([]health.HealerAct{act("a", time.Minute), act("b", time.Minute)}, l, now); why != "" {
		t.Fatalf("two acts engaged it: %s", why)
	}
	var many []health.HealerAct
	for i := 0; i < 11; i++ {
		many = append(many, act(string(rune('a'+i)), time.Minute))
	}
	if why := BrakeWhy(many, l, now); why == "" {
		t.Fatal("11 acts in 10 minutes did not engage it")
	}
	same := []health.HealerAct{act("a", 50*time.Minute), act("a", 30*time.Minute), act("a", time.Minute)}
	if why := BrakeWhy(same, l, now); why == "" {
		t.Fatal("the same act on the same subject 3 times in an hour did not engage it")
	}
	if why := BrakeWhy(same[1:], l, now); why != "" {
		t.Fatalf("twice engaged it: %s", why)
	}
}
