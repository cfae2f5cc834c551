package builder_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"mesh-controller/app/archive"
	"mesh-controller/app/builder"
	"mesh-controller/contexts/inventory/manifest"
)

// git runs the real git for the test's own repositories.
func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=test", "GIT_AUTHOR_EMAIL=test@example.org",
		"GIT_COMMITTER_NAME=test", "GIT_COMMITTER_EMAIL=test@example.org")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// repo is a bare repository the builder clones, and a work clone that
// commits to it.
type repo struct {
	t          *testing.T
	bare, work string
}

func newRepo(t *testing.T) *repo {
	base := t.TempDir()
	r := &repo{t: t, bare: filepath.Join(base, "hello.git"), work: filepath.Join(base, "work")}
	git(t, base, "init", "--quiet", "--bare", "--initial-branch=main", r.bare)
	git(t, base, "init", "--quiet", "--initial-branch=main", r.work)
	git(t, r.work, "remote", "add", "origin", r.bare)
	return r
}

// commit writes files (a value "->target" makes a symlink), commits them
// all, pushes main and returns the commit.
func (r *repo) commit(files map[string]string) string {
	r.t.Helper()
	for name, content := range files {
		p := filepath.Join(r.work, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.Remove(p)
		var err error
		if target, ok := strings.CutPrefix(content, "->"); ok {
			err = os.Symlink(target, p)
		} else {
			err = os.WriteFile(p, []byte(content), 0o644)
		}
		if err != nil {
			r.t.Fatal(err)
		}
	}
	git(r.t, r.work, "add", "-A")
	git(r.t, r.work, "commit", "--quiet", "--allow-empty", "-m", "change")
	git(r.t, r.work, "push", "--quiet", "origin", "HEAD:refs/heads/main")
	return git(r.t, r.work, "rev-parse", "HEAD")
}

// meshJSON is a valid mesh.json with the given build section.
func meshJSON(build string) string {
	return `{"module":"hello","version":"1.0.0","run":{"command":["bin/hello"]},"build":` + build + `}`
}

// helloBuild makes bin/hello printing word; a shell in the test's build
// command is fine, the builder itself uses none.
func helloBuild(word string) string {
	return fmt.Sprintf(`{"command":["sh","-c","echo building %[1]s; mkdir -p bin && printf '#!/bin/sh\\necho %[1]s\\n' > bin/hello && chmod +x bin/hello"],"outputs":["bin/"],"timeout":"1m"}`, word)
}

// harness is a Builder whose archives are files and whose progress lines
// are kept; watch, when set, sees each line as it comes.
type harness struct {
	b        *builder.Builder
	archives string
	mu       sync.Mutex
	lines    []string
	watch    func(line string)
}

func newHarness(t *testing.T) *harness {
	h := &harness{archives: t.TempDir()}
	h.b = &builder.Builder{
		WorkDir: filepath.Join(t.TempDir(), "work"),
		Node:    "builder-1",
		Progress: func(id, line string) {
			h.mu.Lock()
			h.lines = append(h.lines, id+" "+line)
			w := h.watch
			h.mu.Unlock()
			if w != nil {
				w(line)
			}
		},
		ArchiveTo: func(id string) (io.WriteCloser, error) {
			return os.Create(filepath.Join(h.archives, id+".tar.zst"))
		},
	}
	return h
}

// build runs one build and checks what every build must leave: an empty
// work dir, the outcome named after the ask and the node, a log tail.
func (h *harness) build(t *testing.T, ctx context.Context, a builder.Ask) builder.Outcome {
	t.Helper()
	o := h.b.Build(ctx, a)
	if des, err := os.ReadDir(h.b.WorkDir); err == nil && len(des) != 0 {
		t.Errorf("work dir holds %v after the build, want nothing", des)
	}
	if o.ID != a.ID || o.On != "builder-1" || o.Repository != manifest.RedactRepository(a.Repository) || o.Ref != a.Ref {
		t.Errorf("outcome names %q on %q of %q at %q, want the ask's", o.ID, o.On, o.Repository, o.Ref)
	}
	if len(o.LogTail) == 0 || len(o.LogTail) > builder.LogTailLines {
		t.Errorf("log tail of %d lines", len(o.LogTail))
	}
	if o.Failed && (o.Why == "" || strings.Contains(o.Why, "\n")) {
		t.Errorf("failed with why %q, want one line", o.Why)
	}
	return o
}

// checkArchive checks the archive written for id is the one the outcome
// names, and unpacks it.
func (h *harness) checkArchive(t *testing.T, o builder.Outcome) string {
	t.Helper()
	file := filepath.Join(h.archives, o.ID+".tar.zst")
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("archive: %v", err)
	}
	sum := sha256.Sum256(b)
	if hex.EncodeToString(sum[:]) != o.Digest || int64(len(b)) != o.Bytes {
		t.Fatalf("outcome names %s (%d bytes), the bytes written are %x (%d)", o.Digest, o.Bytes, sum, len(b))
	}
	// Unpacked held to what the outcome says it unpacks to: one byte off
	// either way is refused.
	if o.UnpackedBytes <= 0 {
		t.Fatalf("outcome says the archive unpacks to %d bytes", o.UnpackedBytes)
	}
	dest := filepath.Join(t.TempDir(), "hello", "1.0.0")
	if err := archive.UnpackSized(file, dest, o.UnpackedBytes); err != nil {
		t.Fatalf("unpack: %v", err)
	}
	return dest
}

