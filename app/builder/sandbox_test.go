package builder_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"mesh-controller/app/builder"
)

// hostile is a build that does what a repository taking over its builder
// would: looks for the builder's broker credentials in every process's
// environment and in the files named (the builder's own, as a host lays
// them out), plants a file in the builder's work dir, and leaves daemons
// behind in sessions of their own. It says LEAK for each thing it got,
// and "hostile: looked" once it looked; then it succeeds.
func hostile(workDir string, files ...string) string {
	return fmt.Sprintf(`set -u
n=0
for f in /proc/[0-9]*/environ; do
	n=$((n+1))
	if tr '\0' '\n' < "$f" 2>/dev/null | grep -q '^MESH_BROKER_CREDS=\|^BUILDER_SECRET='; then echo "LEAK environ $f"; fi
done
for f in %s; do
	if [ -n "$(head -c 64 "$f" 2>/dev/null)" ]; then echo "LEAK read $f"; fi
done
if touch %q/planted 2>/dev/null; then echo "LEAK planted in the work dir"; fi
if kill -0 1 2>/dev/null && [ "$(cat /proc/1/comm)" != sh ]; then echo "LEAK sees pid 1: $(cat /proc/1/comm)"; fi
(setsid sh -c 'while :; do sleep 0.05; done' >/dev/null 2>&1 &)
nohup sleep 1000 >/dev/null 2>&1 &
echo "hostile: looked in $n environments as uid $(id -u)"
mkdir -p bin && echo x > bin/x
`, strings.Join(quoteAll(files), " "), workDir)
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
	}
	return out
}

