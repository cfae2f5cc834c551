package builder

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"mesh-controller/contexts/inventory/manifest"
)

// DefaultGitTimeout bounds clone, checkout and every other git step of
// one build together, unless Builder.GitTimeout says otherwise: a
// repository that cannot be fetched in that time is reported, not waited on.
const DefaultGitTimeout = 10 * time.Minute

// maxGitOutput bounds what is kept of a git command's standard output
// (a commit id is all that is read of it).
const maxGitOutput = 64 << 10

// gitFailed is a git command that ran and exited non-zero.
type gitFailed struct {
	args   []string
	status int
	why    string // the line of its stderr that says why
}

func (g *gitFailed) Error() string {
	s := fmt.Sprintf("git %s exited with status %d", subcommand(g.args), g.status)
	if g.why != "" {
		s += ": " + manifest.RedactText(g.why)
	}
	return s
}

// git runs one git command in dir, its stderr into the log, and returns
// its stdout. The error is one line: git missing, past the deadline,
// stopped by ctx, or a *gitFailed.
func (b *Builder) git(ctx context.Context, deadline time.Time, lg *buildLog, dir string, args ...string) (string, error) {
	prog, err := lookPath("git", dir, b.path())
	if err != nil {
		return "", fmt.Errorf("git is not on the builder's PATH (%s): install git", b.path())
	}
	left := time.Until(deadline)
	if left <= 0 {
		return "", fmt.Errorf("git took longer than %v: try again later, or raise the builder's git timeout", b.gitTimeout())
	}
	var out, errs tailBuffer
	out.max, errs.max = maxGitOutput, 4096
	home, _ := os.UserHomeDir()
	if home == "" {
		home = dir
	}
	env := []string{
		"PATH=" + b.path(),
		// The builder's own home: its ssh keys and git credentials are how
		// a private repository is reached.
		"HOME=" + home,
		"GIT_TERMINAL_PROMPT=0",
		"LC_ALL=C", // messages in one language, for the outcome's why
	}
	if sock := os.Getenv("SSH_AUTH_SOCK"); sock != "" {
		env = append(env, "SSH_AUTH_SOCK="+sock)
	}
	env = append(env, b.credentialHelper(prog)...)
	cmd := &exec.Cmd{Path: prog, Args: append([]string{"git"}, args...), Dir: dir, Env: env,
		Stdout: &out, Stderr: teeWriter{&errs, lg}}
	r := runGroup(ctx, left, cmd)
	switch {
	case r.err != nil:
		return "", fmt.Errorf("cannot start git: %v: check the builder's PATH", r.err)
	case r.stopped != nil:
		return "", stoppedError(r.stopped)
	case r.timedOut:
		return "", fmt.Errorf("git %s took longer than %v and was killed: try again later, or raise the builder's git timeout", subcommand(args), b.gitTimeout())
	case !r.state.Success():
		return "", &gitFailed{args: args, status: r.state.ExitCode(), why: errs.why()}
	}
	return strings.TrimSpace(out.String()), nil
}

// subcommand names a git command by its subcommand (clone), past the -c
// name=value its arguments start with.
func subcommand(args []string) string {
	for len(args) > 2 && args[0] == "-c" {
		args = args[2:]
	}
	return args[0]
}

// credentialHelper is the environment that has git ask the builder's
// git-credentials secret (git-credential-store lines) for a password, when
// the builder has one: through git's own config variables, so that the
// credential is in no URL, no argument and no file of the checkout, and
// the build command, which is given none of this environment, is not told
// where it is. The helper only answers get: git's store and erase never
// touch the secret's file, which the host owns.
func (b *Builder) credentialHelper(git string) []string {
	if b.GitCredentials == "" {
		return nil
	}
	if info, err := os.Stat(b.GitCredentials); err != nil || !info.Mode().IsRegular() {
		return nil // not given (yet): public repositories only
	}
	helper := "!f() { if [ \"$1\" = get ]; then exec " + shellQuote(git) + " credential-store --file=" + shellQuote(b.GitCredentials) + " get; fi; }; f"
	return []string{"GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=credential.helper", "GIT_CONFIG_VALUE_0=" + helper}
}