func TestBuilder_Build(t *testing.T) {
	r := newRepo(t)
	mesh1 := meshJSON(helloBuild("hi"))
	first := r.commit(map[string]string{"mesh.json": mesh1, "README": "hello"})
	git(t, r.work, "tag", "v1")
	git(t, r.work, "push", "--quiet", "origin", "v1")
	mesh2 := meshJSON(helloBuild("hi2"))
	second := r.commit(map[string]string{"mesh.json": mesh2})
	h := newHarness(t)

	for _, tc := range []struct {
		name, ref, commit, word, mesh string
	}{
		{"branch", "main", second, "hi2", mesh2},
		{"default branch", "", second, "hi2", mesh2},
		{"refs/heads", "refs/heads/main", second, "hi2", mesh2},
		{"tag", "v1", first, "hi", mesh1},
		{"commit id", first, first, "hi", mesh1},
		{"short commit id", first[:10], first, "hi", mesh1},
		{"relative ref", "main~1", first, "hi", mesh1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "b-1-" + strings.NewReplacer(" ", "-", "/", "-").Replace(tc.name)
			o := h.build(t, t.Context(), builder.Ask{ID: id, Repository: r.bare, Ref: tc.ref})
			if o.Failed {
				t.Fatalf("failed: %s\n%s", o.Why, strings.Join(o.LogTail, "\n"))
			}
			if o.Commit != tc.commit || o.Module != "hello" || o.Version != "1.0.0" || o.DurationMS <= 0 {
				t.Fatalf("outcome %+v, want commit %s of hello 1.0.0", o, tc.commit)
			}
			if string(o.Manifest) != tc.mesh {
				t.Errorf("manifest %s, want %s", o.Manifest, tc.mesh)
			}
			if !slices.Contains(o.LogTail, "building "+tc.word) {
				t.Errorf("log tail lacks the build's output:\n%s", strings.Join(o.LogTail, "\n"))
			}
			dest := h.checkArchive(t, o)
			var got []string
			filepath.WalkDir(dest, func(p string, d os.DirEntry, err error) error {
				rel, _ := filepath.Rel(dest, p)
				info, _ := d.Info()
				got = append(got, fmt.Sprintf("%s %v", rel, info.Mode()))
				return nil
			})
			want := []string{". drwxr-xr-x", "bin drwxr-xr-x", "bin/hello -rwxr-xr-x", "mesh.json -rw-r--r--"}
			if !slices.Equal(got, want) {
				t.Fatalf("archive holds %q, want %q", got, want)
			}
			out, err := exec.Command(filepath.Join(dest, "bin/hello")).Output()
			if err != nil || strings.TrimSpace(string(out)) != tc.word {
				t.Fatalf("the built program says %q (%v), want %q", out, err, tc.word)
			}
			if m, _ := os.ReadFile(filepath.Join(dest, "mesh.json")); string(m) != tc.mesh {
				t.Fatalf("archived mesh.json %s", m)
			}
		})
	}

	t.Run("progress", func(t *testing.T) {
		h.mu.Lock()
		defer h.mu.Unlock()
		if !slices.Contains(h.lines, "b-1-branch building hi2") || !slices.ContainsFunc(h.lines, func(l string) bool {
			return strings.HasPrefix(l, "b-1-branch builder: git clone ")
		}) {
			t.Fatalf("progress lacks the build's output or steps: %q", h.lines)
		}
	})

	t.Run("dry run", func(t *testing.T) {
		o := h.build(t, t.Context(), builder.Ask{ID: "b-2-dry", Repository: r.bare, Ref: "v1", DryRun: true})
		if o.Failed || !o.DryRun || o.Digest == "" || o.Bytes == 0 {
			t.Fatalf("dry run: %+v", o)
		}
		if _, err := os.Stat(filepath.Join(h.archives, "b-2-dry.tar.zst")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a dry run wrote an archive: %v", err)
		}
		// The same commit packs to the same archive.
		again := h.build(t, t.Context(), builder.Ask{ID: "b-2-again", Repository: r.bare, Ref: first})
		if again.Digest != o.Digest {
			t.Fatalf("the same commit built twice: %s then %s", o.Digest, again.Digest)
		}
	})

	t.Run("environment", func(t *testing.T) {
		t.Setenv("BUILDER_SECRET", "do-not-leak")
		env := repoWith(t, meshJSON(`{"command":["sh","-c","echo env GREETING=$GREETING SECRET=${BUILDER_SECRET:-unset} HOME=$HOME; mkdir bin; : > bin/x"],"outputs":["bin"],"env":{"GREETING":"hello"}}`))
		o := h.build(t, t.Context(), builder.Ask{ID: "b-3-env", Repository: env})
		if o.Failed {
			t.Fatalf("failed: %s", o.Why)
		}
		i := slices.IndexFunc(o.LogTail, func(l string) bool { return strings.HasPrefix(l, "env ") })
		if i < 0 {
			t.Fatalf("no env line in %q", o.LogTail)
		}
		// HOME is the build's dir as its sandbox shows it, the same path
		// for every build.
		want := "env GREETING=hello SECRET=unset HOME=/tmp/build"
		if o.LogTail[i] != want {
			t.Fatalf("the build saw %q, want %q: only its declared env, PATH, HOME and TMPDIR", o.LogTail[i], want)
		}
	})
}

