package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"mesh-controller/app"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/licences"
)

// refresherManifest is the test manager module's, under a module name and
// in a mode (REFRESHER_MODE): its tool refresh, its port its ready check.
func refresherManifest(t *testing.T, module, mode string) string {
	_, port, _ := strings.Cut(freeAddr(t), ":")
	return writeManifest(t, `{"module": "`+module+`", "version": "1.0.0",
 "run": {"command": ["bin/refresher"], "env": {"REFRESHER_PORT": "`+port+`", "REFRESHER_MODE": "`+mode+`"}, "ready": {"port": "api"}},
 "ports": [{"name": "api", "port": `+port+`, "expose": "local"}],
 "tools": [{"name": "refresh", "description": "a new access token for {\"licence\": NAME}"}]}`)
}

// refreshedToken is the access token the refresher answers the n-th time
// for a refresh token (app/testdata/refresher's Token).
func refreshedToken(refresh string, n int) string {
	sum := sha256.Sum256([]byte(refresh + "/" + strconv.Itoa(n)))
	return "access-" + hex.EncodeToString(sum[:20])
}

// addRefreshable adds a refreshable licence with new known tokens, which
// it returns.
func (m *testMesh) addRefreshable(t *testing.T, name, expires string) (access, refresh string) {
	t.Helper()
	access, _ = knownValue(t)
	refresh, _ = knownValue(t)
	tokens, _ := json.Marshal(app.RefreshableTokens{AccessToken: access, RefreshToken: refresh})
	if _, err := m.c.LicenceAdd(context.Background(), app.LicenceAddRequest{Name: name, Provider: "openai", Refreshable: true, Expires: expires,
		Token: protocol.NewSecret(tokens)}); err != nil {
		t.Fatal(err)
	}
	return access, refresh
}

// encodings are a value as the plaintext tests look for it.
// licenceAt is a check that the first licence listed is name at version.
func (m *testMesh) licenceAt(ctx context.Context, name string, version int64) func() error {
	return func() error {
		l, err := m.c.LicenceList(ctx)
		if err == nil && (l[0].Name != name || l[0].Version != version) {
			err = fmt.Errorf("the first licence is %s at version %d, not %s at %d", l[0].Name, l[0].Version, name, version)
		}
		return err
	}
}

func encodings(v string) []string {
	return []string{v, base64.StdEncoding.EncodeToString([]byte(v)), base64.RawURLEncoding.EncodeToString([]byte(v)), hex.EncodeToString([]byte(v))}
}

