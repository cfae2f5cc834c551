package daemon

import (
	"context"
	"fmt"
	"time"

	"mesh-controller/contexts/health"
)

// HealerLimits are when the brake engages: more than Acts in Window, or the
// same act on the same subject Same times in SameWindow.
type HealerLimits struct {
	Acts       int
	Window     time.Duration
	Same       int
	SameWindow time.Duration
}

// DefaultHealerLimits are conditions.md's: 10 acts in 10 minutes, or the
// same act on the same subject 3 times in an hour.
func DefaultHealerLimits() HealerLimits {
	return HealerLimits{Acts: 10, Window: 10 * time.Minute, Same: 3, SameWindow: time.Hour}
}

// Healer is a named automatic act tied to a condition kind. Healers never
// delete anything.
type Healer struct {
	Name string `json:"name"`
	Kind string `json:"kind"`
	What string `json:"what"`
	// detail makes the act "once": an act with the same detail on the same
	// subject is not repeated.
	detail func(c health.Condition) string
	act    func(ctx context.Context, d *daemon, c health.Condition) error
}

// Healers are every healer the daemon runs.
var Healers = []Healer{
	{Name: "redeclare", Kind: "node.behind", What: "re-send a node that is behind its latest declaration, once per declaration",
		detail: func(c health.Condition) string { return fmt.Sprintf("declaration %v", c.Evidence["serial_declared"]) },
		act:    resendLatest},
	{Name: "retry-apply", Kind: "node.apply-failed", What: "re-send a declaration a node failed to apply, once per declaration, in case the failure passed",
		detail: func(c health.Condition) string { return fmt.Sprintf("declaration %v", c.Evidence["serial"]) },
		act:    resendLatest},
	{Name: "re-ask", Kind: "build.dead", What: "ask a build no builder answered again, once, under a new id",
		detail: func(c health.Condition) string { return fmt.Sprintf("build %v", c.Evidence["build"]) },
		act: func(ctx context.Context, d *daemon, c health.Condition) error {
			if d.u.Builds == nil {
				return fmt.Errorf("builds are not served here")
			}
			id, _ := c.Evidence["build"].(string)
			if err := d.u.Builds.ReAsk(ctx, id); err != nil {
				return err
			}
			d.kickBuilds()
			return nil
		}},
	// A timed healer: no condition makes its acts due, a clock does
	// (UseCases.Due); its acts count against the brake all the same.
	{Name: "refresh-licence", What: "refresh a licence through its manager at 80 % of its current version's life, once per version (an hour apart if it fails)"},
}

// Due is an act a clock made due rather than a condition (a timed
// healer's): Healer names it, Detail makes it once per subject.
type Due struct {
	Healer, Subject, Detail string
	Act                     func(ctx context.Context) error
}

func resendLatest(ctx context.Context, d *daemon, c health.Condition) error {
	serial, err := SendLatest(ctx, d.st.Inventory, d.nc, c.Machine)
	switch {
	case serial == 0 && err != nil:
		return err
	case serial == 0:
		return fmt.Errorf("%s has no declaration", c.Machine)
	case err != nil:
		return fmt.Errorf("send %s its declaration: %w", c.Machine, err)
	}
	d.o.Metrics.Declared(1)
	return d.nc.FlushTimeout(brokerTimeout)
}

// heal lets each healer act on the open conditions of its kind, each act
// once, unless the brake is engaged; acting past the limits engages it.
// open are the conditions the self-check just left open.
func (d *daemon) heal(ctx context.Context, open []health.Condition) error {
	limits := d.o.Healers
	brake, err := d.st.Health.Brake(ctx)
	if err != nil {
		return fmt.Errorf("read the brake: %w", err)
	}
	if brake.Engaged {
		return nil
	}
	now := d.u.Now()
	recent, err := d.st.Health.HealerActs(ctx, now.Add(-max(limits.Window, limits.SameWindow)))
	if err != nil {
		return fmt.Errorf("read the healers' recent acts: %w", err)
	}
	done := map[string]bool{}
	for _, a := range recent {
		done[a.Healer+"|"+a.Subject+"|"+a.Detail] = true
	}
	// act does one act once, records it, and says whether the brake
	// engaged after it.
	act := func(healer, subject, condition, detail string, do func() error) (bool, error) {
		if done[healer+"|"+subject+"|"+detail] {
			return false, nil
		}
		outcome := "done"
		if err := do(); err != nil {
			outcome = "failed: " + err.Error()
		}
		a := health.HealerAct{Healer: healer, Subject: subject, Condition: condition, Detail: detail, Outcome: outcome, At: now}
		if err := d.st.Health.RecordHealerAct(ctx, a); err != nil {
			return false, fmt.Errorf("record healer %s's act on %s: %w", healer, subject, err)
		}
		d.log.Info("healer acted", "healer", healer, "condition", subject, "detail", detail, "outcome", outcome)
		d.o.Metrics.HealerActed(healer, outcome != "done")
		recent = append(recent, a)
		done[healer+"|"+subject+"|"+detail] = true
		if why := BrakeWhy(recent, limits, now); why != "" {
			if err := d.st.Health.EngageBrake(ctx, why, now); err != nil {
				return false, fmt.Errorf("engage the brake (%s): %w", why, err)
			}
			d.log.Warn("healers' brake engaged", "why", why)
			d.o.Metrics.BrakeEngaged()
			return true, nil
		}
		return false, nil
	}
	for _, c := range open {
		for _, h := range Healers {
			if h.Kind == "" || h.Kind != c.Kind {
				continue
			}
			if braked, err := act(h.Name, c.Key, c.Key, h.detail(c), func() error { return h.act(ctx, d, c) }); braked || err != nil {
				return err
			}
		}
	}
	if d.u.DueActs == nil {
		return nil
	}
	due, err := d.u.DueActs.Due(ctx, d.nc)
	if err != nil {
		return fmt.Errorf("read the acts due: %w", err)
	}
	for _, u := range due {
		if braked, err := act(u.Healer, u.Subject, "", u.Detail, func() error { return u.Act(ctx) }); braked || err != nil {
			return err
		}
	}
	return nil
}

// BrakeWhy says why the brake must engage, or "".
func BrakeWhy(acts []health.HealerAct, l HealerLimits, now time.Time) string {
	inWindow := 0
	same := map[string]int{}
	for _, a := range acts {
		if now.Sub(a.At) <= l.Window {
			inWindow++
		}
		if now.Sub(a.At) <= l.SameWindow {
			same[a.Healer+" on "+a.Subject]++
		}
	}
	if inWindow > l.Acts {
		return fmt.Sprintf("%d healer acts in %s (limit %d)", inWindow, l.Window, l.Acts)
	}
	for what, n := range same {
		if n >= l.Same {
			return fmt.Sprintf("%s %d times in %s", what, n, l.SameWindow)
		}
	}
	return ""
}