// repoWith is a new repository whose one commit holds mesh.json and files.
func repoWith(t *testing.T, mesh string, files ...string) string {
	r := newRepo(t)
	m := map[string]string{"README": "x"}
	if mesh != "" {
		m["mesh.json"] = mesh
	}
	for i := 0; i+1 < len(files); i += 2 {
		m[files[i]] = files[i+1]
	}
	r.commit(m)
	return r.bare
}

func TestBuilder_Failures(t *testing.T) {
	good := repoWith(t, meshJSON(helloBuild("hi")))
	owned := filepath.Join(t.TempDir(), "owned")
	invalid := `{"module":"Bad Name","version":"one","typo":true,"build":{"command":[],"outputs":["../x","/abs","bin/"],"timeout":"25h","env":{"PATH":"/x","bad name":"y"}}}`
	// A server that accepts and never answers: git must be given up on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var conns []net.Conn
	var connsMu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			connsMu.Lock()
			conns = append(conns, c)
			connsMu.Unlock()
		}
	}()
	t.Cleanup(func() {
		connsMu.Lock()
		defer connsMu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})

	for _, tc := range []struct {
		name       string
		repository string
		ref        string
		gitTimeout time.Duration
		why        []string // each in the why
		check      func(t *testing.T, o builder.Outcome)
	}{
		{name: "repository missing", repository: filepath.Join(t.TempDir(), "nope.git"),
			why: []string{"clone ", "git clone exited with status 128", "does not exist"}},
		// git ends with "and the repository exists.": the why is its line
		// that says why.
		{name: "repository not a repository", repository: "file://" + t.TempDir(),
			why: []string{"git clone exited with status 128: fatal: '", "' does not appear to be a git repository"},
			check: func(t *testing.T, o builder.Outcome) {
				if strings.Contains(o.Why, "repository exists") || strings.Contains(o.Why, "Could not read") {
					t.Fatalf("why %q is git's follow-up, not why", o.Why)
				}
			}},
		{name: "repository unreachable", repository: "http://127.0.0.1:1/hello.git",
			why: []string{"clone http://127.0.0.1:1/hello.git", "status 128"}},
		{name: "repository does not answer", repository: "http://" + ln.Addr().String() + "/hello.git", gitTimeout: time.Second,
			why: []string{"git clone took longer than 1s and was killed"}},
		{name: "repository credentials refused, hidden", repository: "http://user:hunter2@127.0.0.1:1/hello.git",
			why: []string{"repository http://***@127.0.0.1:1/hello.git holds a credential in its URL", "secret accept"},
			check: func(t *testing.T, o builder.Outcome) {
				if b, _ := json.Marshal(o); strings.Contains(string(b), "hunter2") {
					t.Fatalf("the password is in the outcome: %s", b)
				}
			}},
		{name: "repository token in the query refused", repository: "https://127.0.0.1:1/hello.git?private_token=hunter3",
			why: []string{"repository https://127.0.0.1:1/hello.git?private_token=*** holds a credential in its URL"}},
		{name: "repository is an option", repository: "--upload-pack=touch " + owned,
			why: []string{"starts with '-'"}},
		{name: "ref is an option", repository: good, ref: "--output=" + owned,
			why: []string{"starts with '-'"}},
		{name: "ref missing", repository: good, ref: "no-such-branch",
			why: []string{`ref "no-such-branch" is not a branch, tag or commit`}},
		{name: "no mesh.json", repository: repoWith(t, ""),
			why: []string{"no mesh.json"}},
		{name: "mesh.json a link", repository: repoWith(t, "->/etc/passwd"),
			why: []string{"mesh.json is not a regular file"}},
		{name: "mesh.json not JSON", repository: repoWith(t, "{"),
			why: []string{"mesh.json has 1 problem(s)", "not JSON"},
			check: func(t *testing.T, o builder.Outcome) {
				if o.Manifest != nil || len(o.Problems) != 1 {
					t.Fatalf("manifest %q, problems %q", o.Manifest, o.Problems)
				}
			}},
		{name: "mesh.json invalid", repository: repoWith(t, invalid),
			why: []string{"mesh.json has 9 problem(s), the first is typo: unknown field"},
			check: func(t *testing.T, o builder.Outcome) {
				// Exactly what module check says, every problem.
				_, ps := manifest.Parse([]byte(invalid))
				var want []string
				for _, p := range ps {
					want = append(want, p.String())
				}
				if !slices.Equal(o.Problems, want) {
					t.Fatalf("problems %q, want module check's %q", o.Problems, want)
				}
				for _, field := range []string{"module:", "version:", "typo:", "build.command:", "build.outputs[0]:",
					"build.outputs[1]:", "build.timeout:", "build.env.PATH:", "build.env.bad name:"} {
					if !slices.ContainsFunc(o.Problems, func(p string) bool { return strings.HasPrefix(p, field) }) {
						t.Errorf("no problem for %s in %q", field, o.Problems)
					}
				}
				if string(o.Manifest) != invalid {
					t.Errorf("manifest %s, want it as built", o.Manifest)
				}
			}},
		{name: "no build section", repository: repoWith(t, `{"module":"hello","version":"1.0.0"}`),
			why: []string{"no build section"}},
		{name: "command fails", repository: repoWith(t, meshJSON(`{"command":["sh","-c","for i in $(seq 1 200); do echo line $i; done; echo about to fail >&2; exit 3"],"outputs":["bin/"]}`)),
			why: []string{"build command sh exited with status 3", `(last line: "about to fail")`},
			check: func(t *testing.T, o builder.Outcome) {
				if len(o.LogTail) != builder.LogTailLines || !slices.Contains(o.LogTail, "line 200") || slices.Contains(o.LogTail, "line 100") {
					t.Fatalf("log tail of %d lines: %q", len(o.LogTail), o.LogTail)
				}
			}},
		{name: "command not found", repository: repoWith(t, meshJSON(`{"command":["no-such-program"],"outputs":["bin/"]}`)),
			why: []string{"build.command: no-such-program not found"}},
		{name: "script not executable", repository: repoWith(t, meshJSON(`{"command":["./build.sh"],"outputs":["bin/"]}`), "build.sh", "#!/bin/sh\n"),
			why: []string{"build.command: ./build.sh not found or not executable"}},
		{name: "outputs missing", repository: repoWith(t, meshJSON(`{"command":["mkdir","bin"],"outputs":["bin/","share/","lib/x"]}`)),
			why: []string{"the build did not make share/, lib/x"}},
		{name: "output a link", repository: repoWith(t, meshJSON(`{"command":["sh","-c","mkdir bin && ln -s /etc/passwd bin/passwd"],"outputs":["bin/"]}`)),
			why: []string{"pack the outputs: bin/passwd is a symlink"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.b.GitTimeout = tc.gitTimeout
			id := "b-9-" + strings.ReplaceAll(tc.name, " ", "-")
			o := h.build(t, t.Context(), builder.Ask{ID: id, Repository: tc.repository, Ref: tc.ref})
			if !o.Failed {
				t.Fatalf("did not fail: %+v", o)
			}
			t.Logf("why: %s", o.Why)
			for _, w := range tc.why {
				if !strings.Contains(o.Why, w) {
					t.Errorf("why %q lacks %q", o.Why, w)
				}
			}
			if o.Digest != "" {
				t.Errorf("a failed build names an archive %s", o.Digest)
			}
			if last := o.LogTail[len(o.LogTail)-1]; last != "builder: failed: "+o.Why {
				t.Errorf("log ends %q, want the why", last)
			}
			if tc.check != nil {
				tc.check(t, o)
			}
		})
	}
	if _, err := os.Stat(owned); err == nil {
		t.Fatalf("an option smuggled in as a repository or ref ran")
	}
}

