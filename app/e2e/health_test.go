package e2e

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"mesh-controller/app"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/health"
)

// open says whether the condition key is open.
func (m *testMesh) open(t *testing.T, key string) bool {
	t.Helper()
	return slices.Contains(m.openKeys(t), key)
}

// openKeys are the keys of the open conditions.
func (m *testMesh) openKeys(t *testing.T) []string {
	t.Helper()
	cs, err := m.c.Conditions(context.Background(), app.ConditionFilter{})
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]string, len(cs))
	for i, c := range cs {
		keys[i] = c.Key
	}
	return keys
}

// checkedAfter waits for a self-check that ran after at, and says when
// it ran.
func (m *testMesh) checkedAfter(t *testing.T, at time.Time) time.Time {
	t.Helper()
	var ran time.Time
	checkFor(t, settle, func() error {
		v, err := m.c.DoctorLast(context.Background())
		if err == nil && !v.At.After(at) {
			err = fmt.Errorf("the last self-check ran at %s, not after %s", v.At.Format(time.RFC3339Nano), at.Format(time.RFC3339Nano))
		}
		ran = v.At
		return err
	})
	return ran
}

// restartWith restarts the controller with other serve options.
func (m *testMesh) restartWith(o app.ServeOptions) {
	m.stop()
	m.opts = o
	m.start()
}

// A host stopped: node.silent is raised within its bound, with a message;
// back: it is cleared.
func TestHealth_NodeSilent(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	m.restartWith(app.ServeOptions{CheckEvery: 50 * time.Millisecond, Bounds: &app.Bounds{HeartbeatFactor: 4, Apply: time.Hour, DataReport: time.Hour, RetiredWaiting: time.Hour, Memory: time.Hour}})
	h := m.join("web1")
	checkFor(t, settle, m.beating("web1"))
	if m.open(t, "node.silent/web1") {
		t.Fatal("silent while beating")
	}
	st, err := m.c.Stores(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	nc, err := m.c.DialBroker(context.Background(), st.Identity)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	alerts, err := nc.SubscribeSync(app.AlertSubject)
	if err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	key, err := st.Identity.SigningKey(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	h.stop()
	checkFor(t, settle, m.opened(t, "node.silent/web1"))
	for {
		msg, err := alerts.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("no message on %s for node.silent/web1: %v", app.AlertSubject, err)
		}
		a, err := protocol.OpenAlert(msg.Data, key.Public)
		if err != nil {
			t.Fatalf("an alert that does not verify: %v", err)
		}
		if a.Event == "raised" && strings.Contains(string(a.Condition), `"key":"node.silent/web1"`) {
			break
		}
	}
	if !regexp.MustCompile(`msg="alert raised" condition=node.silent/web1 severity=urgent summary="web1 not heard since `).MatchString(m.logs.String()) {
		t.Fatalf("no message for the raising:\n%s", m.logs.String())
	}
	v, err := m.c.Status(context.Background())
	if err != nil || len(v.Wrong) == 0 || v.Wrong[0].Severity != health.Urgent {
		t.Fatalf("status: %+v, %v", v.Wrong, err)
	}
	quiet := false
	for _, s := range v.Quiet {
		quiet = quiet || s.Name == "heartbeat/web1"
	}
	if !quiet {
		t.Fatalf("status does not call web1's heartbeat quiet: %+v", v.Quiet)
	}
	h.start()
	checkFor(t, settle, m.cleared(t, "node.silent/web1"))
	hist, _ := m.c.ConditionsHistory(context.Background(), 1, "node.silent/web1")
	if len(hist) < 2 || hist[0].Event != "cleared" {
		t.Fatalf("history: %+v", hist)
	}
}

// A healer acting past the bound engages the brake, raises healers.brake,
// and no healer acts until a person releases it.
func TestHealth_HealersBrake(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	h := m.join("web1")
	checkFor(t, settle, m.heard("web1"))
	h.stop() // so every declaration stays unapplied: node.behind
	m.restartWith(app.ServeOptions{CheckEvery: 50 * time.Millisecond,
		Bounds:  &app.Bounds{HeartbeatFactor: 1000, Apply: 10 * time.Millisecond, DataReport: time.Hour, RetiredWaiting: time.Hour, Memory: time.Hour},
		Healers: app.HealerLimits{Acts: 1, Window: time.Hour, Same: 100, SameWindow: time.Hour}})
	ctx := context.Background()
	acts := func() []health.HealerAct {
		v, err := m.c.Healers(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		return v.Acts
	}
	m.declare("web1", `{"modules": []}`)
	actsAre := func(n int) func() error {
		return func() error {
			if got := acts(); len(got) != n {
				return fmt.Errorf("%d healer acts, not %d: %s", len(got), n, jsonText(got))
			}
			return nil
		}
	}
	checkFor(t, settle, actsAre(1))
	if a := acts()[0]; a.Healer != "redeclare" || a.Subject != "node.behind/web1" || a.Outcome != "done" {
		t.Fatalf("act: %+v", a)
	}
	m.declare("web1", `{"modules": []}`)
	checkFor(t, settle, m.opened(t, "healers.brake"))
	if n := len(acts()); n != 2 {
		t.Fatalf("%d acts, want 2", n)
	}
	m.declare("web1", `{"modules": []}`)
	// Two self-checks after declaration 3 is behind: healers run after each; none may act.
	behindAt := time.Now().Add(10 * time.Millisecond)
	m.checkedAfter(t, m.checkedAfter(t, behindAt))
	if n := len(acts()); n != 2 {
		t.Fatalf("a healer acted with the brake engaged: %d acts", n)
	}
	if err := m.c.HealersRelease(ctx, "looked at web1: it is off for maintenance"); err != nil {
		t.Fatal(err)
	}
	checkFor(t, settle, actsAre(3))
	hand, _ := m.c.HandActs(ctx, 1)
	if len(hand.Acts) == 0 || hand.Acts[0].Cause != "brake" {
		t.Fatalf("the release is not a hand act: %+v", hand.Acts)
	}
}
