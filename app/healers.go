package app

import (
	"context"
	"time"

	"mesh-controller/app/daemon"
	"mesh-controller/contexts/health"
)

// HealerLimits are when the healers' brake engages (daemon.HealerLimits).
type HealerLimits = daemon.HealerLimits

// DefaultHealerLimits are conditions.md's: 10 acts in 10 minutes, or the
// same act on the same subject 3 times in an hour.
func DefaultHealerLimits() HealerLimits { return daemon.DefaultHealerLimits() }

// HealersView is the healers, what they did lately, and the brake.
type HealersView struct {
	Healers []daemon.Healer    `json:"healers"`
	Acts    []health.HealerAct `json:"acts"`
	Brake   health.Brake       `json:"brake"`
}

// Healers shows the healers, their acts of the last days, and the brake.
func (c *Health) Healers(ctx context.Context, days int) (HealersView, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return HealersView{}, err
	}
	hs := st.Health
	v := HealersView{Healers: daemon.Healers}
	if v.Acts, err = hs.HealerActs(ctx, c.Now().Add(-time.Duration(days)*24*time.Hour)); err != nil {
		return v, err
	}
	v.Brake, err = hs.Brake(ctx)
	return v, err
}

// HealersRelease releases an engaged brake: a hand act.
func (c *Health) HealersRelease(ctx context.Context, why string) error {
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