// shellQuote quotes s for sh as one word.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// checkout clones repository into dir/src at ref (a branch, tag or commit
// id; "" is the repository's default branch) and returns the commit.
func (b *Builder) checkout(ctx context.Context, lg *buildLog, dir, src, repository, ref string) (string, error) {
	deadline := time.Now().Add(b.gitTimeout())
	lg.step("git clone %s", manifest.RedactRepository(repository))
	// No checkout yet: the ref is resolved first, among branches, tags and
	// commits alike, then checked out detached.
	trust, uploadPack := trustRepository(repository, dir)
	clone := append(trust, "clone", "--no-checkout", "--quiet")
	clone = append(clone, uploadPack...)
	if _, err := b.git(ctx, deadline, lg, dir, append(clone, "--", repository, src)...); err != nil {
		return "", fmt.Errorf("clone %s: %w", manifest.RedactRepository(repository), err)
	}
	var commit string
	for _, c := range candidates(ref) {
		out, err := b.git(ctx, deadline, lg, src, "rev-parse", "--verify", "--quiet", "--end-of-options", c+"^{commit}")
		if failed := (*gitFailed)(nil); errors.As(err, &failed) {
			continue // not this kind of ref
		}
		if err != nil {
			return "", fmt.Errorf("resolve %q: %w", ref, err)
		}
		commit = out
		break
	}
	if commit == "" {
		return "", fmt.Errorf("ref %q is not a branch, tag or commit of %s: push it, or ask for one that exists", ref, manifest.RedactRepository(repository))
	}
	lg.step("git checkout %s (%s)", commit, refName(ref))
	if _, err := b.git(ctx, deadline, lg, src, "-c", "advice.detachedHead=false", "checkout", "--quiet", "--detach", commit); err != nil {
		return "", fmt.Errorf("check out %s: %w", commit, err)
	}
	head, err := b.git(ctx, deadline, lg, src, "rev-parse", "--verify", "HEAD")
	if err != nil {
		return "", fmt.Errorf("read the commit checked out: %w", err)
	}
	return head, nil
}

// trustRepository is what has git clone a local repository that another
// user owns, as a builder running as its module's own user is asked to:
// git refuses one of "dubious ownership" unless safe.directory names it.
// It is named for this clone only, never in the builder's git config:
// on the clone's command line (a local clone checks the repository
// itself) and on the upload-pack it starts (whose environment git clears
// of the clone's -c). The asker named this repository; git trusts no
// other. A remote repository gets nothing: its server judges ownership.
func trustRepository(repository, dir string) (global, clone []string) {
	paths := localRepository(repository, dir)
	if len(paths) == 0 {
		return nil, nil
	}
	pack := "git"
	for _, p := range paths {
		global = append(global, "-c", "safe.directory="+p)
		pack += " -c " + shellQuote("safe.directory="+p)
	}
	return global, []string{"--upload-pack=" + pack + " upload-pack"}
}

// localRepository is every way git may name a local repository when it
// judges its ownership (the path as given, cleaned, its links resolved;
// the work tree's .git for a repository that is not bare), nil when
// repository is a URL or an scp-like host:path (git's own rule: a colon
// before any slash).
func localRepository(repository, dir string) []string {
	p := repository
	if rest, ok := strings.CutPrefix(repository, "file://"); ok {
		if p, ok = strings.CutPrefix(rest, "/"); !ok {
			return nil // file://host/…: not this machine's path
		}
		if u, err := url.PathUnescape(p); err == nil {
			p = u
		}
		p = "/" + p
	} else if strings.Contains(repository, "://") {
		return nil
	} else if colon := strings.IndexByte(p, ':'); colon >= 0 && !strings.Contains(p[:colon], "/") {
		return nil
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(dir, p) // git runs in the build's work dir
	}
	var out []string
	add := func(p string) {
		for _, q := range []string{p, p + "/.git", filepath.Join(p, ".git")} {
			if !slices.Contains(out, q) {
				out = append(out, q)
			}
		}
	}
	add(p)
	add(filepath.Clean(p))
	if real, err := filepath.EvalSymlinks(p); err == nil {
		add(real)
	}
	return out
}

