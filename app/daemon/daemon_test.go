package daemon

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"mesh-controller/app/protocol"
	"mesh-controller/contexts/health"
	"mesh-controller/contexts/inventory"
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

// The loop absorbs the events waiting behind the one it took, up to a
// bound, before it looks at its timers again: a self-check slower than
// its period, always due, once starved heartbeats one event a turn, until
// nodes that beat looked silent (CI failed so under the race detector).
func TestAbsorbWaiting_TakesWhatWaitsUpToABound(t *testing.T) {
	d := &daemon{logger: &logger{log: slog.New(slog.DiscardHandler)}, events: make(chan *event, absorbBatch+10), beats: map[string]inventory.Beat{}, lastBeat: map[string]time.Time{},
		intervals: map[health.HourKey]health.Histogram{}, peers: map[string]map[string]*peerState{}, moduleStates: map[string]string{},
		modulesDue: map[string][]health.ModuleState{}, lastState: map[string]string{}, readyFor: map[string]int64{}, drops: map[[2]string]int64{},
		statesAt: map[string]time.Time{}}
	t0 := time.Date(2026, 12, 1, 6, 0, 0, 0, time.UTC)
	beat := func(i int) *event {
		return &event{kind: evBeat, node: "web1", at: t0.Add(time.Duration(i) * time.Millisecond)}
	}
	for i := 1; i < 20; i++ {
		d.events <- beat(i)
	}
	if d.absorbWaiting(context.Background(), beat(0)) {
		t.Fatal("heartbeats of a node that runs nothing, already reported, called for a self-check")
	}
	if len(d.events) != 0 || !d.beats["web1"].HeardAt.Equal(t0.Add(19*time.Millisecond)) {
		t.Fatalf("%d events left waiting; the heartbeat to write is of %s", len(d.events), d.beats["web1"].HeardAt)
	}

	d.events <- &event{kind: evDrop, node: "web1", reason: "too many heartbeat reports"}
	if !d.absorbWaiting(context.Background(), beat(20)) {
		t.Fatal("a drop waiting behind a heartbeat did not call for a self-check")
	}

	for i := 0; i < absorbBatch+5; i++ {
		d.events <- beat(100 + i)
	}
	d.absorbWaiting(context.Background(), beat(99))
	if len(d.events) != 6 {
		t.Fatalf("%d events left waiting after one turn, want 6: a turn takes %d", len(d.events), absorbBatch)
	}
}

// An apply report's module states, kept by the outcome writer beside the
// beats, may be handed to the loop after a later beat: states the host
// read before the last beat's are dropped, so a module that became ready
// is not put back to starting (a roll-out's soak failed a node so, under
// load); a report read after the beat, or from a host that does not say
// when, is taken.
func TestAbsorbModules_ReportOlderThanTheLastBeatIsDropped(t *testing.T) {
	d := &daemon{logger: &logger{log: slog.New(slog.DiscardHandler)}, beats: map[string]inventory.Beat{}, lastBeat: map[string]time.Time{}, peers: map[string]map[string]*peerState{},
		moduleStates: map[string]string{}, modulesDue: map[string][]health.ModuleState{}, lastState: map[string]string{},
		readyFor: map[string]int64{}, statesAt: map[string]time.Time{}}
	t0 := time.Date(2026, 12, 1, 6, 0, 0, 0, time.UTC)
	state := func(s string) []protocol.ModuleState {
		return []protocol.ModuleState{{Module: "store", Version: "2.0.0", State: s, Pid: 42, Since: t0}}
	}
	ctx := context.Background()
	d.absorb(ctx, event{kind: evBeat, node: "db2", at: t0.Add(2 * time.Second), beat: protocol.HeartbeatBody{At: t0.Add(2 * time.Second), Modules: state(protocol.StateReady)}})
	d.absorb(ctx, event{kind: evModules, node: "db2", at: t0.Add(3 * time.Second), hostAt: t0.Add(time.Second), modules: state(protocol.StateStarting)})
	if got := d.modulesDue["db2"][0].State; got != protocol.StateReady {
		t.Fatalf("a report read before the last beat was taken: the state to write is %s", got)
	}
	d.absorb(ctx, event{kind: evModules, node: "db2", at: t0.Add(4 * time.Second), hostAt: t0.Add(3 * time.Second), modules: state(protocol.StateFailed)})
	if got := d.modulesDue["db2"][0].State; got != protocol.StateFailed {
		t.Fatalf("a report read after the last beat was dropped: the state to write is %s", got)
	}
	d.absorb(ctx, event{kind: evModules, node: "db2", at: t0.Add(5 * time.Second), modules: state(protocol.StateStarting)})
	if got := d.modulesDue["db2"][0].State; got != protocol.StateStarting {
		t.Fatalf("a report from a host that does not say when was dropped: the state to write is %s", got)
	}
}