// builderFiles lays out what a builder holds that no build may read: a
// module dir with its broker credentials (readable by anyone here, to
// show the sandbox covers it, not its mode), and a file of the
// builder's own, 0600, beside it.
func builderFiles(t *testing.T, secret string) (moduleDir string, files []string) {
	// Others may enter every dir down to the module's: only the sandbox
	// keeps a build out. Not beneath /tmp, which a build's sandbox covers
	// whole: a host keeps its modules beneath /etc/mesh.
	base, err := os.MkdirTemp("/var/lib", "mesh-builder-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	moduleDir = filepath.Join(base, "etc", "mesh", "modules", "builder")
	if err := os.MkdirAll(filepath.Join(moduleDir, "secrets"), 0o755); err != nil {
		t.Fatal(err)
	}
	creds := filepath.Join(moduleDir, "broker.creds")
	own := filepath.Join(base, "state", "host.key")
	os.MkdirAll(filepath.Dir(own), 0o700)
	for _, f := range []struct {
		path string
		mode os.FileMode
	}{{creds, 0o644}, {filepath.Join(moduleDir, "secrets", "git-credentials"), 0o600}, {own, 0o600}} {
		if err := os.WriteFile(f.path, []byte(secret+"\n"), f.mode); err != nil {
			t.Fatal(err)
		}
	}
	return moduleDir, []string{creds, filepath.Join(moduleDir, "secrets", "git-credentials"), own}
}

// checkHostile checks a hostile build's outcome: it looked, got nothing,
// and nothing it started runs.
func checkHostile(t *testing.T, o builder.Outcome, workDir string) {
	t.Helper()
	if o.Failed {
		t.Fatalf("the hostile build failed: %s\n%s", o.Why, strings.Join(o.LogTail, "\n"))
	}
	log := strings.Join(o.LogTail, "\n")
	if !strings.Contains(log, "hostile: looked in") {
		t.Fatalf("the hostile build did not look:\n%s", log)
	}
	if strings.Contains(log, "LEAK") {
		t.Errorf("the build got what is the builder's:\n%s", log)
	}
	if _, err := os.Stat(filepath.Join(workDir, "planted")); err == nil {
		t.Errorf("the build planted a file in the builder's work dir")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := hostileLeft()
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the build returned, its daemons run: %q", left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// hostileLeft lists processes running the hostile build's daemon loop.
func hostileLeft() []string {
	des, _ := os.ReadDir("/proc")
	var out []string
	for _, de := range des {
		b, err := os.ReadFile("/proc/" + de.Name() + "/cmdline")
		if err == nil && strings.Contains(string(b), "while :; do sleep 0.05; done") {
			out = append(out, de.Name())
		}
	}
	return out
}

// A repository's build runs as a user of its own, in namespaces of its
// own: it reads neither the builder's environment nor its files, plants
// nothing in its work dir, and nothing it starts outlives the build; the
// next build, of a clean repository, is the builder's own.
func TestBuilder_HostileBuildTakesNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a root builder's sandbox: run as root (TestBuilder_SandboxUnprivileged is the other)")
	}
	const secret = "SUAEL6GG2L2HIF7DUGZJGMRUFKXELGGYFMHF76UO2AYBWRYZERPPV"
	t.Setenv("BUILDER_SECRET", secret)
	t.Setenv("MESH_BROKER_CREDS", "/the/builder/s/creds")
	h := newHarness(t)
	moduleDir, files := builderFiles(t, secret)
	h.b.Hide = []string{moduleDir}
	bad := repoWith(t, meshJSON(`{"command":["sh","hostile.sh"],"outputs":["bin/"]}`), "hostile.sh", hostile(h.b.WorkDir, files...))
	o := h.build(t, t.Context(), builder.Ask{ID: "b-6-hostile", Repository: bad})
	checkHostile(t, o, h.b.WorkDir)
	if !strings.Contains(strings.Join(o.LogTail, "\n"), "as throw-away uid") {
		t.Errorf("the log does not say whom the build ran as:\n%s", strings.Join(o.LogTail, "\n"))
	}
	good := h.build(t, t.Context(), builder.Ask{ID: "b-6-clean", Repository: repoWith(t, meshJSON(helloBuild("clean")))})
	if good.Failed || good.Module != "hello" {
		t.Fatalf("the next build: %+v", good)
	}
	if out, err := exec.Command(filepath.Join(h.checkArchive(t, good), "bin", "hello")).Output(); err != nil || string(out) != "clean\n" {
		t.Fatalf("the next build's program says %q (%v)", out, err)
	}
}

// asNobody is the environment variable that makes this test binary build
// one ask as the unprivileged user it was started as, and print the
// outcome (TestBuilder_SandboxUnprivileged).
const asNobody = "MESH_BUILDER_TEST_AS_NOBODY"

// nobodyAsk is what the test binary builds when started with asNobody.
type nobodyAsk struct {
	Work       string   `json:"work"`
	Hide       []string `json:"hide"`
	Repository string   `json:"repository"`
}

// buildAsNobody builds the ask in asNobody and prints its outcome.
func buildAsNobody() {
	var a nobodyAsk
	if err := json.Unmarshal([]byte(os.Getenv(asNobody)), &a); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	b := &builder.Builder{WorkDir: a.Work, Node: "builder-1", Hide: a.Hide}
	o := b.Build(context.Background(), builder.Ask{ID: "b-7-nobody", Repository: a.Repository, DryRun: true})
	json.NewEncoder(os.Stdout).Encode(o)
	os.Exit(0)
}

// A builder that is not root runs each build in a user namespace of its
// own: the kuid is its own, so what it owns is covered, and the hostile
// build gets nothing of it either.
func TestBuilder_SandboxUnprivileged(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("starts the builder as nobody: run as root")
	}
	const nobody = 65534
	const secret = "SUAHIDDENFROMTHEBUILDWHENTHEBUILDERISNOTROOTXYZ"
	// Everything nobody must reach is beneath dirs others may enter.
	base := t.TempDir()
	for _, d := range []string{filepath.Dir(base), base} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(base, "builder.test")
	if b, err := os.ReadFile(self); err != nil || os.WriteFile(bin, b, 0o755) != nil {
		t.Fatalf("copy the test binary: %v", err)
	}
	moduleDir, files := builderFiles(t, secret)
	// The builder's own, as a host gives them to its module's user; the
	// host's key stays the host's.
	for _, p := range []string{moduleDir, filepath.Dir(files[1]), files[0], files[1]} {
		if err := os.Lchown(p, nobody, nobody); err != nil {
			t.Fatal(err)
		}
	}
	work := filepath.Join(base, "work")
	if err := os.Mkdir(work, 0o700); err != nil || os.Chown(work, nobody, nobody) != nil {
		t.Fatalf("make the work dir: %v", err)
	}
	repo := repoWith(t, meshJSON(`{"command":["sh","hostile.sh"],"outputs":["bin/"]}`), "hostile.sh", hostile(work, files...))
	filepath.WalkDir(filepath.Dir(repo), func(p string, d os.DirEntry, err error) error {
		if err == nil {
			os.Chmod(p, map[bool]os.FileMode{true: 0o755, false: 0o644}[d.IsDir()])
			os.Lchown(p, nobody, nobody) // git clones only what its user owns
		}
		return nil
	})
	os.Chmod(filepath.Dir(filepath.Dir(repo)), 0o755)
	ask, _ := json.Marshal(nobodyAsk{Work: work, Hide: []string{moduleDir}, Repository: repo})
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = []string{asNobody + "=" + string(ask), "PATH=" + os.Getenv("PATH"), "HOME=" + moduleDir,
		"MESH_BROKER_CREDS=" + files[0], "BUILDER_SECRET=" + secret}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the builder as nobody: %v\n%s", err, out)
	}
	var o builder.Outcome
	if err := json.Unmarshal(out, &o); err != nil {
		t.Fatalf("its outcome: %v\n%s", err, out)
	}
	checkHostile(t, o, work)
	if !strings.Contains(strings.Join(o.LogTail, "\n"), "in a user namespace") {
		t.Errorf("the log does not say the build ran in a user namespace:\n%s", strings.Join(o.LogTail, "\n"))
	}
}