// A refreshable licence managed by a real module on mgr1 and held on web1
// and web2: a refresh moves both hosts to the new token in one push and
// the old is gone from their files; the operator recovers either version;
// a silent manager fails the refresh in one line, raises
// licence.refresh-failed and leaves the holders the old token; serve
// refreshes by itself at 80 % of a version's life; no token is in any
// store, WAL, log or output.
func TestLicences_Refresh(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	mgr1, web1, web2 := m.join("mgr1"), m.join("web1"), m.join("web2")
	mgr1.install(t, "refresher", "bin/refresher", buildProgram(t, "refresher", "../testdata/refresher"))
	sleeper := filepath.Join(t.TempDir(), "translator")
	if err := os.WriteFile(sleeper, []byte("#!/bin/sh\nexec sleep 1000\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, h := range []*testHost{web1, web2} {
		h.install(t, "translator", "bin/translator", sleeper)
	}
	m.addModule(refresherManifest(t, "refresher", ""))
	m.addModule(writeManifest(t, translatorManifest))
	ctx := context.Background()
	if _, err := m.c.Assign(ctx, "mgr1", []string{"refresher"}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"web1", "web2"} {
		if _, err := m.c.Assign(ctx, n, []string{"translator"}); err != nil {
			t.Fatal(err)
		}
	}

	access, refresh := m.addRefreshable(t, "translation", "1h")
	key := m.operatorKeyFile(t)
	var outputs strings.Builder
	record := func(v any) {
		b, _ := json.Marshal(v)
		outputs.Write(b)
	}
	if _, err := m.c.LicenceRefresh(ctx, "translation"); !errors.Is(err, licences.ErrNoManager) {
		t.Fatalf("refreshed without a manager: %v", err)
	}
	for _, holder := range []string{"web1/translator", "web2/translator"} {
		u, err := m.c.LicenceUse(ctx, app.LicenceUseRequest{Name: "translation", Holder: holder, KeyFile: key})
		if err != nil {
			t.Fatal(err)
		}
		record(u)
	}
	managed, err := m.c.LicenceManager(ctx, app.LicenceManagerRequest{Name: "translation", Manager: "mgr1/refresher", KeyFile: key})
	if err != nil {
		t.Fatal(err)
	}
	record(managed)
	refreshFile := filepath.Join(mgr1.root, filepath.FromSlash(protocol.RefreshFile("refresher", "translation")))
	checkFor(t, settle, fileHolds(refreshFile, refresh))
	if mode := fileMode(t, refreshFile); mode != 0o600 {
		t.Fatalf("the refresh token's file has mode %v", mode)
	}
	// The refresher may be started again as its declaration moves (the
	// manager's copy arriving): the environment is read of the one ready
	// now, until one names the refresh token.
	checkFor(t, 15*time.Second, func() error {
		st := m.moduleState("mgr1", "refresher")
		if st.State != protocol.StateReady {
			return fmt.Errorf("refresher on mgr1 is %s", st.State)
		}
		environ, err := os.ReadFile("/proc/" + strconv.Itoa(st.Pid) + "/environ")
		if err != nil {
			return err
		}
		if want := "MESH_REFRESH_TRANSLATION=" + refreshFile; !strings.Contains(string(environ), want+"\x00") {
			return fmt.Errorf("the refresher's environment does not name its refresh token (%s)", want)
		}
		return nil
	})
	file := func(h *testHost) string {
		return filepath.Join(h.root, filepath.FromSlash(protocol.LicenceFile("translator", "translation")))
	}
	holding := func(what, value string) {
		t.Helper()
		for _, h := range []*testHost{web1, web2} {
			checkFor(t, settle, func() error {
				if err := fileHolds(file(h), value)(); err != nil {
					return fmt.Errorf("%s does not hold %s: %w", h.name, what, err)
				}
				return nil
			})
		}
	}
	holding("the first token", access)

	// Refreshed by hand: both holders move to the new token, the old is
	// gone from their files.
	r, err := m.c.LicenceRefresh(ctx, "translation")
	if err != nil || r.From != 1 || r.Version != 2 || len(r.Holders) != 2 || r.Expires == nil || !r.Expires.After(time.Now().Add(50*time.Minute)) {
		t.Fatalf("refresh: %+v, %v", r, err)
	}
	if len(r.Pushed) != 2 {
		t.Fatalf("one push to both holders, not %+v", r.Pushed)
	}
	record(r)
	second := refreshedToken(refresh, 1)
	holding("the refreshed token", second)
	for _, h := range []*testHost{web1, web2} {
		assertNowhere(t, h.root, encodings(access))
	}
	// The operator recovers either version.
	for v, want := range map[int64]string{1: access, 2: second} {
		out := filepath.Join(t.TempDir(), "recovered")
		rec, err := m.c.SecretRecover(ctx, app.RecoverRequest{Licence: "translation", Version: v, KeyFile: key, Out: out})
		if err != nil || rec.Version != v {
			t.Fatalf("recover version %d: %+v, %v", v, rec, err)
		}
		if b, _ := os.ReadFile(out); string(b) != want {
			t.Fatalf("version %d recovered the wrong token", v)
		}
		os.Remove(out)
	}

	// A silent manager: the refresh fails in one line, the condition is
	// raised, the holders keep the token they have.
	mgr1.stop()
	_, err = m.c.LicenceRefresh(ctx, "translation")
	if !errors.Is(err, app.ErrNoInstance) || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "its holders keep version 2") {
		t.Fatalf("a silent manager: %v", err)
	}
	record(err.Error())
	if !m.openAfterCheck(t, "licence.refresh-failed/translation") {
		t.Fatal("licence.refresh-failed not raised")
	}
	cs, _ := m.c.Conditions(ctx, app.ConditionFilter{})
	for _, c := range cs {
		if c.Key == "licence.refresh-failed/translation" && (c.Severity != "urgent" || !strings.Contains(c.Summary, "mgr1/refresher")) {
			t.Fatalf("condition: %+v", c)
		}
	}
	if l, _ := m.c.LicenceList(ctx); l[0].Version != 2 {
		t.Fatalf("a failed refresh moved the version: %+v", l[0])
	}
	holding("the token they had", second)

	// serve refreshes by itself at 80 % of a version's life: a licence of
	// 3 s, a short check interval.
	mgr1.start()
	checkFor(t, settle, m.moduleIn("mgr1", "refresher", protocol.StateReady))
	m.restartWith(app.ServeOptions{CheckEvery: 50 * time.Millisecond})
	chatAccess, chatRefresh := m.addRefreshable(t, "chat", "3s")
	if _, err := m.c.LicenceUse(ctx, app.LicenceUseRequest{Name: "chat", Holder: "web1/translator", KeyFile: key}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.c.LicenceManager(ctx, app.LicenceManagerRequest{Name: "chat", Manager: "mgr1/refresher", KeyFile: key}); err != nil {
		t.Fatal(err)
	}
	checkFor(t, settle, m.licenceAt(ctx, "chat", 2))
	chatFile := filepath.Join(web1.root, filepath.FromSlash(protocol.LicenceFile("translator", "chat")))
	recovered := func(name string, v int64) string {
		out := filepath.Join(t.TempDir(), "recovered")
		if _, err := m.c.SecretRecover(ctx, app.RecoverRequest{Licence: name, Version: v, KeyFile: key, Out: out}); err != nil {
			t.Fatalf("recover %s version %d: %v", name, v, err)
		}
		b, _ := os.ReadFile(out)
		return string(b)
	}
	chatSecond := recovered("chat", 2)
	if chatSecond == chatAccess {
		t.Fatal("serve's refresh kept the token")
	}
	checkFor(t, settle, fileHolds(chatFile, chatSecond))
	if !m.logs.logged("healer acted", "healer", "refresh-licence", "condition", "licence/chat", "detail", "version 1", "outcome", "done") {
		t.Fatalf("serve's refresh is not a healer's act:\n%s", m.logs.String())
	}

	// Under the brake serve's refresh waits, like any healer's act, until
	// a person releases it.
	st, err := m.c.Stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Health.EngageBrake(ctx, "the test engages it", time.Now()); err != nil {
		t.Fatal(err)
	}
	brakedAccess, brakedRefresh := m.addRefreshable(t, "braked", "2s")
	if _, err := m.c.LicenceManager(ctx, app.LicenceManagerRequest{Name: "braked", Manager: "mgr1/refresher", KeyFile: key}); err != nil {
		t.Fatal(err)
	}
	dueAt := time.Now().Add(2 * time.Second)
	m.checkedAfter(t, m.checkedAfter(t, dueAt))
	if l, _ := m.c.LicenceList(ctx); l[0].Name != "braked" || l[0].Version != 1 {
		t.Fatalf("refreshed under the brake: %+v", l[0])
	}
	if err := m.c.HealersRelease(ctx, "the test releases it"); err != nil {
		t.Fatal(err)
	}
	checkFor(t, settle, m.licenceAt(ctx, "braked", 2))

	// A refresh that succeeds clears licence.refresh-failed.
	r, err = m.c.LicenceRefresh(ctx, "translation")
	if err != nil || r.Version != 3 {
		t.Fatalf("refresh after the manager came back: %+v, %v", r, err)
	}
	third := recovered("translation", 3)
	holding("the third token", third)
	checkFor(t, settle, m.cleared(t, "licence.refresh-failed/translation"))

	for _, v := range []string{access, refresh, second, third, chatAccess, chatRefresh, chatSecond, brakedAccess, brakedRefresh} {
		for _, enc := range encodings(v) {
			if strings.Contains(m.logs.String(), enc) || strings.Contains(outputs.String(), enc) {
				t.Fatal("a token was logged or printed")
			}
		}
		assertNowhere(t, m.c.DataDir, encodings(v))
	}
}

// A manager that answers what it must not (an error, no access token, a
// past expiry, not JSON): each refresh fails in one line that never
// quotes a token, the version stays, the failure is recorded, and nothing
// of the answer is kept.
func TestLicences_RefreshBadAnswers(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	mgr1 := m.join("mgr1")
	mgr1.install(t, "badrefresher", "bin/refresher", buildProgram(t, "refresher", "../testdata/refresher"))
	m.addModule(refresherManifest(t, "badrefresher", "bad"))
	ctx := context.Background()
	if _, err := m.c.Assign(ctx, "mgr1", []string{"badrefresher"}); err != nil {
		t.Fatal(err)
	}
	access, refresh := m.addRefreshable(t, "chat", "1h")
	if _, err := m.c.LicenceManager(ctx, app.LicenceManagerRequest{Name: "chat", Manager: "mgr1/badrefresher", KeyFile: m.operatorKeyFile(t)}); err != nil {
		t.Fatal(err)
	}
	refreshFile := filepath.Join(mgr1.root, filepath.FromSlash(protocol.RefreshFile("badrefresher", "chat")))
	checkFor(t, settle, fileHolds(refreshFile, refresh))
	checkFor(t, settle, m.moduleIn("mgr1", "badrefresher", protocol.StateReady))
	// Ready is two seconds without exiting: on a loaded machine the module
	// may not have subscribed to its tool yet, or the instance answering
	// may still be the one started before the licence was managed (its
	// environment names no refresh token; the host restarts it).
	var first error
	checkFor(t, settle, func() error {
		if _, first = m.c.LicenceRefresh(ctx, "chat"); first != nil &&
			(strings.Contains(first.Error(), "no running instance") || strings.Contains(first.Error(), "no refresh token for chat")) {
			return first
		}
		return nil
	})
	for i, want := range []string{"its manager answered an error: the provider refused", "its manager's answer holds no access_token",
		`its manager's expires_at "2001-01-01T00:00:00Z" is not a future RFC 3339 time`, "its manager did not answer {"} {
		err := first
		if i > 0 {
			_, err = m.c.LicenceRefresh(ctx, "chat")
		}
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") || strings.Contains(err.Error(), "access-") ||
			strings.Contains(err.Error(), access) || strings.Contains(err.Error(), refresh) {
			t.Fatalf("answer %d: %v", i+1, err)
		}
		if i > 0 && !errors.Is(err, app.ErrBadRefresh) {
			t.Fatalf("answer %d is not a bad refresh: %v", i+1, err)
		}
	}
	if l, _ := m.c.LicenceList(ctx); l[0].Version != 1 {
		t.Fatalf("a bad answer moved the version: %+v", l[0])
	}
	if !m.openAfterCheck(t, "licence.refresh-failed/chat") {
		t.Fatal("licence.refresh-failed not raised")
	}
	assertNowhere(t, m.c.DataDir, encodings(refreshedToken(refresh, 3)))
}

// serve's sweep discards a superseded version once its grace period is
// over (the clock moved past it), with a discarded event, and keeps the
// current one and the refresh token.
func TestLicences_DiscardAfterGrace(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	ctx := context.Background()
	m.addRefreshable(t, "chat", "1h")
	st, err := m.c.Stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Version 2 as a refresh keeps it, sealed to the operator key.
	l, err := st.Licences.Licence(ctx, "chat")
	if err != nil {
		t.Fatal(err)
	}
	next, _ := knownValue(t)
	expires := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	if _, _, err := m.c.KeepRefreshed(ctx, st, l, protocol.NewSecret([]byte(next)), expires); err != nil {
		t.Fatal(err)
	}
	m.stop()
	// The clock past version 1's grace period (serve stopped: nothing reads it meanwhile).
	m.c.Now = func() time.Time { return time.Now().Add(licences.GracePeriod + time.Hour) }
	m.opts = app.ServeOptions{SweepEvery: 50 * time.Millisecond}
	m.start()
	checkFor(t, settle, func() error {
		if _, err := st.Licences.OperatorCopy(ctx, "chat", 1); !errors.Is(err, licences.ErrNoCopy) {
			return fmt.Errorf("chat's version 1 is not discarded: %v", err)
		}
		return nil
	})
	if _, err := st.Licences.OperatorCopy(ctx, "chat", 2); err != nil {
		t.Fatalf("the current version went too: %v", err)
	}
	if _, err := st.Licences.RefreshCopy(ctx, "chat"); err != nil {
		t.Fatalf("the refresh token went: %v", err)
	}
	checkFor(t, settle, m.logSays("1 superseded licence version discarded"))
}
