package builder

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
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
	last   string // its last line on stderr
}

func (g *gitFailed) Error() string {
	s := fmt.Sprintf("git %s exited with status %d", g.args[0], g.status)
	if g.last != "" {
		s += ": " + manifest.RedactText(g.last)
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
		return "", fmt.Errorf("git %s took longer than %v and was killed: try again later, or raise the builder's git timeout", args[0], b.gitTimeout())
	case !r.state.Success():
		return "", &gitFailed{args: args, status: r.state.ExitCode(), last: errs.lastLine()}
	}
	return strings.TrimSpace(out.String()), nil
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
	if _, err := b.git(ctx, deadline, lg, dir, "clone", "--no-checkout", "--quiet", "--", repository, src); err != nil {
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
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) > t.max {
		p = p[len(p)-t.max:]
	}
	if over := t.buf.Len() + len(p) - t.max; over > 0 {
		t.buf.Next(over)
	}
	t.buf.Write(p)
	return n, nil
}

func (t *tailBuffer) String() string { return t.buf.String() }

// lastLine is the last non-empty line written.
func (t *tailBuffer) lastLine() string {
	lines := strings.Split(strings.TrimSpace(t.buf.String()), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// teeWriter writes to both its writers, which never fail.
type teeWriter struct{ a, b io.Writer }

func (t teeWriter) Write(p []byte) (int, error) {
	t.a.Write(p)
	t.b.Write(p)
	return len(p), nil
}