// When git's own last word is only that it could not read the remote,
// the why is what ssh said before it.
func TestBuilder_WhySSHSaid(t *testing.T) {
	if _, err := exec.LookPath("ssh"); err != nil {
		t.Skip("no ssh on PATH")
	}
	h := newHarness(t)
	o := h.build(t, t.Context(), builder.Ask{ID: "b-11-ssh", Repository: "ssh://nohost.invalid/hello.git"})
	if !o.Failed || !strings.Contains(o.Why, "git clone exited with status 128: ssh: Could not resolve hostname nohost.invalid") {
		t.Fatalf("why %q, want ssh's line", o.Why)
	}
}

// A builder runs as its module's own user: a local repository another
// user owns is cloned all the same (git refuses one of "dubious
// ownership" unless told it is safe), bare or not, however it is named.
func TestBuilder_RepositoryOfAnotherUser(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to give the repository to another user")
	}
	r := newRepo(t)
	commit := r.commit(map[string]string{"mesh.json": meshJSON(helloBuild("theirs"))})
	link := filepath.Join(t.TempDir(), "link.git")
	if err := os.Symlink(r.bare, link); err != nil {
		t.Fatal(err)
	}
	// The link is theirs too: git judges a link by its own owner.
	for _, p := range []string{filepath.Dir(r.bare), link} {
		if err := exec.Command("chown", "-R", "-h", "65534:65534", p).Run(); err != nil {
			t.Fatal(err)
		}
	}
	// The builder's git reads its user's global config: an empty one here.
	home := t.TempDir()
	t.Setenv("HOME", home)
	plain := exec.Command("git", "clone", "--quiet", "--", r.bare, filepath.Join(home, "plain"))
	plain.Env = append(os.Environ(), "LC_ALL=C")
	if out, err := plain.CombinedOutput(); err == nil || !strings.Contains(string(out), "dubious ownership") {
		t.Skipf("this machine's git clones another user's repository without being told (%v): nothing to test\n%s", err, out)
	}
	h := newHarness(t)
	for _, tc := range []struct{ name, repository string }{
		{"bare", r.bare},
		{"trailing slash", r.bare + "/"},
		{"file URL", "file://" + r.bare},
		{"through a link", link},
		{"work tree", r.work},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := h.build(t, t.Context(), builder.Ask{ID: "b-10-" + strings.ReplaceAll(tc.name, " ", "-"), Repository: tc.repository})
			if o.Failed {
				t.Fatalf("failed: %s\n%s", o.Why, strings.Join(o.LogTail, "\n"))
			}
			if o.Commit != commit {
				t.Fatalf("built %s, want %s", o.Commit, commit)
			}
		})
	}
}

