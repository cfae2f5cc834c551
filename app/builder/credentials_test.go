package builder_test

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"mesh-controller/app/builder"
	"mesh-controller/app/builder/gittest"
)

// A private repository over HTTPS (here HTTP on loopback) is reached
// through the builder's git-credentials secret, never a URL holding the
// token: without the secret the clone is refused; with it the build
// succeeds, and the token is in no outcome, log line or archive, and the
// build command was told nothing of it (neither the file nor git's
// config).
func TestBuilder_GitCredentials(t *testing.T) {
	var raw [16]byte
	rand.Read(raw[:])
	token := "tok-" + hex.EncodeToString(raw[:])
	r := newRepo(t)
	r.commit(map[string]string{"mesh.json": meshJSON(`{"command":["sh","-c","mkdir -p bin && env > bin/env && : > bin/hello"],"outputs":["bin/"]}`)})
	url := gittest.PrivateRepo(t, r.bare, "ci", token)

	h := newHarness(t)
	o := h.build(t, t.Context(), builder.Ask{ID: "b-1-no-secret", Repository: url})
	if !o.Failed || !strings.Contains(o.Why, "clone "+url) {
		t.Fatalf("without the secret: %+v", o)
	}

	secrets := t.TempDir()
	file := filepath.Join(secrets, "git-credentials")
	if err := os.WriteFile(file, []byte(strings.Replace(url, "http://", "http://ci:"+token+"@", 1)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	h.b.GitCredentials = file
	o = h.build(t, t.Context(), builder.Ask{ID: "b-2-secret", Repository: url})
	if o.Failed {
		t.Fatalf("with the secret: %s\n%s", o.Why, strings.Join(o.LogTail, "\n"))
	}
	dest := h.checkArchive(t, o)
	env, err := os.ReadFile(filepath.Join(dest, "bin", "env"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(env), "GIT_CONFIG") || strings.Contains(string(env), secrets) {
		t.Errorf("the build command was told of the credential helper:\n%s", env)
	}
	b, _ := json.Marshal(o)
	h.mu.Lock()
	lines := strings.Join(h.lines, "\n")
	h.mu.Unlock()
	filepath.WalkDir(h.archives, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if a, _ := os.ReadFile(p); strings.Contains(string(a), token) {
				t.Errorf("the archive %s holds the token", p)
			}
		}
		return nil
	})
	if strings.Contains(string(b), token) || strings.Contains(lines, token) {
		t.Fatalf("the token is in the outcome or the log:\n%s\n%s", b, lines)
	}
	// git's store and erase leave the secret's file as the host wrote it.
	if got, _ := os.ReadFile(file); !strings.Contains(string(got), token) {
		t.Fatalf("the secret's file changed: %q", got)
	}

	// A wrong token: refused by the server, the file unchanged.
	if err := os.WriteFile(file, []byte(strings.Replace(url, "http://", "http://ci:wrong@", 1)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o = h.build(t, t.Context(), builder.Ask{ID: "b-3-wrong", Repository: url})
	if !o.Failed {
		t.Fatalf("a wrong token built: %+v", o)
	}
	if got, _ := os.ReadFile(file); !strings.Contains(string(got), "ci:wrong@") {
		t.Fatalf("git erased the secret's line after a refusal: %q", got)
	}
}
