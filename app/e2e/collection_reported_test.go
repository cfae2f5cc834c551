package e2e

import (
	"context"
	"fmt"
	"mesh-controller/app"
	"slices"
	"strings"
	"testing"
	"time"
)

// What the collection says runs where is what hosts report (issue 30, what
// a new user hit, 4): after a rebuild replaced a version's archive, the old
// archive still runs on the node that has not been sent the new one, and
// is kept; once the node runs the new archive, the old runs nowhere. Before,
// the old archive was said to run nowhere while the node ran it, and node
// list called that node current.
func TestCollection_RunsWhatHostsReport(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	m.builderOn(t, "b1")
	m.join("web1")
	ctx := context.Background()
	r := newShellRepo(t, "kept")
	r.commit("1.0.0", okScript, time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	first, err := m.c.Build(ctx, app.BuildRequest{Repository: r.bare})
	if err != nil {
		t.Fatal(err)
	}
	m.assign(t, "web1", "kept")
	running := func(digest string) error {
		s := m.moduleState("web1", "kept")
		if s.Archive != digest || s.Pid == 0 {
			return fmt.Errorf("web1 reports kept %s from archive %q (pid %d), want %s", s.Version, s.Archive, s.Pid, digest)
		}
		return nil
	}
	runsOn := func(digest string) []string {
		t.Helper()
		col, err := m.c.Collection(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range col.Archives {
			if k.Digest == digest {
				return k.RunOn
			}
		}
		t.Fatalf("archive %s is not kept", digest)
		return nil
	}
	checkFor(t, settle, func() error { return running(first.Digest) })
	again, err := m.c.Rebuild(ctx, "kept", app.BuildRequest{})
	if err != nil || !again.Registered || again.Digest == first.Digest {
		t.Fatalf("the rebuild: %+v %v", again, err)
	}
	if on := runsOn(first.Digest); !slices.Equal(on, []string{"web1"}) {
		t.Fatalf("the replaced archive, which web1 still runs, is said to run on %v", on)
	}
	if v := m.node("web1"); !v.Behind || !strings.Contains(v.BehindWhy, "a rebuilt archive") {
		t.Fatalf("web1 runs the replaced archive yet is not behind: %+v", v)
	}
	if _, err := m.c.Push(ctx, app.PushRequest{Behind: true}); err != nil {
		t.Fatal(err)
	}
	checkFor(t, settle, func() error { return running(again.Digest) })
	if on := runsOn(first.Digest); len(on) != 0 {
		t.Fatalf("the replaced archive runs on %v after web1 moved to the new one", on)
	}
	if on := runsOn(again.Digest); !slices.Equal(on, []string{"web1"}) {
		t.Fatalf("the new archive runs on %v", on)
	}
}
