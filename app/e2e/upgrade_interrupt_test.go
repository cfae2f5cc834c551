package e2e

import (
	"context"
	"errors"
	"mesh-controller/app"
	"strings"
	"testing"
	"time"
)

// A roll-out interrupted (Ctrl-C: its context ends) says where it stopped
// and how to go on, not only "context canceled" (issue 30, what a new user
// hit, 3): db1 moved and ready, db2 sent and never heard (its host is
// stopped), db3 not sent.
func TestUpgrade_InterruptedSaysWhereItStopped(t *testing.T) {
	t.Parallel()
	m, hosts := upgradeMesh(t, "db1", "db2", "db3")
	hosts[1].stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err := m.c.Upgrade(ctx, app.UpgradeRequest{Module: "store", Action: "roll-out", Wait: time.Minute, Progress: func(s string) {
		// Interrupted while it waits for db2, whose host is stopped.
		if strings.HasPrefix(s, "db2 sent declaration") {
			cancel()
		}
	}})
	if !errors.Is(err, app.ErrRollOutInterrupted) || !errors.Is(err, context.Canceled) {
		t.Fatalf("an interrupted roll-out said %v", err)
	}
	for _, want := range []string{
		"store 2.0.0 runs on 1 node of 3: db1;",
		"sent, not yet heard ready (their hosts go on applying it): db2 (declaration ",
		"not sent yet: db3;",
		"the serving controller goes on with it: follow it with 'mesh-controller upgrade store show'",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the interruption does not say %q: %v", want, err)
		}
	}
}
