package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"mesh-controller/app"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/licences"
)

// translatorManifest needs the licence "translation" and runs a program
// that only sleeps: its environment, read from /proc, says where its host
// put the licence.
const translatorManifest = `{"module": "translator", "version": "1.0.0", "licences": [{"name": "translation"}],
 "run": {"command": ["bin/translator"], "ready": {"after": "200ms"}}}`

// A licence added once, used on two nodes: each host holds the exact token
// 0600 beside the module and names it MESH_LICENCE_TRANSLATION in the
// module's environment; the module waits for it until it is held; --stop
// and unassign take it away; the operator recovers it from the store, an
// export and with the plain age command; the token is in no store, WAL,
// log, output or export.
func TestLicences_UseOnTwoNodes(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	web1, web2 := m.join("web1"), m.join("web2")
	sleeper := filepath.Join(t.TempDir(), "translator")
	if err := os.WriteFile(sleeper, []byte("#!/bin/sh\nexec sleep 1000\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, h := range []*testHost{web1, web2} {
		h.install(t, "translator", "bin/translator", sleeper)
	}
	m.addModule(writeManifest(t, translatorManifest))
	ctx := context.Background()
	for _, n := range []string{"web1", "web2"} {
		a, err := m.c.Assign(ctx, n, []string{"translator"})
		if err != nil {
			t.Fatal(err)
		}
		if got := a.Modules[0].LicencesNotHeld; len(got) != 1 || got[0] != "translation" {
			t.Fatalf("assign does not warn of the licence not held: %+v", a.Modules[0])
		}
	}
	checkFor(t, settle, func() error {
		if s := m.moduleState("web1", "translator"); s.State != protocol.StateWaiting || !strings.Contains(s.Detail, "licence translation") {
			return fmt.Errorf("translator on web1 is %s (%s), not waiting for its licence", s.State, s.Detail)
		}
		return nil
	})

	value, encodings := knownValue(t)
	added, err := m.c.LicenceAdd(ctx, app.LicenceAddRequest{Name: "translation", Provider: "deepl", Expires: "720h", Token: protocol.NewSecret([]byte(value))})
	if err != nil || added.Version != 1 || added.Expires == nil {
		t.Fatalf("add: %+v, %v", added, err)
	}
	key := m.operatorKeyFile(t)
	var outputs strings.Builder
	for _, holder := range []string{"web1/translator", "web2/translator"} {
		u, err := m.c.LicenceUse(ctx, app.LicenceUseRequest{Name: "translation", Holder: holder, KeyFile: key})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(u)
		outputs.Write(b)
	}
	file := func(h *testHost) string {
		return filepath.Join(h.root, filepath.FromSlash(protocol.LicenceFile("translator", "translation")))
	}
	for _, h := range []*testHost{web1, web2} {
		checkFor(t, settle, fileHolds(file(h), value))
		if mode := fileMode(t, file(h)); mode != 0o600 {
			t.Fatalf("%s's licence file has mode %v", h.name, mode)
		}
		checkFor(t, settle, m.moduleIn(h.name, "translator", protocol.StateReady))
		environ, err := os.ReadFile("/proc/" + strconv.Itoa(m.moduleState(h.name, "translator").Pid) + "/environ")
		if err != nil {
			t.Fatal(err)
		}
		if want := "MESH_LICENCE_TRANSLATION=" + file(h); !strings.Contains(string(environ), want+"\x00") {
			t.Fatalf("%s's translator environment does not name its licence (%s): %q", h.name, want, environ)
		}
	}
	list, err := m.c.LicenceList(ctx)
	if err != nil || len(list) != 1 || strings.Join(list[0].Holders, ",") != "web1/translator,web2/translator" {
		t.Fatalf("list: %+v, %v", list, err)
	}
	kv, err := m.c.LicenceKey(ctx, "translation")
	if err != nil || len(kv.Copies) != 3 {
		t.Fatalf("key: %+v, %v", kv, err)
	}
	for _, v := range []any{list, kv} {
		b, _ := json.Marshal(v)
		outputs.Write(b)
	}

	// Taken away from web2: its file goes, web1 keeps its own.
	if _, err := m.c.LicenceStop(ctx, "translation", "web2/translator"); err != nil {
		t.Fatal(err)
	}
	checkFor(t, settle, gone(file(web2)))
	if b, _ := os.ReadFile(file(web1)); string(b) != value {
		t.Fatal("web1 lost its licence when web2's was taken away")
	}

	// Break-glass: the store, an export, and the plain age command.
	out := filepath.Join(t.TempDir(), "recovered")
	if r, err := m.c.SecretRecover(ctx, app.RecoverRequest{Licence: "translation", KeyFile: key, Out: out}); err != nil || !r.Recorded || r.Version != 1 {
		t.Fatalf("recover: %+v, %v", r, err)
	}
	if b, _ := os.ReadFile(out); string(b) != value {
		t.Fatalf("recovered %q", b)
	}
	export := filepath.Join(t.TempDir(), "export.json")
	if _, _, err := m.c.SecretExport(ctx, export); err != nil {
		t.Fatal(err)
	}
	var e app.Export
	b, _ := os.ReadFile(export)
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatal(err)
	}
	copyFile := filepath.Join(t.TempDir(), "copy.age")
	for _, l := range e.Licences {
		if l.Licence == "translation" && l.Kind == licences.KindOperator {
			os.WriteFile(copyFile, []byte(l.Sealed), 0o600)
		}
	}
	got, err := exec.Command("go", "tool", "age", "-d", "-i", key, copyFile).Output()
	if err != nil || string(got) != value {
		t.Fatalf("age -d: %q, %v", got, err)
	}

	// Unassigned: web1's licence is taken away with it.
	u, err := m.c.Unassign(ctx, "web1", []string{"translator"})
	if err != nil || len(u.Licences) != 1 {
		t.Fatalf("unassign: %+v, %v", u, err)
	}
	checkFor(t, settle, gone(file(web1)))
	if list, _ := m.c.LicenceList(ctx); len(list[0].Holders) != 0 {
		t.Fatalf("holders after unassign and stop: %v", list[0].Holders)
	}

	assertNowhere(t, m.c.DataDir, encodings)
	assertNowhere(t, filepath.Dir(export), encodings)
	for _, enc := range encodings {
		if strings.Contains(m.logs.String(), enc) || strings.Contains(outputs.String(), enc) {
			t.Fatal("the token was logged or printed")
		}
	}
}
