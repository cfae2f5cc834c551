package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"mesh-controller/app/host"
)

// A known random value accepted as a secret appears in no file under the
// data dir (stores, WAL files), in no output and no log line, and not in an
// export — also after the daemon is killed with SIGKILL while it is being
// accepted; and so does a licence's token, and a git token tried in a
// repository URL. Real binary, real daemon, a real
// joined host.
func TestSecretAccept_NoPlaintextAnywhere(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	data, work := t.TempDir(), t.TempDir()
	var outputs bytes.Buffer
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(bin, append([]string{"--data", data}, args...)...)
		cmd.Dir = work
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		outputs.Write(stdout.Bytes())
		outputs.Write(stderr.Bytes())
		if err != nil {
			t.Fatalf("%v: %v\n%s%s", args, err, stdout.String(), stderr.String())
		}
		return stdout.String()
	}
	run("migrate")
	public := strings.TrimSpace(run("operator", "key", "make", "--out", "op.key"))
	run("operator", "key", "set", public)
	examples, err := filepath.Abs(filepath.Join("..", "..", "contexts", "inventory", "testdata"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"paperless", "postgres"} {
		run("module", "add", filepath.Join(examples, m+".json"))
	}
	serve, serveErr := startServe(t, bin, data)
	defer serve.Process.Kill()
	token := strings.TrimSpace(run("token", "issue", "--new", "web1"))
	url := regexp.MustCompile(`nats://127\.0\.0\.1:\d+`).FindString(run("broker", "show"))
	if _, err := host.Join(context.Background(), host.JoinOptions{Broker: url, Token: token, Node: "web1", State: filepath.Join(work, "web1")}); err != nil {
		t.Fatal(err)
	}
	run("assign", "web1", "paperless", "postgres")

	// A git token in a repository URL is refused, before anything keeps it.
	var rawToken [24]byte
	rand.Read(rawToken[:])
	gitToken := "ghp_" + hex.EncodeToString(rawToken[:])
	for _, args := range [][]string{{"build", "https://ci:" + gitToken + "@git.example/mesh/greeter"},
		{"build", "https://git.example/mesh/greeter?private_token=" + gitToken, "--no-wait"},
		{"module", "add", filepath.Join(examples, "paperless.json"), "--source", "https://" + gitToken + "@git.example/paperless"}} {
		cmd := exec.Command(bin, append([]string{"--data", data}, args...)...)
		cmd.Dir = work
		out, err := cmd.CombinedOutput()
		outputs.Write(out)
		if err == nil || !strings.Contains(string(out), "holds a credential in its URL") {
			t.Fatalf("%s %s: %v, want refused:\n%s", args[0], args[1], err, out)
		}
	}

	var raw [24]byte
	rand.Read(raw[:])
	value := "licence-" + hex.EncodeToString(raw[:])
	encodings := []string{value, base64.StdEncoding.EncodeToString([]byte(value)), base64.RawURLEncoding.EncodeToString([]byte(value)), hex.EncodeToString([]byte(value)), gitToken}
	if err := os.WriteFile(filepath.Join(work, "value.txt"), []byte(value), 0o600); err != nil {
		t.Fatal(err)
	}
	// Accept, and kill the daemon with SIGKILL while it happens.
	accept := exec.Command(bin, "--data", data, "secret", "accept", "web1", "paperless", "ocr_licence", "--from", "value.txt")
	accept.Dir = work
	var acceptOut bytes.Buffer
	accept.Stdout, accept.Stderr = &acceptOut, &acceptOut
	if err := accept.Start(); err != nil {
		t.Fatal(err)
	}
	serve.Process.Signal(syscall.SIGKILL)
	if err := accept.Wait(); err != nil {
		t.Fatalf("accept: %v\n%s", err, acceptOut.String())
	}
	serve.Wait()
	outputs.Write(acceptOut.Bytes())
	outputs.Write(serveErr.Bytes())
	os.Remove(filepath.Join(work, "value.txt"))

	run("secret", "export", "--out", "export.json")
	run("secret", "export")
	if !strings.Contains(run("secret", "recover", "web1", "paperless", "ocr_licence", "--key", "op.key", "--out", "recovered"), "written to recovered") {
		t.Fatal("recover said nothing")
	}
	if b, _ := os.ReadFile(filepath.Join(work, "recovered")); string(b) != value {
		t.Fatalf("recovered %q", b)
	}
	os.Remove(filepath.Join(work, "recovered"))

	// A licence's token is kept the same way: added, held by a module
	// (opened with the operator key, which stays in its file), listed,
	// exported and recovered, and in no store, output or export.
	rand.Read(raw[:])
	lt := "licence-token-" + hex.EncodeToString(raw[:])
	encodings = append(encodings, lt, base64.StdEncoding.EncodeToString([]byte(lt)), base64.RawURLEncoding.EncodeToString([]byte(lt)), hex.EncodeToString([]byte(lt)))
	if err := os.WriteFile(filepath.Join(work, "token.txt"), []byte(lt), 0o600); err != nil {
		t.Fatal(err)
	}
	run("licence", "add", "translation", "--provider", "deepl", "--from", "token.txt", "--expires", "90d")
	os.Remove(filepath.Join(work, "token.txt"))
	run("licence", "use", "translation", "web1/paperless", "--key", "op.key")
	run("licence", "list")
	run("licence", "list", "--json")
	run("licence", "key", "translation")
	run("plan", "web1", "--json")
	run("secret", "export")
	run("secret", "recover", "--licence", "translation", "--key", "op.key", "--out", "recovered")
	if b, _ := os.ReadFile(filepath.Join(work, "recovered")); string(b) != lt {
		t.Fatalf("recovered licence %q", b)
	}
	os.Remove(filepath.Join(work, "recovered"))

	for _, e := range encodings {
		if strings.Contains(outputs.String(), e) {
			t.Fatalf("an output or log line holds the secret (as %q)", e)
		}
	}
	for _, dir := range []string{data, work} {
		filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || strings.HasPrefix(path, filepath.Join(work, "web1")) {
				return nil
			}
			b, _ := os.ReadFile(path)
			for _, e := range encodings {
				if bytes.Contains(b, []byte(e)) {
					t.Errorf("%s holds the secret (as %q)", path, e)
				}
			}
			return nil
		})
	}
	// The operator's private key is in its file and nowhere under the data dir.
	key, _ := os.ReadFile(filepath.Join(work, "op.key"))
	secretLine := regexp.MustCompile(`AGE-SECRET-KEY-1[A-Z0-9]+`).Find(key)
	filepath.WalkDir(data, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if b, _ := os.ReadFile(path); bytes.Contains(b, secretLine) {
				t.Errorf("%s holds the operator's private key", path)
			}
		}
		return nil
	})
}
