package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"mesh-controller/app"
	"mesh-controller/contexts/builds"
	"mesh-controller/contexts/health"
)

// shellRepo is a local bare git repository of a module whose build is a
// shell command (fast: no compiler), standing on the modules named. Each
// commit of it is made with commit, which returns the new commit's id.
type shellRepo struct {
	t          testing.TB
	bare, work string
	module     string
}

func newShellRepo(t testing.TB, module string) *shellRepo {
	t.Helper()
	base := t.TempDir()
	r := &shellRepo{t: t, bare: filepath.Join(base, module+".git"), work: filepath.Join(base, "work"), module: module}
	git(t, base, "init", "-q", "--bare", "-b", "main", r.bare)
	git(t, base, "init", "-q", "-b", "main", r.work)
	return r
}

// commit writes mesh.json (version, stands_on, build script) and pushes it,
// committed at the time given (so that which commit is newer is known).
func (r *shellRepo) commit(version, script string, at time.Time, standsOn ...string) string {
	r.t.Helper()
	on := ""
	if len(standsOn) > 0 {
		on = `, "stands_on": ["` + strings.Join(standsOn, `", "`) + `"]`
	}
	manifest := `{"module": "` + r.module + `", "version": "` + version + `"` + on + `,
  "build": {"command": ["sh", "-c", ` + jsonString(script) + `], "outputs": ["bin/"], "timeout": "1m"},
  "run": {"command": ["bin/run"]}}`
	if err := os.WriteFile(filepath.Join(r.work, "mesh.json"), []byte(manifest), 0o644); err != nil {
		r.t.Fatal(err)
	}
	git(r.t, r.work, "add", "-A", ".")
	cmd := exec.Command("git", "commit", "-q", "--allow-empty", "-m", r.module+" "+version)
	cmd.Dir = r.work
	stamp := at.Format(time.RFC3339)
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example",
		"GIT_AUTHOR_DATE="+stamp, "GIT_COMMITTER_DATE="+stamp)
	if out, err := cmd.CombinedOutput(); err != nil {
		r.t.Fatalf("git commit: %v\n%s", err, out)
	}
	git(r.t, r.work, "push", "-q", "-f", r.bare, "main")
	out, err := exec.Command("git", "-C", r.work, "rev-parse", "HEAD").Output()
	if err != nil {
		r.t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

// write puts a file in the next commit ("" removes it).
func (r *shellRepo) write(name, body string) {
	r.t.Helper()
	p := filepath.Join(r.work, name)
	if body == "" {
		os.Remove(p)
		return
	}
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		r.t.Fatal(err)
	}
}

