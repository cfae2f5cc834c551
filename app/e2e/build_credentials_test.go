package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"mesh-controller/app"
	"mesh-controller/app/builder/gittest"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/builds"
	"mesh-controller/contexts/inventory"
)

// A git token never reaches a store, the daemon's log or an output. A
// repository URL holding one is refused by build, by module add --source
// and in a manifest's source, saying how to give it to the builder
// instead; a private repository is built through the builder's
// git-credentials secret; and an ask kept with a credential before the
// refusal (written here straight into the store) is listed, logged and
// handed to the builder redacted, which refuses it, and cannot be asked
// again. Real daemon, real host running the real mesh-builder, a real git
// server that wants the token.
func TestBuild_RepositoryCredentialsNeverKept(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	ctx := context.Background()
	secret := func(prefix string) string {
		var raw [16]byte
		rand.Read(raw[:])
		return prefix + hex.EncodeToString(raw[:])
	}
	token, old := secret("tok-"), secret("old-")
	url := gittest.PrivateRepo(t, scriptRepo(t, "private", "mkdir -p bin && : > bin/x"), "ci", token)
	withToken := strings.Replace(url, "http://", "http://ci:"+token+"@", 1)

	var outputs bytes.Buffer // everything a person was shown
	show := func(v ...any) {
		for _, x := range v {
			if err, ok := x.(error); ok && err != nil {
				outputs.WriteString(err.Error() + "\n")
				continue
			}
			b, _ := json.Marshal(x)
			outputs.Write(append(b, '\n'))
		}
	}
	progress := func(l string) { outputs.WriteString(l + "\n") }

	for _, repo := range []string{withToken, url + "?private_token=" + token, "https://" + token + "@git.example/private"} {
		_, err := m.c.Build(ctx, app.BuildRequest{Repository: repo, Progress: progress})
		if !errors.Is(err, inventory.ErrRepositoryCredential) {
			t.Fatalf("build %s: %v, want refused", inventory.RedactRepository(repo), err)
		}
		show(err)
	}
	plain := writeManifest(t, `{"module": "private", "version": "0.1.0", "data": [{"name": "d", "path": "/d", "precious": "rebuildable"}]}`)
	_, err := m.c.ModuleAdd(ctx, plain, withToken)
	if !errors.Is(err, inventory.ErrRepositoryCredential) {
		t.Fatalf("module add --source with a token: %v", err)
	}
	show(err)
	_, err = m.c.ModuleAdd(ctx, writeManifest(t, `{"module": "private", "version": "0.1.0", "source": "`+withToken+`",
		"data": [{"name": "d", "path": "/d", "precious": "rebuildable"}]}`), "")
	if err == nil || !strings.Contains(err.Error(), "source") {
		t.Fatalf("a manifest whose source holds a token: %v", err)
	}
	show(err)
	if as, err := m.c.BuildsList(ctx, ""); err != nil || len(as) != 0 {
		t.Fatalf("refused asks were kept: %+v %v", as, err)
	}

	// The builder declares the secret; a person gives it.
	h := m.join("b1")
	m.addModule(writeManifest(t, `{"module": "builder", "version": "1.0.0", "run": {"command": ["`+buildBuilder(t)+`"], "ready": {"after": "300ms"}},
		"seats": [{"seat": "build", "delivers": "builds of module sources", "replicated": true}],
		"secrets": [{"name": "git-credentials", "made_by": "person"}],
		"data": [{"name": "work", "path": "/var/lib/builder/work", "precious": "rebuildable"}]}`))
	if _, err := m.c.Assign(ctx, "b1", []string{"builder"}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.c.SecretAccept(ctx, "b1", "builder", inventory.GitCredentialsSecret, protocol.NewSecret([]byte(withToken+"\n"))); err != nil {
		t.Fatal(err)
	}
	checkFor(t, settle, m.moduleIn("b1", "builder", protocol.StateReady))
	a, err := m.c.Build(ctx, app.BuildRequest{Repository: url, Progress: progress})
	if err != nil || !a.Registered || a.Repository != url {
		t.Fatalf("the private repository through the secret: %+v %v\n%s", a, err, m.logs)
	}
	show(a)

	// Asks kept before the refusal: one the builder is handed, one
	// cancelled by hand.
	st, err := m.c.Stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	oldURL := "https://ci:" + old + "@127.0.0.1:1/kept.git?access_token=" + old
	kept, err := st.Builds.Enqueue(ctx, builds.Ask{ID: builds.NewID(time.Now()), Repository: oldURL}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	m.c.KickBuilds(ctx, st)
	checkFor(t, settle, func() error {
		got, err := st.Builds.Get(ctx, kept.ID)
		if err == nil && got.State != builds.Failed {
			err = fmt.Errorf("the kept ask is %s, not refused by the builder: %s", got.State, got.Why)
		}
		return err
	})
	got := m.ask(t, kept.ID)
	if !strings.Contains(got.Why, "holds a credential") {
		t.Fatalf("the builder took the kept ask: %+v", got)
	}
	if _, _, err := m.c.BuildPause(ctx, "", "the next is cancelled"); err != nil {
		t.Fatal(err)
	}
	waiting, err := st.Builds.Enqueue(ctx, builds.Ask{ID: builds.NewID(time.Now()), Repository: oldURL}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	show(m.c.BuildsList(ctx, ""))
	show(m.c.BuildQueue(ctx))
	show(m.c.BuildCancel(ctx, waiting.ID, "kept with a token"))
	show(m.c.Rebuild(ctx, kept.ID, app.BuildRequest{Progress: progress}))
	show(m.c.HandActs(ctx, 1))
	show(m.c.ModuleList(ctx))
	show(m.c.BuildPlans(ctx))
	if _, err := m.c.SelfCheck(ctx, app.CheckOptions{}); err != nil {
		t.Fatal(err)
	}
	show(m.c.Conditions(ctx, app.ConditionFilter{}))
	if !strings.Contains(outputs.String(), "https://***@127.0.0.1:1/kept.git?access_token=***") {
		t.Fatalf("the kept ask is not shown redacted:\n%s", outputs.String())
	}

	// The scan: outputs, the daemon's log, every store file, everything the
	// builder's host wrote but the secret's own file.
	m.stop()
	h.stop()
	for _, v := range []string{token, old} {
		if strings.Contains(outputs.String(), v) {
			t.Errorf("an output holds %s:\n%s", v, outputs.String())
		}
		if strings.Contains(m.logs.String(), v) {
			t.Errorf("the daemon's log holds %s:\n%s", v, m.logs.String())
		}
	}
	secretFile := filepath.Join(h.root, protocol.ModulesDir, "builder", "secrets", inventory.GitCredentialsSecret)
	if b, err := os.ReadFile(secretFile); err != nil || !bytes.Contains(b, []byte(token)) {
		t.Fatalf("the builder's secret file: %q %v", b, err)
	}
	scan := func(dir string, values ...string) {
		filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || path == secretFile {
				return nil
			}
			b, _ := os.ReadFile(path)
			for _, v := range values {
				if bytes.Contains(b, []byte(v)) {
					t.Errorf("%s holds %s", path, v)
				}
			}
			return nil
		})
	}
	scan(m.c.DataDir, token) // the kept asks hold old: they were written so
	scan(filepath.Dir(h.root), token, old)
}
