package app

import (
	"context"
	"fmt"
	"strings"
	"time"

	"mesh-controller/contexts/identity"
)

// ControllerView is one controller: the one serving, or one standing by.
type ControllerView struct {
	PID  int    `json:"pid"`
	Host string `json:"host"`
	// Generation is the serving controller's lease generation.
	Generation int64 `json:"generation,omitempty"`
	// Until is when its lease (or its standing by) lapses unless renewed.
	Until time.Time `json:"until"`
	// Since is when a standby began to wait.
	Since *time.Time `json:"since,omitempty"`
	// Version is its build version, "" when it records none (a controller
	// older than v0.3.0).
	Version string `json:"version,omitempty"`
	// Aside says why a standby stands aside, never to take the lease
	// (the stores are newer than it knows); absent while it stands by.
	Aside string `json:"aside,omitempty"`
}

// shownVersion is a controller's version as the line says it.
func (v ControllerView) shownVersion() string {
	if v.Version == "" {
		return "an older mesh-controller"
	}
	return "mesh-controller " + v.Version
}

// ControllersView says which controller serves and which stand by.
type ControllersView struct {
	Serving    *ControllerView  `json:"serving"`
	StandingBy []ControllerView `json:"standing_by"`
}

// String is the one line broker show and doctor print.
func (v ControllersView) String() string {
	var parts []string
	if s := v.Serving; s != nil {
		parts = append(parts, fmt.Sprintf("pid %d on %s serves (lease generation %d, until %s, %s)", s.PID, s.Host, s.Generation, s.Until.UTC().Format(time.RFC3339), s.shownVersion()))
	} else {
		parts = append(parts, "no controller serves")
	}
	if len(v.StandingBy) == 0 {
		parts = append(parts, "none stands by")
	}
	for _, sb := range v.StandingBy {
		if sb.Aside != "" {
			parts = append(parts, fmt.Sprintf("pid %d on %s stands aside (%s): %s", sb.PID, sb.Host, sb.shownVersion(), sb.Aside))
			continue
		}
		parts = append(parts, fmt.Sprintf("pid %d on %s stands by (since %s, %s)", sb.PID, sb.Host, sb.Since.UTC().Format(time.RFC3339), sb.shownVersion()))
	}
	return strings.Join(parts, "; ")
}

// Controllers says which controller serves now and which stand by.
func (c *Health) Controllers(ctx context.Context) (ControllersView, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return ControllersView{}, err
	}
	return controllersOf(ctx, st.Identity, c.Now())
}

// controllersOf reads the live lease and the standbys heard lately.
func controllersOf(ctx context.Context, ids *identity.Store, now time.Time) (ControllersView, error) {
	v := ControllersView{StandingBy: []ControllerView{}}
	l, err := ids.Lease(ctx)
	if err != nil {
		return v, err
	}
	if l != nil && l.ExpiresAt.After(now) {
		v.Serving = &ControllerView{PID: l.PID, Host: l.Host, Generation: l.Generation, Until: l.ExpiresAt, Version: l.Version}
	}
	sbs, err := ids.Standbys(ctx, now)
	if err != nil {
		return v, err
	}
	for _, sb := range sbs {
		v.StandingBy = append(v.StandingBy, ControllerView{PID: sb.PID, Host: sb.Host, Until: sb.ExpiresAt, Since: &sb.Since, Version: sb.Version, Aside: sb.Aside})
	}
	return v, nil
}