// candidates are the names ref may have in a fresh clone, in the order a
// person means them: a branch (remote-tracking after the clone), a tag,
// then anything git resolves itself (a commit id, full or abbreviated).
func candidates(ref string) []string {
	if ref == "" {
		return []string{"refs/remotes/origin/HEAD", "HEAD"}
	}
	if branch, ok := strings.CutPrefix(ref, "refs/heads/"); ok {
		return []string{"refs/remotes/origin/" + branch}
	}
	return []string{"refs/remotes/origin/" + ref, "refs/tags/" + ref, ref}
}

// refName names a ref in a message.
func refName(ref string) string {
	if ref == "" {
		return "the default branch"
	}
	return ref
}

// checkAsk refuses what git must never be handed: an option where a
// repository or ref belongs, or control characters.
func checkAsk(repository, ref string) error {
	switch {
	case strings.TrimSpace(repository) == "":
		return fmt.Errorf("the ask names no repository: ask with one")
	case strings.HasPrefix(repository, "-"):
		return fmt.Errorf("repository %q starts with '-': name a URL or a path", repository)
	case strings.HasPrefix(ref, "-"):
		return fmt.Errorf("ref %q starts with '-': name a branch, tag or commit", ref)
	case strings.ContainsFunc(repository+ref, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return fmt.Errorf("the repository or ref holds control characters: ask again without them")
	}
	if err := manifest.CheckRepository(repository); err != nil {
		return fmt.Errorf("%w: %s", err, manifest.RepositoryCredentialHint)
	}
	return nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	max int
	buf bytes.Buffer
	cut bool // bytes were dropped: the first line kept may be partial
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) > t.max {
		p = p[len(p)-t.max:]
		t.cut = true
	}
	if over := t.buf.Len() + len(p) - t.max; over > 0 {
		t.buf.Next(over)
		t.cut = true
	}
	t.buf.Write(p)
	return n, nil
}

func (t *tailBuffer) String() string { return t.buf.String() }

// gitFollowUps are what git says after the line that says why a remote
// could not be read, whatever the reason was (lowercase).
var gitFollowUps = []string{"fatal: could not read from remote repository.", "fatal: the remote end hung up unexpectedly"}

// why is the line of git's stderr that says why it failed: its first
// fatal: or error: line; when that is only git's follow-up (gitFollowUps),
// the line before it, which ssh or the server wrote, unless that is a hint
// or a warning; with no such line, the last. A failed clone ends "Please
// make sure you have the correct access rights / and the repository
// exists.", which says nothing of why.
func (t *tailBuffer) why() string {
	lines := strings.FieldsFunc(t.buf.String(), func(r rune) bool { return r == '\n' || r == '\r' })
	if t.cut && len(lines) > 0 {
		lines = lines[1:]
	}
	lines = slices.DeleteFunc(lines, func(l string) bool { return strings.TrimSpace(l) == "" })
	if len(lines) == 0 {
		return ""
	}
	for i, l := range lines {
		l = strings.TrimSpace(l)
		lower := strings.ToLower(l)
		if !strings.HasPrefix(lower, "fatal:") && !strings.HasPrefix(lower, "error:") {
			continue
		}
		if !slices.Contains(gitFollowUps, lower) {
			return l
		}
		if i > 0 {
			prev := strings.TrimSpace(lines[i-1])
			if p := strings.ToLower(prev); !strings.HasPrefix(p, "hint:") && !strings.HasPrefix(p, "warning:") {
				return prev
			}
		}
		return l
	}
	return strings.TrimSpace(lines[len(lines)-1])
}

// teeWriter writes to both its writers, which never fail.
type teeWriter struct{ a, b io.Writer }

func (t teeWriter) Write(p []byte) (int, error) {
	t.a.Write(p)
	t.b.Write(p)
	return len(p), nil
}