// marked lists the live processes (not zombies) whose environment holds
// MESH_TEST_MARK=mark: every process a build's command starts inherits
// its environment, whatever session, group or namespace it moves to.
func marked(mark string) []string {
	des, _ := os.ReadDir("/proc")
	var out []string
	for _, de := range des {
		if _, err := strconv.Atoi(de.Name()); err != nil {
			continue
		}
		env, err := os.ReadFile("/proc/" + de.Name() + "/environ")
		if err != nil || !slices.Contains(strings.Split(string(env), "\x00"), "MESH_TEST_MARK="+mark) {
			continue
		}
		if b, err := os.ReadFile("/proc/" + de.Name() + "/stat"); err == nil {
			s := string(b)
			if i := strings.LastIndexByte(s, ')'); i > 0 && len(s) > i+2 && s[i+2] != 'Z' && s[i+2] != 'X' {
				out = append(out, de.Name()+" "+s[strings.IndexByte(s, '(')+1:i])
			}
		}
	}
	return out
}

// markedBuild starts a build whose command (build, a build section
// holding MARK where its env goes) leaves processes running, and waits
// until at least want of them are seen.
func markedBuild(t *testing.T, h *harness, ctx context.Context, build string, want int) (string, <-chan builder.Outcome) {
	t.Helper()
	mark := fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())
	r := repoWith(t, meshJSON(strings.Replace(build, "MARK", `"env":{"MESH_TEST_MARK":"`+mark+`"}`, 1)))
	done := make(chan builder.Outcome, 1)
	go func() { done <- h.b.Build(ctx, builder.Ask{ID: "b-5-group", Repository: r}) }()
	deadline := time.Now().Add(20 * time.Second)
	for len(marked(mark)) < want {
		select {
		case o := <-done:
			t.Fatalf("build ended before its processes were seen: %s\n%s", o.Why, strings.Join(o.LogTail, "\n"))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the build's processes: %q, want %d", marked(mark), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return mark, done
}

// outcome waits for a build's outcome, with a deadline.
func outcome(t *testing.T, done <-chan builder.Outcome, within time.Duration) builder.Outcome {
	t.Helper()
	select {
	case o := <-done:
		return o
	case <-time.After(within):
		t.Fatalf("no outcome within %v", within)
	}
	return builder.Outcome{}
}

// checkGone checks nothing the build started runs and its work dir is empty.
func checkGone(t *testing.T, h *harness, mark string) {
	t.Helper()
	if left := marked(mark); len(left) != 0 {
		t.Errorf("%q still run after the build returned", left)
	}
	if des, _ := os.ReadDir(h.b.WorkDir); len(des) != 0 {
		t.Errorf("work dir holds %v", des)
	}
}

const sleeper = `["sh","-c","sleep 1000 & sleep 1000"]`

func TestBuilder_Timeout(t *testing.T) {
	h := newHarness(t)
	// The sleeper would run 1000 s: an outcome at all says the timeout
	// ended it.
	mark, done := markedBuild(t, h, t.Context(), `{"command":`+sleeper+`,"outputs":["bin/"],"timeout":"2s",MARK}`, 3)
	o := outcome(t, done, 30*time.Second)
	if !o.Failed || !strings.Contains(o.Why, "build outlived its timeout of 2s and was killed") {
		t.Fatalf("outcome: failed %v, why %q", o.Failed, o.Why)
	}
	checkGone(t, h, mark)
}

func TestBuilder_Killed(t *testing.T) {
	h := newHarness(t)
	ctx, kill := context.WithCancelCause(t.Context())
	defer kill(nil)
	mark, done := markedBuild(t, h, ctx, `{"command":`+sleeper+`,"outputs":["bin/"],"timeout":"1h",MARK}`, 3)
	kill(errors.New("killed by hand"))
	o := outcome(t, done, 15*time.Second)
	if !o.Failed || !strings.Contains(o.Why, "stopped: killed by hand") {
		t.Fatalf("outcome: failed %v, why %q", o.Failed, o.Why)
	}
	checkGone(t, h, mark)
}

// A build that succeeds leaves nothing running: what it started in the
// background dies with it, in its own session too (setsid), and a
// daemon that forks twice.
func TestBuilder_BackgroundKilled(t *testing.T) {
	h := newHarness(t)
	mark, done := markedBuild(t, h, t.Context(),
		`{"command":["sh","-c","sleep 1000 & setsid sleep 1000 & (setsid sh -c 'sleep 1000 & exit 0' &) ; sleep 1; mkdir bin; echo x > bin/x"],"outputs":["bin/"],MARK}`, 4)
	o := outcome(t, done, 30*time.Second)
	if o.Failed {
		t.Fatalf("failed: %s", o.Why)
	}
	checkGone(t, h, mark)
	h.checkArchive(t, o)
}

// The outcome is the wire's mesh.build.result body: its fields by name.
func TestOutcome_JSON(t *testing.T) {
	b, err := json.Marshal(builder.Outcome{ID: "b-1", Repository: "r", Commit: "c", On: "n", Failed: true, Why: "w",
		Manifest: json.RawMessage(`{"module":"m"}`), Digest: "d", Bytes: 3, DurationMS: 1.5, LogTail: []string{"l"}})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":"b-1","repository":"r","commit":"c","on":"n","failed":true,"why":"w","manifest":{"module":"m"},"digest":"d","bytes":3,"duration_ms":1.5,"log_tail":["l"]}`
	if string(b) != want {
		t.Fatalf("%s\nwant %s", b, want)
	}
}

func TestMain(m *testing.M) {
	builder.SandboxMain() // a build's first process, when this binary is re-executed as one
	if os.Getenv(asNobody) != "" {
		buildAsNobody()
	}
	os.Exit(m.Run())
}
