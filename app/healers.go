package app

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

// healer is a named automatic act tied to a condition kind. Healers never
// delete anything.
type healer struct {
	Name string `json:"name"`
	Kind string `json:"kind"`
	What string `json:"what"`
	// act returns a detail that makes the act "once" (an act with the same
	// detail on the same subject is not repeated) and does it.
	detail func(c health.Condition) string
	act    func(ctx context.Context, d *daemon, c health.Condition) error
}

var healers = []healer{
	{Name: "redeclare", Kind: "node.behind", What: "re-send a node that is behind its latest declaration, once per declaration",
		detail: func(c health.Condition) string { return fmt.Sprintf("declaration %v", c.Evidence["serial_declared"]) },
		act:    resendLatest},
	{Name: "retry-apply", Kind: "node.apply-failed", What: "re-send a declaration a node failed to apply, once per declaration, in case the failure passed",
		detail: func(c health.Condition) string { return fmt.Sprintf("declaration %v", c.Evidence["serial"]) },
		act:    resendLatest},
}

func resendLatest(ctx context.Context, d *daemon, c health.Condition) error {
	decl, err := d.inv.LatestDeclaration(ctx, c.Machine)
	if err != nil {
		return err
	}
	if decl == nil {
		return fmt.Errorf("%s has no declaration", c.Machine)
	}
	if err := publishDeclaration(d.nc, *decl); err != nil {
		return err
	}
	return d.nc.FlushTimeout(2 * time.Second)
}

// heal lets each healer act on the open conditions of its kind, each act
// once, unless the brake is engaged; acting past the limits engages it.
func (d *daemon) heal(ctx context.Context, limits HealerLimits) {
	brake, err := d.health.Brake(ctx)
	if err != nil || brake.Engaged {
		return
	}
	open, err := d.health.Conditions(ctx)
	if err != nil {
		return
	}
	now := d.c.Now()
	recent, err := d.health.HealerActs(ctx, now.Add(-max(limits.Window, limits.SameWindow)))
	if err != nil {
		return
	}
	done := map[string]bool{}
	for _, a := range recent {
		done[a.Healer+"|"+a.Subject+"|"+a.Detail] = true
	}
	for _, c := range open {
		for _, h := range healers {
			if h.Kind != c.Kind {
				continue
			}
			detail := h.detail(c)
			if done[h.Name+"|"+c.Key+"|"+detail] {
				continue
			}
			outcome := "done"
			if err := h.act(ctx, d, c); err != nil {
				outcome = "failed: " + err.Error()
			}
			a := health.HealerAct{Healer: h.Name, Subject: c.Key, Condition: c.Key, Detail: detail, Outcome: outcome, At: now}
			if err := d.health.RecordHealerAct(ctx, a); err != nil {
				d.logf("record healer act: %v", err)
				return
			}
			d.logf("healer %s acted on %s (%s): %s", h.Name, c.Key, detail, outcome)
			recent = append(recent, a)
			done[h.Name+"|"+c.Key+"|"+detail] = true
			if why := brakeWhy(recent, limits, now); why != "" {
				if err := d.health.EngageBrake(ctx, why, now); err == nil {
					d.logf("healers' brake engaged: %s", why)
				}
				return
			}
		}
	}
}

// brakeWhy says why the brake must engage, or "".
func brakeWhy(acts []health.HealerAct, l HealerLimits, now time.Time) string {
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

// HealersView is the healers, what they did lately, and the brake.
type HealersView struct {
	Healers []healer           `json:"healers"`
	Acts    []health.HealerAct `json:"acts"`
	Brake   health.Brake       `json:"brake"`
}

// Healers shows the healers, their acts of the last days, and the brake.
func (c *Controller) Healers(ctx context.Context, days int) (HealersView, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return HealersView{}, err
	}
	hs := st.Health
	v := HealersView{Healers: healers}
	if v.Acts, err = hs.HealerActs(ctx, c.Now().Add(-time.Duration(days)*24*time.Hour)); err != nil {
		return v, err
	}
	v.Brake, err = hs.Brake(ctx)
	return v, err
}

// HealersRelease releases an engaged brake: a hand act.
func (c *Controller) HealersRelease(ctx context.Context, why string) error {
	if why == "" {
		return health.ErrNoWhy
	}
	st, err := c.stores(ctx)
	if err != nil {
		return err
	}
	hs := st.Health
	if err := hs.ReleaseBrake(ctx, who(), why, c.Now()); err != nil {
		return err
	}
	_, err = hs.RecordHandAct(ctx, health.HandAct{At: c.Now(), What: "release the healers' brake", Why: why, Cause: "brake", Who: who(), Condition: "healers.brake"})
	return err
}
