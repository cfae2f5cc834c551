package e2e

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"filippo.io/age"

	"mesh-controller/app"
	"mesh-controller/app/protocol"
)

// knownValue is a random value whose every encoding a test can grep for.
func knownValue(t testing.TB) (string, []string) {
	t.Helper()
	var raw [24]byte
	rand.Read(raw[:])
	v := "licence-" + hex.EncodeToString(raw[:])
	return v, []string{v, base64.StdEncoding.EncodeToString([]byte(v)), base64.RawURLEncoding.EncodeToString([]byte(v)), hex.EncodeToString([]byte(v))}
}

// assertNowhere fails if any encoding of the value is in any file under dir.
func assertNowhere(t testing.TB, dir string, encodings []string) {
	t.Helper()
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		b, _ := os.ReadFile(path)
		for _, e := range encodings {
			if strings.Contains(string(b), e) {
				t.Errorf("%s holds the secret (as %q)", path, e)
			}
		}
		return nil
	})
}

func (m *testMesh) operatorKeyFile(t *testing.T) string {
	f := filepath.Join(t.TempDir(), "operator.key")
	if err := os.WriteFile(f, []byte(m.operator.String()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

func fileMode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

// The paperless example runs with its mesh-made admin_password and its
// person-accepted ocr_licence delivered to the host, recoverable by the
// operator key alone.
func TestSecrets_Paperless(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	web1, db1 := m.join("web1"), m.join("db1")
	ctx := context.Background()
	for _, n := range []string{"paperless", "postgres"} {
		m.addModule(example(n))
	}
	if _, err := m.c.Assign(ctx, "db1", []string{"postgres"}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.c.Assign(ctx, "web1", []string{"paperless"}); err != nil {
		t.Fatal(err)
	}
	secretsDir := filepath.Join(web1.root, "etc/mesh/modules/paperless/secrets")
	checkFor(t, settle, func() error {
		if _, err := os.Stat(filepath.Join(secretsDir, "admin_password")); err != nil {
			return fmt.Errorf("web1 has not received its mesh-made admin_password: %w", err)
		}
		return m.notBehind("web1")()
	})
	if mode := fileMode(t, filepath.Join(secretsDir, "admin_password")); mode != 0o600 {
		t.Fatalf("admin_password has mode %v", mode)
	}
	if b, _ := os.ReadFile(filepath.Join(secretsDir, "admin_password")); len(b) != 43 {
		t.Fatalf("admin_password is %d bytes, want 43 (32 random bytes, URL-safe base64)", len(b))
	}
	if _, err := os.Stat(filepath.Join(secretsDir, "ocr_licence")); !os.IsNotExist(err) {
		t.Fatal("ocr_licence written before a person gave it")
	}
	plan, err := m.c.PlanShow(ctx, "web1")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(plan.Plan.Reasons["paperless"], "|"), "waits for secrets: ocr_licence (a person gives it") {
		t.Fatalf("reasons: %v", plan.Plan.Reasons["paperless"])
	}
	if b, _ := os.ReadFile(filepath.Join(web1.root, "etc/mesh/modules/paperless/module.json")); !strings.Contains(string(b), `"waiting_for"`) {
		t.Fatalf("the declaration does not say paperless waits: %s", b)
	}

	// A host receives only its own node's sealed copies.
	st, err := m.c.Stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inv := st.Inventory
	checkOwnCopies := func(node string, id *age.X25519Identity) {
		d, err := inv.LatestDeclaration(ctx, node)
		if err != nil || d == nil {
			t.Fatal(err)
		}
		var decl protocol.Declaration
		json.Unmarshal([]byte(d.Body), &decl)
		for _, mod := range decl.Modules {
			for _, s := range mod.Secrets {
				if _, _, err := protocol.OpenSealed(s.Sealed, protocol.Label{Node: node, Module: mod.Module, Name: s.Name}, id); err != nil {
					t.Fatalf("%s's declaration carries %s/%s, not sealed for it: %v", node, mod.Module, s.Name, err)
				}
			}
		}
		if strings.Contains(d.Body, "superuser_password") != (node == "db1") {
			t.Fatalf("%s's declaration and postgres's superuser_password: %s", node, d.Body)
		}
	}
	checkOwnCopies("web1", web1.state.Age)
	checkOwnCopies("db1", db1.state.Age)

	// A person gives ocr_licence; the host gets the exact bytes, 0600.
	value, encodings := knownValue(t)
	if _, err := m.c.SecretAccept(ctx, "web1", "paperless", "ocr_licence", protocol.NewSecret([]byte(value))); err != nil {
		t.Fatal(err)
	}
	checkFor(t, settle, fileHolds(filepath.Join(secretsDir, "ocr_licence"), value))
	if mode := fileMode(t, filepath.Join(secretsDir, "ocr_licence")); mode != 0o600 {
		t.Fatalf("ocr_licence has mode %v", mode)
	}

	// Break-glass: from the store, and from an export, with the operator key alone.
	key := m.operatorKeyFile(t)
	out := filepath.Join(t.TempDir(), "recovered")
	r, err := m.c.SecretRecover(ctx, app.RecoverRequest{Node: "web1", Module: "paperless", Name: "ocr_licence", KeyFile: key, Out: out})
	if err != nil || !r.Recorded {
		t.Fatalf("recover: %+v, %v", r, err)
	}
	if b, _ := os.ReadFile(out); string(b) != value || fileMode(t, out) != 0o600 {
		t.Fatalf("recovered %q mode %v", b, fileMode(t, out))
	}
	acts, _ := st.Health.HandActs(ctx, time.Time{})
	if len(acts) == 0 || !strings.Contains(acts[0].What, "secret recover web1/paperless/ocr_licence") || acts[0].Who == "" {
		t.Fatalf("hand acts: %+v", acts)
	}
	export := filepath.Join(t.TempDir(), "export.json")
	if _, n, err := m.c.SecretExport(ctx, export); err != nil || n != 4 { // admin_password, superuser_password, ocr_licence, and web1/paperless's postgres credential
		t.Fatalf("export: %d, %v", n, err)
	}
	if fileMode(t, export) != 0o600 {
		t.Fatal("export is not 0600")
	}
	out2 := filepath.Join(t.TempDir(), "from-export")
	if _, err := m.c.SecretRecover(ctx, app.RecoverRequest{Node: "web1", Module: "paperless", Name: "ocr_licence", KeyFile: key, Out: out2, FromExport: export}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(out2); string(b) != value {
		t.Fatalf("recovered from the export: %q", b)
	}

	// The plain age command opens a copy from the export with the operator key file.
	var e app.Export
	b, _ := os.ReadFile(export)
	json.Unmarshal(b, &e)
	copyFile := filepath.Join(t.TempDir(), "copy.age")
	for _, s := range e.Secrets {
		if s.Name == "ocr_licence" {
			os.WriteFile(copyFile, []byte(s.Sealed), 0o600)
		}
	}
	got, err := exec.Command("go", "tool", "age", "-d", "-i", key, copyFile).Output()
	if err != nil || string(got) != value {
		t.Fatalf("age -d: %q, %v", got, err)
	}

	// The value is in no file under the data dir, no log line, and not in the export.
	assertNowhere(t, m.c.DataDir, encodings)
	assertNowhere(t, filepath.Dir(export), encodings)
	for _, e := range encodings {
		if strings.Contains(m.logs.String(), e) {
			t.Fatal("the daemon logged the secret")
		}
	}
}

// paperlessOn joins a node and puts paperless and postgres on it.
func paperlessOn(t *testing.T, node string) *testMesh {
	m := newTestMesh(t)
	m.join(node)
	m.addModule(example("paperless"))
	m.addModule(example("postgres"))
	if _, err := m.c.Assign(context.Background(), node, []string{"paperless", "postgres"}); err != nil {
		t.Fatal(err)
	}
	return m
}

// Recovering refuses what it must, with one error and no file left behind.
func TestSecrets_RecoverRefusals(t *testing.T) {
	t.Parallel()
	m := paperlessOn(t, "web1")
	ctx := context.Background()
	if _, err := m.c.SecretAccept(ctx, "web1", "paperless", "ocr_licence", protocol.NewSecret([]byte("x"))); err != nil {
		t.Fatal(err)
	}
	key := m.operatorKeyFile(t)
	dir := t.TempDir()
	export := filepath.Join(dir, "export.json")
	if _, _, err := m.c.SecretExport(ctx, export); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(export)
	tampered := filepath.Join(dir, "tampered.json")
	var e app.Export
	json.Unmarshal(b, &e)
	for i := range e.Secrets {
		lines := strings.Split(e.Secrets[i].Sealed, "\n")
		line := []byte(lines[3])
		line[10] ^= 1
		lines[3] = string(line)
		e.Secrets[i].Sealed = strings.Join(lines, "\n")
	}
	tb, _ := json.Marshal(e)
	os.WriteFile(tampered, tb, 0o600)
	notExport := filepath.Join(dir, "notes.json")
	os.WriteFile(notExport, []byte(`{"hello": "world"}`), 0o600)
	other, _ := age.GenerateX25519Identity()
	wrongKey := filepath.Join(dir, "wrong.key")
	os.WriteFile(wrongKey, []byte(other.String()+"\n"), 0o600)
	notKey := filepath.Join(dir, "not.key")
	os.WriteFile(notKey, []byte("not a key\n"), 0o600)
	existing := filepath.Join(dir, "existing")
	os.WriteFile(existing, []byte("keep me"), 0o600)
	link := filepath.Join(dir, "link")
	os.Symlink(filepath.Join(dir, "target"), link)

	req := func(r app.RecoverRequest) app.RecoverRequest {
		r.Node, r.Module, r.Name = "web1", "paperless", "ocr_licence"
		if r.KeyFile == "" {
			r.KeyFile = key
		}
		if r.Out == "" {
			r.Out = filepath.Join(dir, "out")
		}
		return r
	}
	for name, c := range map[string]struct {
		r    app.RecoverRequest
		want string
	}{
		"existing out":     {req(app.RecoverRequest{Out: existing}), "exists already"},
		"symlink out":      {req(app.RecoverRequest{Out: link}), "exists already"},
		"wrong key":        {req(app.RecoverRequest{KeyFile: wrongKey}), "does not open this copy: it is sealed to another operator key"},
		"not a key":        {req(app.RecoverRequest{KeyFile: notKey}), "holds no age identity"},
		"tampered":         {req(app.RecoverRequest{FromExport: tampered}), "open the sealed copy"},
		"not an export":    {req(app.RecoverRequest{FromExport: notExport}), "is not a secret export"},
		"not in the store": {app.RecoverRequest{Node: "web1", Module: "paperless", Name: "nosuch", KeyFile: key, Out: filepath.Join(dir, "out")}, "no sealed copy"},
	} {
		_, err := m.c.SecretRecover(context.Background(), c.r)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: got %v, want %q", name, err, c.want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "out")); !os.IsNotExist(err) {
		t.Fatal("a failed recovery left a file behind")
	}
	if _, err := os.Lstat(filepath.Join(dir, "target")); !os.IsNotExist(err) {
		t.Fatal("a recovery followed a symbolic link")
	}
	if b, _ := os.ReadFile(existing); string(b) != "keep me" {
		t.Fatal("an existing file was overwritten")
	}
}

// A person's secret is refused for a node that has not joined, for a secret
// the manifest does not name, and for one the mesh makes.
func TestSecrets_AcceptRefusals(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	m.join("web1")
	ctx := context.Background()
	m.addModule(example("paperless"))
	m.addModule(example("postgres"))
	if _, err := m.c.NodeAdd(ctx, "web2", false); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"web1", "web2"} {
		if _, err := m.c.Assign(ctx, n, []string{"paperless", "postgres"}); err != nil {
			t.Fatal(err)
		}
	}
	v := protocol.NewSecret([]byte("x"))
	for want, args := range map[error][3]string{
		app.ErrNotJoined:      {"web2", "paperless", "ocr_licence"},
		app.ErrSecretNotNamed: {"web1", "paperless", "nosuch"},
		app.ErrMadeByMesh:     {"web1", "paperless", "admin_password"},
		app.ErrNotOnNode:      {"web1", "smtp-relay", "upstream_password"},
	} {
		if _, err := m.c.SecretAccept(ctx, args[0], args[1], args[2], v); !errors.Is(err, want) {
			t.Errorf("%v: got %v, want %v", args, err, want)
		}
	}
	if _, err := m.c.SecretAccept(ctx, "web1", "paperless", "ocr_licence", protocol.NewSecret(nil)); !errors.Is(err, app.ErrEmptySecret) {
		t.Errorf("empty: %v", err)
	}
}

// Replacing the operator key: copies sealed to the old key are counted as
// recoverable only by it, until each secret is made or accepted again.
func TestSecrets_ReplaceOperatorKey(t *testing.T) {
	t.Parallel()
	m := paperlessOn(t, "web1")
	ctx := context.Background()
	if _, err := m.c.SecretAccept(ctx, "web1", "paperless", "ocr_licence", protocol.NewSecret([]byte("v1"))); err != nil {
		t.Fatal(err)
	}
	v, err := m.c.OperatorKeyShow(ctx)
	if err != nil || v.Recoverable != 4 || v.OnlyOlderKeys != 0 {
		t.Fatalf("before: %+v, %v", v, err)
	}
	next, _ := age.GenerateX25519Identity()
	if _, err := m.c.OperatorKeySet(ctx, next.Recipient().String(), false); err == nil {
		t.Fatal("a second key was set without replace")
	}
	prev, err := m.c.OperatorKeySet(ctx, next.Recipient().String(), true)
	if err != nil || prev != m.operator.Recipient().String() {
		t.Fatalf("replace: %q, %v", prev, err)
	}
	if v, _ = m.c.OperatorKeyShow(ctx); v.Recoverable != 0 || v.OnlyOlderKeys != 4 {
		t.Fatalf("after replacing: %+v", v)
	}
	if _, err := m.c.SecretAccept(ctx, "web1", "paperless", "ocr_licence", protocol.NewSecret([]byte("v2"))); err != nil {
		t.Fatal(err)
	}
	if v, _ = m.c.OperatorKeyShow(ctx); v.Recoverable != 1 || v.OnlyOlderKeys != 3 {
		t.Fatalf("after accepting again: %+v", v)
	}
	// The new key opens the new copy; the old key no longer does.
	newKey := filepath.Join(t.TempDir(), "new.key")
	os.WriteFile(newKey, []byte(next.String()+"\n"), 0o600)
	out := filepath.Join(t.TempDir(), "v2")
	if _, err := m.c.SecretRecover(ctx, app.RecoverRequest{Node: "web1", Module: "paperless", Name: "ocr_licence", KeyFile: newKey, Out: out}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(out); string(b) != "v2" {
		t.Fatalf("recovered %q", b)
	}
	if _, err := m.c.SecretRecover(ctx, app.RecoverRequest{Node: "web1", Module: "paperless", Name: "ocr_licence", KeyFile: m.operatorKeyFile(t),
		Out: filepath.Join(t.TempDir(), "x")}); !errors.Is(err, app.ErrWrongOperatorKey) {
		t.Fatalf("the old key: %v", err)
	}
}
