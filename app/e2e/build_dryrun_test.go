package e2e

import (
	"context"
	"fmt"
	"mesh-controller/app"
	"strings"
	"testing"
	"time"
)

// A dry run is looked at, never taken in: serve's log says so (not "taken
// in by serve") and its time is not counted among build durations; a
// build's duration is from its ask to its outcome heard (issue 30, what a
// new user hit, 8).
func TestBuild_DryRunIsNotABuild(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	m.builderOn(t, "b1")
	ctx := context.Background()
	asked := time.Now()
	// A script, not a Go program: what is judged is the log and the
	// durations, not a compiler's (two cold go builds took 80 s of make test).
	first, err := m.c.Build(ctx, app.BuildRequest{Repository: scriptRepo(t, "greeter", "mkdir -p bin && echo greeter > bin/x")})
	if err != nil {
		t.Fatal(err)
	}
	heard := time.Since(asked)
	dry, err := m.c.Replay(ctx, first.ID, false, false, "", app.BuildRequest{})
	if err != nil || !dry.DryRun {
		t.Fatalf("dry run: %+v %v", dry, err)
	}
	st, err := m.c.Stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	checkFor(t, settle, func() error {
		l := m.logLine("build " + dry.ID + " of ")
		if !strings.Contains(l, "a dry run, done") || !strings.Contains(l, "looked at, nothing registered") {
			return fmt.Errorf("serve does not say it looked at the dry run: %q", l)
		}
		return nil
	})
	ds, err := st.Health.Durations(ctx, "build", asked.Add(-time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 1 {
		t.Fatalf("build durations %+v: want the first build's alone", ds)
	}
	// Asked to heard: at least the builder's own part, at most what the
	// command waited.
	if ms := ds[0].MS; ms < float64(first.DurationMS) || ms > float64(heard.Milliseconds())+1000 {
		t.Fatalf("the build's duration is %.0f ms; the builder took %.0f ms and the command waited %s", ms, first.DurationMS, heard)
	}
}
