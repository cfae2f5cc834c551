package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"mesh-controller/app"
	"mesh-controller/app/host"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/health"
)

// helloManifest is the example module's manifest, beside its source.
const helloManifest = "../host/testdata/hello/mesh.json"

// helloOnFreePort is the example's manifest with its port (declared, and
// its settings' default) moved to a free one: the README's walkthrough may
// run hello on 18480 at the same time.
func helloOnFreePort(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(helloManifest)
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := strings.Cut(freeAddr(t), ":")
	return writeManifest(t, strings.ReplaceAll(string(b), "18480", port))
}

// buildHello builds the example module once per test binary.
func buildHello(t testing.TB) string { return buildProgram(t, "hello", "../host/testdata/hello") }

// install puts a program where a module's run.command finds it: what its
// host already has (a module built by the mesh arrives as an archive).
func (h *testHost) install(t testing.TB, module, rel, from string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(h.root, protocol.ModulesDir, module, rel)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// moduleState is a module's state on a node as the controller shows it.
func (m *testMesh) moduleState(node, module string) health.ModuleState {
	for _, s := range m.node(node).Modules {
		if s.Module == module {
			return s
		}
	}
	return health.ModuleState{}
}

// helloOn joins a host and assigns it the example module, installed there
// (on a free port), and waits until it is ready.
func (m *testMesh) helloOn(t testing.TB, node string) *testHost {
	t.Helper()
	h := m.join(node)
	h.install(t, "hello", "bin/hello", buildHello(t))
	m.addModule(helloOnFreePort(t))
	if _, err := m.c.Assign(context.Background(), node, []string{"hello"}); err != nil {
		t.Fatal(err)
	}
	checkFor(t, settle, m.moduleIn(node, "hello", protocol.StateReady))
	return h
}

// stopped is a check that the process pid (what) no longer runs.
func stopped(pid int, what string) func() error {
	return func() error {
		if alive(pid) {
			return fmt.Errorf("%s, pid %d, still runs", what, pid)
		}
		return nil
	}
}

func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// A zombie is not running.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}

// The whole life of a module through a real host and the real controller:
// assigned and started, ready, asked, killed and restarted, logged,
// stopped on unassign with its data kept.
func TestRunning_ExampleModuleLifecycle(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	web1 := m.helloOn(t, "web1")
	ctx := context.Background()
	first := m.moduleState("web1", "hello")
	if !alive(first.Pid) {
		t.Fatalf("hello is reported ready with pid %d, which does not run", first.Pid)
	}

	t.Run("ask any instance, and the one on web1", func(t *testing.T) {
		for _, node := range []string{"", "web1"} {
			out, err := m.c.Ask(ctx, app.AskRequest{Module: "hello", Tool: "greet", Input: []byte(`{"name":"ada"}`), Node: node})
			if err != nil {
				t.Fatal(err)
			}
			var a struct {
				Greeting string `json:"greeting"`
				Node     string `json:"node"`
			}
			if err := json.Unmarshal(out, &a); err != nil || a.Greeting != "hello, ada" || a.Node != "web1" {
				t.Fatalf("answer %s: %v", out, err)
			}
		}
	})

	t.Run("logs", func(t *testing.T) {
		var got []string
		if err := m.c.Logs(ctx, "web1", "hello", 50, false, func(l []string) error { got = append(got, l...); return nil }); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(strings.Join(got, "\n"), "answering greet") {
			t.Fatalf("log of hello: %q", got)
		}
	})

	t.Run("killed with SIGKILL, restarted by its host", func(t *testing.T) {
		if err := syscall.Kill(first.Pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		checkFor(t, settle, allOf(m.readyAgain("web1", "hello", first.Pid), func() error {
			if s := m.moduleState("web1", "hello"); s.Restarts1h < 1 {
				return fmt.Errorf("hello on web1 counts %d restarts in the hour, not 1", s.Restarts1h)
			}
			return nil
		}))
		s := m.moduleState("web1", "hello")
		if !strings.Contains(s.LastExit, "killed") {
			t.Errorf("last exit %q, want the kill", s.LastExit)
		}
		starts, _ := os.ReadFile(filepath.Join(web1.root, "var/lib/hello/starts"))
		if strings.TrimSpace(string(starts)) != "2" {
			t.Errorf("starts counted in its data dir: %q, want 2", starts)
		}
	})

	t.Run("start measured", func(t *testing.T) {
		checkFor(t, settle, func() error {
			ds, err := m.c.Durations(ctx, "start", 1)
			if err == nil && (len(ds) != 1 || ds[0].Subject != "web1/hello") {
				err = fmt.Errorf("the start durations are %+v, not web1/hello's", ds)
			}
			return err
		})
		// A controller started again finds hello ready: not a start.
		m.stop()
		restarted := time.Now()
		m.start()
		checkFor(t, settle, func() error {
			if at := m.moduleState("web1", "hello").HeardAt; !at.After(restarted) {
				return fmt.Errorf("web1's states not heard by the new controller: hello heard at %s, restarted at %s", at.Format(time.RFC3339Nano), restarted.Format(time.RFC3339Nano))
			}
			return nil
		})
		if ds, _ := m.c.Durations(ctx, "start", 1); len(ds) != 1 || ds[0].Count != 1 {
			t.Fatalf("starts after the controller restarted: %+v", ds)
		}
	})

	t.Run("unassigned: stopped, data kept", func(t *testing.T) {
		pid := m.moduleState("web1", "hello").Pid
		if _, err := m.c.Unassign(ctx, "web1", []string{"hello"}); err != nil {
			t.Fatal(err)
		}
		checkFor(t, settle, allOf(stopped(pid, "hello"), m.moduleGone("web1", "hello")))
		if _, err := os.Stat(filepath.Join(web1.root, "var/lib/hello/starts")); err != nil {
			t.Fatalf("its data: %v", err)
		}
	})
}

// A module that cannot start is a module's condition, not a failed apply:
// the node applied its declaration, the module is failed with why, and
// ask says no instance answers.
func TestRunning_NotFoundIsFailedNotApplyFailed(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	m.join("web1") // nothing installed: bin/hello is not there
	m.addModule(helloManifest)
	m.assign(t, "web1", "hello")
	m.settled(t, "web1")
	checkFor(t, settle, m.moduleIn("web1", "hello", protocol.StateFailed))
	// The apply's outcome is kept by a writer of its own, maybe after the
	// module's state.
	checkFor(t, settle, func() error {
		if n := m.node("web1"); n.LastApply == nil || !n.LastApply.OK {
			return fmt.Errorf("the apply: %+v", n.LastApply)
		}
		return nil
	})
	if s := m.moduleState("web1", "hello"); !strings.Contains(s.Detail, "not found") {
		t.Fatalf("detail %q", s.Detail)
	}
	st, err := m.c.Status(context.Background())
	if err != nil || len(st.NotReady) != 1 || st.NotReady[0].Module != "hello" {
		t.Fatalf("status lists not ready: %+v %v", st.NotReady, err)
	}
	// The board lists it under what is wrong, as status does.
	srv := httptest.NewUnstartedServer(nil)
	srv.Config.Handler = m.c.BoardHandler(app.BoardHosts(srv.Listener.Addr().String())...)
	srv.Start()
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(page), "web1/hello 1.0.0: failed (not found: bin/hello)") {
		t.Fatalf("the board does not list hello as failed:\n%s", page)
	}
	_, err = m.c.Ask(context.Background(), app.AskRequest{Module: "hello", Tool: "greet", Timeout: 2 * time.Second})
	if !errors.Is(err, app.ErrNoInstance) {
		t.Fatalf("ask with none running: %v", err)
	}
	// The serve's own self-checks judge by the same bounds: one with the
	// default start bound, run after a burst of reports, would clear what
	// this one raised.
	bounds := &app.Bounds{HeartbeatFactor: 3, Apply: time.Hour, DataReport: time.Hour, RetiredWaiting: time.Hour, Memory: time.Hour, Start: time.Nanosecond}
	m.restartWith(app.ServeOptions{CheckEvery: 50 * time.Millisecond, Bounds: bounds})
	checkFor(t, settle, m.opened(t, "module.not-ready/web1/hello"))
}

// A module that exits at once crash-loops: its host keeps it at the capped
// back-off, reports it, and the self-check raises module.crash-looping with
// the exit and the log's tail; the host itself stays healthy.
func TestRunning_CrashLoopRaisesCondition(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	script := filepath.Join(t.TempDir(), "crash")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho about to fail >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	web1 := m.joinWith("web1", &host.Supervisor{BackoffBase: 20 * time.Millisecond, BackoffCap: 160 * time.Millisecond, ResetAfter: time.Minute})
	web1.install(t, "crash", "bin/crash", script)
	m.addModule(writeManifest(t, `{"module": "crash", "version": "1.0.0", "run": {"command": ["bin/crash"], "ready": {"after": "1s"}}}`))
	m.assign(t, "web1", "crash")
	checkFor(t, settle, m.moduleIn("web1", "crash", protocol.StateCrashLooping))
	// Between its restarts a report may say it starts again: the check is
	// run until one judges the module as it crash-loops.
	var c app.ConditionDetail
	checkFor(t, settle, func() error {
		if _, err := m.c.SelfCheck(context.Background(), app.CheckOptions{}); err != nil {
			return err
		}
		var err error
		c, err = m.c.ConditionShow(context.Background(), "module.crash-looping/web1/crash")
		return err
	})
	ev, _ := json.Marshal(c.Evidence)
	if !strings.Contains(string(ev), "exit status 3") || !strings.Contains(string(ev), "about to fail") {
		t.Fatalf("evidence %s", ev)
	}
	if n := m.node("web1"); n.LastHeard == nil || time.Since(*n.LastHeard) > 5*time.Second {
		t.Fatalf("the host is not heard: %+v", n.LastHeard)
	}
}

// Refusals of logs and ask, each one line.
func TestRunning_Refusals(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	web1 := m.join("web1")
	m.addModule(helloManifest)
	m.assign(t, "web1", "hello")
	m.settled(t, "web1")
	ctx := context.Background()
	m.join("web2")
	for _, c := range []struct {
		r    app.AskRequest
		want error
	}{
		{app.AskRequest{Module: "hello", Tool: "shout"}, app.ErrNoSuchTool},
		{app.AskRequest{Module: "hello", Tool: "greet", Node: "web2"}, app.ErrNotOnNode},
		{app.AskRequest{Module: "hello", Tool: "greet", Input: []byte("{")}, app.ErrNotJSON},
	} {
		if _, err := m.c.Ask(ctx, c.r); !errors.Is(err, c.want) {
			t.Errorf("ask %+v: %v, want %v", c.r, err, c.want)
		}
	}
	web1.stop()
	err := m.c.Logs(ctx, "web1", "hello", 10, false, func([]string) error { return nil })
	if !errors.Is(err, app.ErrNotConnected) || !strings.Contains(err.Error(), "silent since") {
		t.Fatalf("logs of a stopped host: %v", err)
	}
}

// The module's own broker user, as its host wrote it (0600, never in its
// environment), may hear its tools on any node's subject and its own
// node's, and nothing of another node or of the hosts.
func TestRunning_ModuleUserAsDeclared(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	web1 := m.helloOn(t, "web1")
	m.join("web2")

	creds := filepath.Join(web1.root, protocol.ModulesDir, "hello", protocol.BrokerCredsName)
	fi, err := os.Stat(creds)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("broker.creds: %v %v", fi, err)
	}
	body, _ := os.ReadFile(creds)
	env, err := os.ReadFile("/proc/" + strconv.Itoa(m.moduleState("web1", "hello").Pid) + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range strings.Split(string(env), "\x00") {
		if name, _, _ := strings.Cut(v, "="); name != "" && strings.Contains(string(body), strings.TrimPrefix(v, name+"=")) && len(v) > len(name)+20 {
			t.Fatalf("a part of the module's creds is in its environment: %s", name)
		}
		if strings.Contains(v, "SUA") || strings.Contains(v, "eyJ0eXAiOiJKV1Qi") {
			t.Fatalf("a seed or a JWT in the environment: %.40s", v)
		}
	}
	want := []string{"MESH_NODE=web1", "MESH_MODULE=hello", "MESH_VERSION=1.0.0", "MESH_BROKER_CREDS=" + creds,
		"MESH_DATA_STATE=" + filepath.Join(web1.root, "var/lib/hello"), "HOME=" + filepath.Dir(creds)}
	for _, w := range want {
		if !strings.Contains("\x00"+string(env)+"\x00", "\x00"+w+"\x00") {
			t.Errorf("environment lacks %s", w)
		}
	}

	nc, v := connectWith(t, m.url, nats.UserCredentials(creds), nats.NoReconnect())
	for _, subject := range []string{"mesh.tool.hello.greet.web2", "mesh.node.web1.inbox.>", "mesh.tool.other.greet"} {
		if _, err := nc.SubscribeSync(subject); err != nil {
			t.Fatal(err)
		}
		nc.Flush()
		v.expect(t, "subscription", subject)
	}
	if _, err := nc.SubscribeSync("mesh.tool.hello.greet.web1"); err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	select {
	case e := <-v:
		t.Fatalf("its own node's tool subject refused: %s", e)
	case <-time.After(300 * time.Millisecond):
	}
}

// logs --follow: lines written after it began arrive; when the follower
// goes, the host stops sending.
func TestRunning_LogsFollow(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	m.helloOn(t, "web1")

	ctx, cancel := context.WithCancel(context.Background())
	lines := make(chan string, 100)
	done := make(chan error, 1)
	go func() {
		done <- m.c.Logs(ctx, "web1", "hello", 1, true, func(ls []string) error {
			for _, l := range ls {
				lines <- l
			}
			return nil
		})
	}()
	<-lines // the last line written before
	if _, err := m.c.Ask(context.Background(), app.AskRequest{Module: "hello", Tool: "greet", Input: []byte(`{"name":"follower"}`)}); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(10 * time.Second)
	for found := false; !found; {
		select {
		case l := <-lines:
			found = strings.Contains(l, `asked greet for "follower"`)
		case <-deadline:
			t.Fatal("the line written while following did not arrive")
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("following ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("following did not end with its context")
	}
}

// A settings change restarts that module only; a roll-out to a version
// that cannot start stops there, saying why.
func TestRunning_ChangeRestartsOnlyThatModule(t *testing.T) {
	t.Parallel()
	bin := buildHello(t)
	m := newTestMesh(t)
	web1 := m.join("web1")
	web1.install(t, "hello", "bin/hello", bin)
	sleeper := filepath.Join(t.TempDir(), "sleeper")
	if err := os.WriteFile(sleeper, []byte("#!/bin/sh\nexec sleep 1000\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	web1.install(t, "sleeper", "bin/sleeper", sleeper)
	hello := helloOnFreePort(t)
	m.addModule(hello)
	m.addModule(writeManifest(t, `{"module": "sleeper", "version": "1.0.0", "run": {"command": ["bin/sleeper"], "ready": {"after": "200ms"}}}`))
	m.assign(t, "web1", "hello", "sleeper")
	checkFor(t, settle, m.moduleIn("web1", "hello", protocol.StateReady))
	checkFor(t, settle, m.moduleIn("web1", "sleeper", protocol.StateReady))
	helloPid, sleeperPid := m.moduleState("web1", "hello").Pid, m.moduleState("web1", "sleeper").Pid
	ctx := context.Background()

	b, _ := os.ReadFile(hello)
	port := regexp.MustCompile(`"port": (\d+)`).FindStringSubmatch(string(b))[1]
	if _, err := m.c.SettingsSet(ctx, app.SettingsRequest{Module: "hello", Body: []byte(`{"greeting": "hi", "port": ` + port + `}`)}); err != nil {
		t.Fatal(err)
	}
	checkFor(t, settle, m.readyAgain("web1", "hello", helloPid))
	out, err := m.c.Ask(ctx, app.AskRequest{Module: "hello", Tool: "greet", Input: []byte(`{"name":"ada"}`)})
	if err != nil || !strings.Contains(string(out), `"hi, ada"`) {
		t.Fatalf("after the change: %s %v", out, err)
	}
	if s := m.moduleState("web1", "sleeper"); s.Pid != sleeperPid || !alive(sleeperPid) {
		t.Fatalf("sleeper was restarted by hello's change: pid %d, was %d", s.Pid, sleeperPid)
	}

	m.addModule(writeManifest(t, strings.ReplaceAll(strings.ReplaceAll(string(b), `"1.0.0"`, `"1.0.1"`), `"bin/hello"`, `"bin/missing"`)))
	_, err = m.c.Upgrade(ctx, app.UpgradeRequest{Module: "hello", Action: "roll-out", Wait: 20 * time.Second})
	if !errors.Is(err, app.ErrRollOutStopped) || !strings.Contains(err.Error(), "hello 1.0.1 is failed there: not found") {
		t.Fatalf("roll-out of a version that cannot start: %v", err)
	}
}

// An upgrade that leaves what a module may send and hear as it was keeps
// its broker user (nothing revoked, so the broker's revocations do not grow
// with each roll-out); one that changes it gets a new user and the old one
// is revoked.
func TestRunning_ModuleUserAcrossVersions(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	m.join("web1")
	ctx := context.Background()
	manifest := func(version, emits string) string {
		return writeManifest(t, `{"module": "teller", "version": "`+version+`", "emits": [`+emits+`]}`)
	}
	m.addModule(manifest("1.0.0", `"news.told"`))
	m.assign(t, "web1", "teller")
	st, err := m.c.Stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	user := func() string {
		us, err := st.Identity.ModuleUsers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return us["web1/teller"].Pub
	}
	first := user()
	if first == "" {
		t.Fatal("no broker user made on assign")
	}
	rollOut := func(version, emits string) {
		t.Helper()
		m.addModule(manifest(version, emits))
		if _, err := m.c.Upgrade(ctx, app.UpgradeRequest{Module: "teller", Action: "roll-out", Wait: 20 * time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	rollOut("1.0.1", `"news.told"`)
	revoked, _ := st.Identity.Revoked(ctx)
	if user() != first || len(revoked) != 0 {
		t.Fatalf("same permissions: user %s (was %s), %d revoked", user(), first, len(revoked))
	}
	rollOut("1.0.2", `"news.told", "news.more"`)
	revoked, _ = st.Identity.Revoked(ctx)
	if user() == first {
		t.Fatal("new permissions kept the old user")
	}
	if _, ok := revoked[first]; !ok || len(revoked) != 1 {
		t.Fatalf("the old user is not the one revoked: %v", revoked)
	}
}

// A host that applied its declaration before hosts ran modules (its
// applied.json keeps no runs) starts them when it runs again: the answer to
// its ask on connecting carries the same declaration, whose modules it runs
// without writing its files again.
func TestRunning_HostFromBeforeRunsItsModules(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	web1 := m.helloOn(t, "web1")
	web1.stop()
	checkFor(t, settle, func() error { return stopped(m.moduleState("web1", "hello").Pid, "hello")() })
	file := filepath.Join(web1.state.Dir, "applied.json")
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var applied map[string]any
	if err := json.Unmarshal(b, &applied); err != nil {
		t.Fatal(err)
	}
	delete(applied, "runs")
	b, _ = json.Marshal(applied)
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	before := m.moduleState("web1", "hello").Pid
	web1.start()
	checkFor(t, settle, allOf(m.readyAgain("web1", "hello", before), func() error {
		if pid := m.moduleState("web1", "hello").Pid; !alive(pid) {
			return fmt.Errorf("hello on web1 is reported ready as pid %d, which does not run", pid)
		}
		return nil
	}))
	if n := m.node("web1"); n.LastApply == nil || !n.LastApply.OK {
		t.Fatalf("the host reported %+v", n.LastApply)
	}
}

// As root, a host runs each module as its own system user: it reads its
// settings and its broker user (group-readable, in a directory it cannot
// write), writes the data directories the host made for it, and is given
// nothing that was there before (a data path that already existed stays
// the host's). The user is deleted afterwards.
func TestRunning_AsItsOwnUser(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("modules run as their own users only when the host is root")
	}
	if _, err := exec.LookPath("useradd"); err != nil {
		t.Skip("no useradd here")
	}
	module := fmt.Sprintf("hello-u%d", os.Getpid()%100000)
	name := "mesh-" + module
	if _, err := user.Lookup(name); err == nil {
		t.Fatalf("user %s exists already", name)
	}
	m := newTestMesh(t)
	tok, err := m.c.TokenIssue(context.Background(), app.TokenRequest{Node: "web1", New: true, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// The module's user must pass through the directories above the root.
	for d := dir; d != "/"; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o005 != 0o005 {
			if err := os.Chmod(d, fi.Mode().Perm()|0o005); err != nil {
				t.Fatal(err)
			}
		}
	}
	st, err := host.Join(context.Background(), host.JoinOptions{Broker: m.url, Token: tok.Token, Node: "web1", State: filepath.Join(dir, "state")})
	if err != nil {
		t.Fatal(err)
	}
	web1 := &testHost{t: t, name: "web1", state: st, root: filepath.Join(dir, "root"), users: true}
	t.Cleanup(func() {
		if out, err := exec.Command("userdel", name).CombinedOutput(); err != nil {
			t.Errorf("userdel %s: %v: %s", name, err, out)
		}
	})
	t.Cleanup(web1.stop) // runs first: userdel refuses a user with processes
	web1.start()
	web1.install(t, module, "bin/hello", buildHello(t))
	taken := filepath.Join(web1.root, "srv/taken")
	if err := os.MkdirAll(taken, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(helloOnFreePort(t))
	if err != nil {
		t.Fatal(err)
	}
	body := strings.Replace(string(b), `"module": "hello"`, `"module": "`+module+`"`, 1)
	body = strings.Replace(body, `"data": [`, `"data": [{"name": "taken", "path": "/srv/taken", "precious": "rebuildable"}, {"name": "keys", "path": "/root/.ssh", "precious": "rebuildable"}, `, 1)
	m.addModule(writeManifest(t, body))
	m.assign(t, "web1", module)
	checkFor(t, settle, m.moduleIn("web1", module, protocol.StateReady))

	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	owner := func(p string) (int, int, os.FileMode) {
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		s := fi.Sys().(*syscall.Stat_t)
		return int(s.Uid), int(s.Gid), fi.Mode().Perm()
	}
	proc, _ := os.ReadFile("/proc/" + strconv.Itoa(m.moduleState("web1", module).Pid) + "/status")
	if !strings.Contains(string(proc), "\nUid:\t"+u.Uid+"\t") {
		t.Errorf("the module does not run as %s:\n%s", name, proc)
	}
	modDir := filepath.Join(web1.root, protocol.ModulesDir, module)
	if o, _, _ := owner(modDir); o != 0 {
		t.Errorf("its directory is given to uid %d: a module that can write there can plant links", o)
	}
	if o, g, mode := owner(filepath.Join(modDir, protocol.BrokerCredsName)); o != 0 || g != gid || mode != 0o640 {
		t.Errorf("broker.creds: uid %d gid %d mode %o, want 0, %d, 640", o, g, mode, gid)
	}
	if o, g, _ := owner(filepath.Join(web1.root, "var/lib/hello")); o != uid || g != gid {
		t.Errorf("the data dir the host made: uid %d gid %d, want %d %d", o, g, uid, gid)
	}
	if o, _, _ := owner(taken); o != 0 {
		t.Errorf("a data path that was there before was given to the module (uid %d)", o)
	}
	if o, _, _ := owner(filepath.Join(web1.root, "root/.ssh")); o != 0 {
		t.Errorf("/root/.ssh, made for the module, was given to it (uid %d)", o)
	}
	if starts, err := os.ReadFile(filepath.Join(web1.root, "var/lib/hello/starts")); err != nil || strings.TrimSpace(string(starts)) != "1" {
		t.Errorf("the module could not write its data: %q %v", starts, err)
	}
	if _, err := m.c.Ask(context.Background(), app.AskRequest{Module: module, Tool: "greet"}); err != nil {
		t.Errorf("ask: %v", err)
	}
}