func jsonString(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

// okScript builds bin/run, a program that says which build made it.
const okScript = `mkdir -p bin && printf '#!/bin/sh\necho built at %s\nexec sleep 100000\n' "$(date +%s%N)" > bin/run && chmod +x bin/run`

// planSteps says each step's state, as "module:state".
func planSteps(p builds.Plan) string {
	var out []string
	for _, s := range p.Steps {
		out = append(out, s.Module+":"+string(s.State))
	}
	return strings.Join(out, " ")
}

// build --on rebuilds every module standing on a base, directly or not,
// bases first: a step is asked only once the steps it stands on are built;
// each is rebuilt at the commit the mesh built, and its new archive
// replaces the version's.
func TestBuildPlan_OnBaseBasesFirst(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	m.builderOn(t, "b1")
	ctx := context.Background()
	day := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	base, mid, top, aside := newShellRepo(t, "base"), newShellRepo(t, "mid"), newShellRepo(t, "top"), newShellRepo(t, "aside")
	base.commit("1.0.0", okScript, day)
	mid.commit("1.0.0", okScript, day, "base")
	// top stands on base twice over: directly, and through mid.
	top.commit("1.0.0", okScript, day, "mid", "base")
	aside.commit("1.0.0", okScript, day)
	first := map[string]builds.Ask{}
	for _, r := range []*shellRepo{base, mid, top, aside} {
		a, err := m.c.Build(ctx, app.BuildRequest{Repository: r.bare})
		if err != nil {
			t.Fatalf("build %s: %v", r.module, err)
		}
		first[r.module] = a
	}

	var progress []string
	p, err := m.c.BuildPlan(ctx, app.PlanRequest{On: "base", Progress: func(l string) { progress = append(progress, l) }})
	if err != nil {
		t.Fatalf("build --on base: %v\n%s\n%s", err, strings.Join(progress, "\n"), m.logs.String())
	}
	if p.State != builds.PlanDone || planSteps(p) != "mid:done top:done" || strings.Join(p.Steps[1].Bases, ",") != "mid" {
		t.Fatalf("the plan: %s %s %+v", p.State, planSteps(p), p.Steps)
	}
	st, _ := m.c.Stores(ctx)
	midAsk, _ := st.Builds.Get(ctx, p.Steps[0].Ask)
	topAsk, _ := st.Builds.Get(ctx, p.Steps[1].Ask)
	if midAsk.FinishedAt == nil || topAsk.AskedAt.Before(*midAsk.FinishedAt) {
		t.Fatalf("top was asked (%v) before its base mid was built (%v)", topAsk.AskedAt, midAsk.FinishedAt)
	}
	if midAsk.Ref != first["mid"].Commit || midAsk.Plan != p.ID || !midAsk.Registered {
		t.Fatalf("mid's rebuild: %+v", midAsk)
	}
	vs, err := st.Inventory.BuiltVersions(ctx, "mid")
	if err != nil || len(vs) != 1 || vs[0].BuildID != midAsk.ID || vs[0].Archive.Digest != midAsk.Digest || vs[0].Archive.Digest == first["mid"].Digest {
		t.Fatalf("mid 1.0.0 does not hold the rebuilt archive: %+v (first %s) %v", vs, first["mid"].Digest, err)
	}
	if joined := strings.Join(progress, "\n"); !strings.Contains(joined, "top: waiting for mid") {
		t.Errorf("progress did not say top waits for mid:\n%s", joined)
	}

	// Nothing stands on aside: no plan.
	if p, err := m.c.BuildPlan(ctx, app.PlanRequest{On: "aside"}); err != nil || len(p.Steps) != 0 || p.ID != "" {
		t.Fatalf("on aside: %+v %v", p, err)
	}
	// Unknown base: refused, as every command refuses an unknown module.
	if _, err := m.c.BuildPlan(ctx, app.PlanRequest{On: "nosuch"}); err == nil {
		t.Fatal("a plan on an unknown module was made")
	}
}

// build --behind builds what moved, bases first; a failed step stops its
// dependants and fails the plan; retry asks the failed step again; close
// ends it (a hand act). A stands_on cycle is refused, naming it.
func TestBuildPlan_BehindFailureRetryClose(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	m.builderOn(t, "b1")
	ctx := context.Background()
	day := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	base, mid := newShellRepo(t, "base"), newShellRepo(t, "mid")
	base.commit("1.0.0", okScript, day)
	mid.commit("1.0.0", okScript, day, "base")
	for _, r := range []*shellRepo{base, mid} {
		if _, err := m.c.Build(ctx, app.BuildRequest{Repository: r.bare}); err != nil {
			t.Fatal(err)
		}
	}
	if p, err := m.c.BuildPlan(ctx, app.PlanRequest{Behind: true}); err != nil || len(p.Steps) != 0 {
		t.Fatalf("nothing behind: %+v %v", p, err)
	}
	// base moves to a commit that does not build; mid moves too.
	bad := base.commit("1.1.0", "echo the compiler broke >&2; exit 3", day.Add(time.Hour))
	good := mid.commit("1.1.0", okScript, day.Add(time.Hour), "base")
	if err := m.c.ModuleMoved(ctx, "base", bad); err != nil {
		t.Fatal(err)
	}
	if err := m.c.ModuleMoved(ctx, "mid", good); err != nil {
		t.Fatal(err)
	}
	p, err := m.c.BuildPlan(ctx, app.PlanRequest{Behind: true})
	if !errors.Is(err, app.ErrPlanFailed) || !strings.Contains(err.Error(), "base") {
		t.Fatalf("a plan whose base fails: %v", err)
	}
	if p.State != builds.PlanFailed || planSteps(p) != "base:failed mid:stopped" || !strings.Contains(p.Steps[0].Why, "status 3") ||
		!strings.Contains(p.Steps[1].Why, "its base base was not built") || p.Steps[0].Ref != bad {
		t.Fatalf("the failed plan: %s %+v", planSteps(p), p.Steps)
	}
	st, _ := m.c.Stores(ctx)
	if q, _ := st.Builds.Queue(ctx); len(q) != 0 {
		t.Fatalf("mid was asked although its base failed: %+v", q)
	}

	// Mend base's source where the plan looks (the moved commit is the
	// ref: retry builds the same commit, which fails again).
	r, err := m.c.PlanRetry(ctx, p.ID)
	if err != nil || r.State != builds.PlanRunning || planSteps(r) != "base:asked mid:waiting" {
		t.Fatalf("retry: %s %s %v", r.State, planSteps(r), err)
	}
	if _, err := m.c.FollowPlan(ctx, r, func(string) {}); !errors.Is(err, app.ErrPlanFailed) {
		t.Fatalf("the retried plan: %v", err)
	}
	if _, _, err := m.c.PlanStop(ctx, p.ID, "x"); !errors.Is(err, builds.ErrPlanNotRunning) {
		t.Fatalf("stop a failed plan: %v", err)
	}
	if _, err := m.c.PlanClose(ctx, p.ID, ""); err == nil {
		t.Fatal("closed without why")
	}
	c, err := m.c.PlanClose(ctx, p.ID, "base 1.1.0 is abandoned")
	if err != nil || c.State != builds.PlanClosed {
		t.Fatalf("close: %+v %v", c, err)
	}
	acts, _ := st.Health.HandActs(ctx, time.Time{})
	if !slices.ContainsFunc(acts, func(a health.HandAct) bool {
		return strings.Contains(a.What, "close build plan "+p.ID) && a.Why == "base 1.1.0 is abandoned"
	}) {
		t.Errorf("the close is not a hand act: %+v", acts)
	}

	// A cycle: base now stands on mid, which stands on base.
	base.commit("1.2.0", okScript, day.Add(2*time.Hour), "mid")
	if _, err := m.c.Build(ctx, app.BuildRequest{Repository: base.bare}); err != nil {
		t.Fatal(err)
	}
	_, err = m.c.BuildPlan(ctx, app.PlanRequest{On: "mid"})
	if !errors.Is(err, app.ErrStandsOnCycle) || !strings.Contains(err.Error(), "base → mid → base") && !strings.Contains(err.Error(), "mid → base → mid") {
		t.Fatalf("a cycle: %v", err)
	}
}

// Two builds of one module version at once, of two commits: both are
// recorded, and the newer commit's archive is the version's whichever
// build ends first.
func TestBuild_TwoAtOnceNewerCommitWins(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	m.builderOn(t, "b1")
	m.builderOn(t, "b2")
	ctx := context.Background()
	if _, err := m.c.SeatHandover(ctx, app.HandoverRequest{Seat: "build", To: "b2/builder", Add: true}); err != nil {
		t.Fatal(err)
	}
	day := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	r := newShellRepo(t, "twice")
	// One manifest, two commits: the older commit's build is the slower
	// (its source holds "slow"), so it ends last.
	const script = "if [ -f slow ]; then sleep 2; fi; " + okScript
	r.write("slow", "yes")
	older := r.commit("1.0.0", script, day)
	r.write("slow", "")
	newer := r.commit("1.0.0", script, day.Add(time.Minute))
	a1, err := m.c.Build(ctx, app.BuildRequest{Repository: r.bare, Ref: older, NoWait: true})
	if err != nil {
		t.Fatal(err)
	}
	a2, err := m.c.Build(ctx, app.BuildRequest{Repository: r.bare, Ref: newer, NoWait: true})
	if err != nil {
		t.Fatal(err)
	}
	st, _ := m.c.Stores(ctx)
	ended := func(id string) builds.Ask {
		var a builds.Ask
		checkFor(t, settle, func() error {
			a, _ = st.Builds.Get(ctx, id)
			if !a.State.Open() && (a.State != builds.Done || a.Registered) {
				return nil
			}
			return fmt.Errorf("build %s has not ended: %s on %q, registered %v (%s)", id, a.State, a.Builder, a.Registered, a.Why)
		})
		return a
	}
	e1, e2 := ended(a1.ID), ended(a2.ID)
	if e2.State != builds.Done || !e2.Registered || e1.State != builds.Superseded || !strings.Contains(e1.Why, "newer commit") {
		t.Fatalf("older: %s %s on %s; newer: %s registered %v on %s\n%s", e1.State, e1.Why, e1.Builder, e2.State, e2.Registered, e2.Builder, m.logs.String())
	}
	if e1.Builder == e2.Builder {
		t.Fatalf("both built on %s: not at once", e1.Builder)
	}
	vs, _ := st.Inventory.BuiltVersions(ctx, "twice")
	if len(vs) != 1 || vs[0].Commit != newer || vs[0].Archive.Digest != e2.Digest {
		t.Fatalf("twice 1.0.0: %+v, want the newer commit %s", vs, newer)
	}

	// The other order: the newer commit's build ends last, and replaces.
	r2 := newShellRepo(t, "again")
	o2 := r2.commit("1.0.0", script, day)
	r2.write("slow", "yes")
	n2 := r2.commit("1.0.0", script, day.Add(time.Minute))
	b1, _ := m.c.Build(ctx, app.BuildRequest{Repository: r2.bare, Ref: o2, NoWait: true})
	b2, _ := m.c.Build(ctx, app.BuildRequest{Repository: r2.bare, Ref: n2, NoWait: true})
	f1, f2 := ended(b1.ID), ended(b2.ID)
	if !f1.Registered || !f2.Registered {
		t.Fatalf("older then newer: both register (%s, %s)", f1.State, f2.State)
	}
	vs, _ = st.Inventory.BuiltVersions(ctx, "again")
	if len(vs) != 1 || vs[0].Commit != n2 {
		t.Fatalf("again 1.0.0: %+v, want the newer commit %s", vs, n2)
	}
}
