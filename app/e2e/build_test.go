package e2e

import (
	"github.com/nats-io/nats.go"

	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"mesh-controller/app"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/builds"
)

// buildBuilder builds mesh-builder once per test binary.
func buildBuilder(t testing.TB) string {
	return buildProgram(t, "mesh-builder", "../../cmd/mesh-builder")
}

// git runs git in dir, failing the test when it fails.
func git(t testing.TB, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
}

// greeterRepo makes a local bare git repository holding a small Go program
// (no dependencies) that listens on port and a mesh.json that builds it
// with go build. A build runs in a sandbox of its own, as a user of its
// own: no cache carries over (a build could plant something in the next),
// so each compiles what it uses of the standard library afresh.
func greeterRepo(t testing.TB, version string, port int) string {
	t.Helper()
	base := t.TempDir()
	bare, work := filepath.Join(base, "greeter.git"), filepath.Join(base, "work")
	git(t, base, "init", "-q", "--bare", "-b", "main", bare)
	git(t, base, "init", "-q", "-b", "main", work)
	files := map[string]string{
		"go.mod": "module greeter\n\ngo 1.22\n",
		"main.go": `package main

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ln, err := net.Listen("tcp", "127.0.0.1:` + fmt.Sprint(port) + `")
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	fmt.Println("greeter ` + version + ` listening on", ln.Addr())
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(c, "hello from greeter ` + version + `")
			c.Close()
		}
	}()
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM)
	<-stop
}
`,
		"mesh.json": `{"module": "greeter", "version": "` + version + `",
  "build": {"command": ["go", "build", "-o", "bin/greeter", "."], "outputs": ["bin/"], "timeout": "5m",
            "env": {"CGO_ENABLED": "0", "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local"}},
  "run": {"command": ["bin/greeter"], "ready": {"port": "http"}},
  "ports": [{"name": "http", "port": ` + fmt.Sprint(port) + `}]}
`,
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(work, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git(t, work, "add", ".")
	git(t, work, "commit", "-q", "-m", "greeter "+version)
	git(t, work, "push", "-q", bare, "main")
	return bare
}

// builderOn joins a host that runs mesh-builder as the builder module,
// holding the build seat, and waits until it is ready.
func (m *testMesh) builderOn(t testing.TB, node string) *testHost {
	t.Helper()
	return m.builderWith(t, node, nil)
}

// The loop closed: a repository built by a real builder module on a real
// host (git clone, go build, an archive through the broker's object store),
// the version registered with its commit and archive, assigned to another
// host, which fetches the archive, verifies it, unpacks it and runs the
// built program until it is ready.
func TestBuild_SourceToRunningModule(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	m.builderOn(t, "b1")
	web1 := m.join("web1")
	_, portText, _ := strings.Cut(freeAddr(t), ":")
	var port int
	fmt.Sscan(portText, &port)
	repo := greeterRepo(t, "1.0.0", port)
	ctx := context.Background()

	var progress []string
	asked := time.Now()
	a, err := m.c.Build(ctx, app.BuildRequest{Repository: repo, Progress: func(l string) { progress = append(progress, l) }})
	t.Logf("ask -> registered: %s (git clone, go build with a warm cache, archive stored)", time.Since(asked).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("build: %v\n%s\n%s", err, strings.Join(progress, "\n"), m.logs.String())
	}
	if a.State != builds.Done || !a.Registered || a.Module != "greeter" || a.Version != "1.0.0" || len(a.Commit) != 40 || a.Digest == "" {
		t.Fatalf("the build: %+v", a)
	}
	if joined := strings.Join(progress, "\n"); !strings.Contains(joined, "taken by b1/builder") {
		t.Errorf("progress did not say who took it:\n%s", joined)
	}
	snap, err := m.c.Stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inv, err := snap.Inventory.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := inv.Archives["greeter@1.0.0"]; got.Digest != a.Digest || got.Bytes != a.Bytes {
		t.Fatalf("the registered version's archive %+v, the build's %s %d", got, a.Digest, a.Bytes)
	}

	m.assign(t, "web1", "greeter")
	checkFor(t, settle, m.moduleIn("web1", "greeter", protocol.StateReady))
	ran := filepath.Join(web1.root, protocol.ModulesDir, "greeter", "1.0.0", "bin", "greeter")
	if _, err := os.Stat(ran); err != nil {
		t.Fatalf("the built program is not where its archive was unpacked: %v", err)
	}
	if ds, _ := m.c.Durations(ctx, "build", 1); len(ds) != 1 || ds[0].Subject != "greeter" {
		t.Errorf("build durations: %+v", ds)
	}
}

// A repository that cannot be built is an outcome with why, not a registered
// version: a ref that does not exist, a checkout whose mesh.json does not
// stand (every problem listed).
func TestBuild_Failures(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	m.builderOn(t, "b1")
	repo := greeterRepo(t, "1.0.0", 1)
	ctx := context.Background()
	_, err := m.c.Build(ctx, app.BuildRequest{Repository: repo, Ref: "no-such-branch"})
	if !errors.Is(err, app.ErrBuildFailed) || !strings.Contains(err.Error(), "no-such-branch") {
		t.Fatalf("a ref that does not exist: %v", err)
	}
	_, err = m.c.Build(ctx, app.BuildRequest{Repository: filepath.Join(t.TempDir(), "nowhere.git")})
	if !errors.Is(err, app.ErrBuildFailed) {
		t.Fatalf("a repository that is not there: %v", err)
	}
	as, err := m.c.BuildsList(ctx, "")
	if err != nil || len(as) != 2 || as[0].State != builds.Failed || as[1].State != builds.Failed {
		t.Fatalf("builds: %+v %v", as, err)
	}
}

// An outcome for an ask no builder took, on a node that holds no build
// seat (here sent by the controller's own user, as anything that could
// make the broker publish on mesh.build.result.b1 would), is refused:
// nothing is recorded, nothing registered.
func TestBuild_ForgedOutcomeRefused(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	ctx := context.Background()
	a, err := m.c.Build(ctx, app.BuildRequest{Repository: "https://git.example/greeter", NoWait: true})
	if err != nil {
		t.Fatal(err)
	}
	nc := m.controllerConn(t)
	forged := fmt.Sprintf(`{"id": %q, "repository": "https://git.example/greeter", "on": "b1", "module": "greeter", "version": "9.9.9",
		"manifest": {"module": "greeter", "version": "9.9.9"}, "digest": %q, "bytes": 10, "duration_ms": 1}`, a.ID, strings.Repeat("a", 64))
	msg := nats.NewMsg(protocol.BuildResultSubject("b1"))
	msg.Data, msg.Reply = []byte(forged), protocol.BuilderInboxPrefix("b1")+".forged"
	answers, err := nc.SubscribeSync(msg.Reply)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishMsg(msg); err != nil {
		t.Fatal(err)
	}
	reply, err := answers.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(reply.Data), `"ok":false`) || !strings.Contains(string(reply.Data), "no builder") {
		t.Fatalf("answer %s", reply.Data)
	}
	got, err := m.c.BuildsList(ctx, "")
	if err != nil || len(got) != 1 || got[0].State != builds.Waiting {
		t.Fatalf("builds after a forged outcome: %+v %v", got, err)
	}
	if _, err := m.c.Stores(ctx); err == nil {
		st, _ := m.c.Stores(ctx)
		snap, _ := st.Inventory.Snapshot(ctx)
		if _, ok := snap.Current["greeter"]; ok {
			t.Fatal("a forged outcome registered a module")
		}
	}
}

// kill ends a build where it runs: its builder kills its process group,
// the ask is recorded killed by hand, and the outcome the builder then sends
// is refused as ended.
func TestBuild_KilledByHand(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	m.builderOn(t, "b1")
	base := t.TempDir()
	bare, work := filepath.Join(base, "slow.git"), filepath.Join(base, "work")
	git(t, base, "init", "-q", "--bare", "-b", "main", bare)
	git(t, base, "init", "-q", "-b", "main", work)
	os.WriteFile(filepath.Join(work, "mesh.json"), []byte(`{"module": "slow", "version": "1.0.0",
		"build": {"command": ["sleep", "4321"], "outputs": ["bin/"]}}`), 0o644)
	git(t, work, "add", ".")
	git(t, work, "commit", "-q", "-m", "slow")
	git(t, work, "push", "-q", bare, "main")
	ctx := context.Background()
	a, err := m.c.Build(ctx, app.BuildRequest{Repository: bare, NoWait: true})
	if err != nil {
		t.Fatal(err)
	}
	checkFor(t, settle, func() error {
		got, err := m.c.Stores(ctx)
		if err != nil {
			return err
		}
		cur, err := got.Builds.Get(ctx, a.ID)
		if err == nil && cur.State != builds.InFlight {
			err = fmt.Errorf("the build is %s, not in flight: %s", cur.State, cur.Why)
		}
		return err
	})
	sleepers := func() int {
		out, _ := exec.Command("pgrep", "-f", "^sleep 4321$").Output()
		return len(strings.Fields(string(out)))
	}
	checkFor(t, settle, func() error {
		if sleepers() == 0 {
			return fmt.Errorf("the build command (sleep 4321) is not running")
		}
		return nil
	})
	k, told, err := m.c.BuildKill(ctx, a.ID, "it hangs")
	if err != nil || !told || k.State != builds.Killed {
		t.Fatalf("kill: %+v told %v: %v", k, told, err)
	}
	checkFor(t, settle, func() error {
		if n := sleepers(); n > 0 {
			return fmt.Errorf("%d of the build's processes (sleep 4321) outlive its kill", n)
		}
		return nil
	})
	checkFor(t, settle, m.logSays("a build outcome not taken in"))
	st, _ := m.c.Stores(ctx)
	if got, _ := st.Builds.Get(ctx, a.ID); got.State != builds.Killed || got.Why != "killed by hand" {
		t.Fatalf("after the kill: %+v", got)
	}
}

// The build conditions: asks waiting with no builder, an ask dead, a build
// stuck in flight past its bound, a module whose latest build failed; each
// cleared when what raised it is gone.
func TestBuild_Conditions(t *testing.T) {
	t.Parallel()
	c, st := migrated(t)
	ctx := context.Background()
	now := c.Now()
	bs := st.Builds
	open := func() map[string]bool {
		t.Helper()
		if _, err := c.SelfCheck(ctx, app.CheckOptions{}); err != nil {
			t.Fatal(err)
		}
		cs, err := c.Conditions(ctx, app.ConditionFilter{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, cd := range cs {
			if strings.HasPrefix(cd.Kind, "build.") {
				out[cd.Key] = true
			}
		}
		return out
	}
	waiting, _ := bs.Enqueue(ctx, builds.Ask{ID: builds.NewID(now), Repository: "https://git.example/a"}, now)
	dead, _ := bs.Enqueue(ctx, builds.Ask{ID: builds.NewID(now.Add(-time.Hour)), Repository: "https://git.example/b"}, now.Add(-time.Hour))
	if _, err := bs.ExpireWaiting(ctx, 30*time.Minute, now); err != nil {
		t.Fatal(err)
	}
	stuck, _ := bs.Enqueue(ctx, builds.Ask{ID: builds.NewID(now.Add(-3 * time.Hour)), Repository: "https://git.example/c", Module: "c"}, now.Add(-3*time.Hour))
	if _, err := bs.Take(ctx, stuck.ID, "b1/builder", now.Add(-2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	failed, _ := bs.Enqueue(ctx, builds.Ask{ID: builds.NewID(now.Add(-time.Minute)), Repository: "https://git.example/d"}, now.Add(-time.Minute))
	bs.Take(ctx, failed.ID, "b1/builder", now.Add(-time.Minute))
	if _, err := bs.Finish(ctx, failed.ID, builds.Outcome{Failed: true, Module: "d", Why: "exit status 2"}, now); err != nil {
		t.Fatal(err)
	}
	got := open()
	for _, key := range []string{"build.no-builder", "build.dead/" + dead.ID, "build.stuck/" + stuck.ID, "build.failed/d"} {
		if !got[key] {
			t.Errorf("%s not raised; open: %v", key, got)
		}
	}
	// What raised them goes: each is cleared.
	bs.Cancel(ctx, waiting.ID, now)
	bs.Cancel(ctx, dead.ID, now)
	bs.Kill(ctx, stuck.ID, now)
	again, _ := bs.Enqueue(ctx, builds.Ask{ID: builds.NewID(now), Repository: "https://git.example/d"}, now)
	bs.Take(ctx, again.ID, "b1/builder", now)
	bs.Finish(ctx, again.ID, builds.Outcome{Module: "d", Version: "1.0.1", Commit: strings.Repeat("e", 40)}, now)
	if got := open(); len(got) != 0 {
		t.Fatalf("still open: %v", got)
	}
}

// The re-ask healer: an ask no builder answered is asked again once, under
// a new id, and build.dead is cleared while the new ask waits.
func TestBuild_DeadAskedAgainOnce(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	m.restartWith(app.ServeOptions{CheckEvery: 50 * time.Millisecond})
	ctx := context.Background()
	st, err := m.c.Stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	then := m.c.Now().Add(-time.Hour)
	dead, err := st.Builds.Enqueue(ctx, builds.Ask{ID: builds.NewID(then), Repository: "https://git.example/a"}, then)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Builds.ExpireWaiting(ctx, time.Minute, m.c.Now()); err != nil {
		t.Fatal(err)
	}
	var again builds.Ask
	checkFor(t, settle, func() error {
		q, err := st.Builds.Queue(ctx)
		if err != nil {
			return err
		}
		for _, a := range q {
			if a.AgainOf == dead.ID {
				again = a
				return nil
			}
		}
		return fmt.Errorf("the dead ask %s is not asked again; the queue: %s", dead.ID, jsonText(q))
	})
	if again.State != builds.Waiting || again.Repository != dead.Repository {
		t.Fatalf("asked again: %+v", again)
	}
	checkFor(t, settle, m.cleared(t, "build.dead/"+dead.ID))
	// Once: through several more self-checks, the healer does not ask it a
	// second time.
	since := time.Now()
	checkFor(t, settle, func() error {
		v, err := st.Health.LastVerdict(ctx)
		if err == nil && !v.At.After(since.Add(300*time.Millisecond)) {
			err = fmt.Errorf("the last self-check was at %s, not 300ms after %s", v.At.Format(time.RFC3339Nano), since.Format(time.RFC3339Nano))
		}
		return err
	})
	q, _ := st.Builds.Queue(ctx)
	n := 0
	for _, a := range q {
		if a.AgainOf == dead.ID {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d asks again of %s, want 1", n, dead.ID)
	}
}

// replay builds a build's commit again: a dry run is looked at and never
// taken in; --register of a version older than the current is superseded,
// unless --older. What the build compiles is not the point: a script, not
// five cold go builds (one took 8 s alone, 30 s on a loaded machine).
func TestBuild_Replay(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	m.builderOn(t, "b1")
	ctx := context.Background()
	repo := scriptRepo(t, "greeter", "mkdir -p bin && echo greeter > bin/x")
	first, err := m.c.Build(ctx, app.BuildRequest{Repository: repo})
	if err != nil {
		t.Fatal(err)
	}
	dry, err := m.c.Replay(ctx, first.ID, false, false, "", app.BuildRequest{})
	if err != nil || !dry.DryRun || dry.Registered || dry.Commit != first.Commit || dry.Digest == "" {
		t.Fatalf("dry run: %+v %v", dry, err)
	}
	// 1.0.1 from a second commit becomes current.
	work := filepath.Join(t.TempDir(), "work")
	git(t, filepath.Dir(work), "clone", "-q", repo, work)
	b, _ := os.ReadFile(filepath.Join(work, "mesh.json"))
	os.WriteFile(filepath.Join(work, "mesh.json"), []byte(strings.Replace(string(b), `"1.0.0"`, `"1.0.1"`, 1)), 0o644)
	git(t, work, "commit", "-q", "-am", "1.0.1")
	git(t, work, "push", "-q", "origin", "main")
	if _, err := m.c.Build(ctx, app.BuildRequest{Repository: repo}); err != nil {
		t.Fatal(err)
	}
	_, err = m.c.Replay(ctx, first.ID, true, false, "roll back", app.BuildRequest{})
	if !errors.Is(err, app.ErrBuildFailed) || !strings.Contains(err.Error(), "superseded") || !strings.Contains(err.Error(), "older than the registered 1.0.1") {
		t.Fatalf("an older version without --older: %v", err)
	}
	back, err := m.c.Replay(ctx, first.ID, true, true, "roll back", app.BuildRequest{})
	if err != nil || !back.Registered || back.Version != "1.0.0" {
		t.Fatalf("with --older: %+v %v", back, err)
	}
}
