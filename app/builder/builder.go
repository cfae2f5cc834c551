// Package builder owns what a builder does with one build ask: clone the
// repository at the ref with the real git, judge its mesh.json exactly as
// module check does, run the manifest's build command in a fresh work dir,
// in its own process group, under its timeout, and pack the outputs with
// mesh.json into a content-addressed archive (app/archive). Every way a
// build can go wrong is an Outcome, never a Go error.
package builder

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"mesh-controller/app/archive"
	"mesh-controller/contexts/inventory/manifest"
)

// maxManifestBytes bounds the mesh.json read from a checkout, as module
// check bounds a manifest file (app.MaxManifestBytes).
const maxManifestBytes = 1 << 20

// Ask is one build ask (protocol.md, mesh.build.ask.B).
type Ask struct {
	ID         string `json:"id"`
	Repository string `json:"repository"`
	Ref        string `json:"ref,omitempty"`
	DryRun     bool   `json:"dry_run,omitempty"`
}

// Outcome is what a build came to (protocol.md "Builders and tools":
// mesh.build.result).
type Outcome struct {
	ID         string `json:"id"`
	Repository string `json:"repository"`
	Ref        string `json:"ref,omitempty"`
	Commit     string `json:"commit,omitempty"`
	// CommitAt is the commit's committer time, RFC 3339.
	CommitAt string `json:"commit_at,omitempty"`
	On       string `json:"on"` // the builder's node
	DryRun   bool   `json:"dry_run,omitempty"`
	Failed   bool   `json:"failed,omitempty"`
	// Why says, in one line, why a failed build failed.
	Why string `json:"why,omitempty"`
	// Problems are the manifest's problems, every one, when it is invalid
	// ("field: what", as module check says them).
	Problems []string `json:"problems,omitempty"`
	// Manifest is mesh.json as built, when it is JSON.
	Manifest json.RawMessage `json:"manifest,omitempty"`
	Module   string          `json:"module,omitempty"`
	Version  string          `json:"version,omitempty"`
	// Digest (sha256, hex) and Bytes are the archive's; UnpackedBytes is
	// what it unpacks to (archive.Packed's Unpacked: its regular files'
	// sizes summed), which hosts judge their disk by.
	Digest        string  `json:"digest,omitempty"`
	Bytes         int64   `json:"bytes,omitempty"`
	UnpackedBytes int64   `json:"unpacked_bytes,omitempty"`
	DurationMS    float64 `json:"duration_ms"`
	// LogTail is the build log's last LogTailLines lines.
	LogTail []string `json:"log_tail,omitempty"`
}

// Builder builds asks in its work dir.
type Builder struct {
	// WorkDir is the builder module's work data set: one fresh subdir per
	// build, removed after.
	WorkDir string
	// Node is the builder's node, reported as each Outcome's On.
	Node string
	// PATH is given to git and to the build command; default: the
	// process's PATH.
	PATH string
	// Progress is handed each line of the build's output and of its steps
	// as it happens (may be nil). It is called in order, from the build's
	// goroutines: it must return promptly.
	Progress func(id, line string)
	// ArchiveTo opens where the archive is written (the caller uploads
	// it); tests write files. If the writer has CloseWithError(error)
	// error (as io.PipeWriter does), a failed pack ends it that way, so a
	// partial archive is not taken for a whole one. Nil, or a dry run,
	// packs only to learn the digest and size.
	ArchiveTo func(id string) (io.WriteCloser, error)
	// GitTimeout bounds the git steps of one build together; zero is
	// DefaultGitTimeout.
	GitTimeout time.Duration
	// Hide are the builder's own paths a build must not see (its module's
	// directory, with its broker credentials, and its secrets): each is
	// covered inside the build's sandbox, as its work dir is.
	Hide []string
	// GitCredentials is the file of the builder's git-credentials secret
	// (git-credential-store lines, https://USER:TOKEN@HOST), handed to git
	// by a credential helper when it exists; "" or absent: none.
	GitCredentials string
}

func (b *Builder) path() string {
	if b.PATH != "" {
		return b.PATH
	}
	return os.Getenv("PATH")
}

func (b *Builder) gitTimeout() time.Duration {
	if b.GitTimeout > 0 {
		return b.GitTimeout
	}
	return DefaultGitTimeout
}

// Build clones the repository at the ref with the real git command,
// records the commit, reads mesh.json from the checkout and judges it
// exactly as module check does (manifest.Parse, the build
// section included), runs build.command in the checkout (no shell, its
// own process group, env = only the declared env plus PATH and HOME=the
// build's dir), kills the whole group at the timeout, when ctx is done
// (context.Cause says why: that is how a build is killed by hand) or
// when the command exits (nothing it started outlives it), packs outputs
// and mesh.json with archive.Pack into ArchiveTo, and returns the
// Outcome. Every failure is an Outcome with Failed and Why, and the log
// tail. A dry run is built and packed like any other, but its archive is
// not written anywhere: only its digest and size are reported.
func (b *Builder) Build(ctx context.Context, a Ask) Outcome {
	start := time.Now()
	// The repository as the controller prints it: an ask from a controller
	// that let a credential into the URL does not send it back.
	o := Outcome{ID: a.ID, Repository: manifest.RedactRepository(a.Repository), Ref: a.Ref, On: b.Node, DryRun: a.DryRun}
	lg := newLog(func(line string) {
		if b.Progress != nil {
			b.Progress(a.ID, line)
		}
	})
	dir, err := b.workDir(a.ID)
	if err == nil {
		err = b.build(ctx, a, dir, &o, lg)
		if rerr := removeTree(dir); rerr != nil {
			lg.step("could not remove the build's work dir: %v", rerr)
		}
	}
	if err != nil {
		o.Failed, o.Why = true, manifest.RedactText(oneLine(err.Error()))
		lg.step("failed: %s", o.Why)
	} else {
		lg.step("built %s %s from %s in %v", o.Module, o.Version, short(o.Commit), time.Since(start).Round(time.Millisecond))
	}
	o.DurationMS = float64(time.Since(start).Microseconds()) / 1000
	o.LogTail = lg.last()
	return o
}

// workDir makes the build's fresh dir beneath WorkDir.
func (b *Builder) workDir(id string) (string, error) {
	if b.WorkDir == "" {
		return "", errors.New("the builder has no work dir: give it its work data set")
	}
	if err := os.MkdirAll(b.WorkDir, 0o700); err != nil {
		return "", fmt.Errorf("make the work dir: %w: check the work data set", err)
	}
	pattern := "build-*"
	if idRule.MatchString(id) {
		pattern = "build-" + id + "-*"
	}
	dir, err := os.MkdirTemp(b.WorkDir, pattern)
	if err != nil {
		return "", fmt.Errorf("make the build's dir: %w: check the work data set", err)
	}
	return dir, nil
}

// idRule is the build ids that may name a work dir (b-<millis>-<random>).
var idRule = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// build does the steps of Build in dir; its error is the outcome's why.
func (b *Builder) build(ctx context.Context, a Ask, dir string, o *Outcome, lg *buildLog) error {
	if err := checkAsk(a.Repository, a.Ref); err != nil {
		return err
	}
	src := filepath.Join(dir, "src")
	commit, err := b.checkout(ctx, lg, dir, src, a.Repository, a.Ref)
	if err != nil {
		return err
	}
	o.Commit = commit
	// When it was committed: of two builds of one version, the newer
	// commit wins. Not knowing it fails nothing.
	if at, err := b.git(ctx, time.Now().Add(time.Minute), lg, src, "show", "-s", "--format=%cI", commit); err == nil {
		if t, err := time.Parse(time.RFC3339, strings.TrimSpace(at)); err == nil {
			o.CommitAt = t.UTC().Format(time.RFC3339)
		}
	}

	m, err := readManifest(src, o)
	if err != nil {
		return err
	}
	timeout := manifest.DefaultBuildTimeout
	if m.Build.Timeout != "" {
		timeout, _ = time.ParseDuration(m.Build.Timeout) // judged already
	}

	if err := b.runBuild(ctx, lg, dir, src, m.Build, timeout); err != nil {
		return err
	}

	var outputs, missing []string
	root, err := os.OpenRoot(src)
	if err != nil {
		return fmt.Errorf("open the checkout: %w", err)
	}
	defer root.Close()
	for _, out := range m.Build.Outputs {
		clean := path.Clean(out)
		if _, err := root.Lstat(clean); errors.Is(err, fs.ErrNotExist) {
			missing = append(missing, out)
		} else if err != nil {
			return fmt.Errorf("build output %s: %w", out, err)
		}
		outputs = append(outputs, clean)
	}
	if len(missing) > 0 {
		return fmt.Errorf("the build did not make %s: make build.command write them, or fix build.outputs", strings.Join(missing, ", "))
	}
	return b.pack(lg, a, src, append(outputs, "mesh.json"), o)
}

// readManifest reads mesh.json from the checkout's root and judges it as
// module check does, filling the outcome's manifest, module, version and
// problems.
func readManifest(src string, o *Outcome) (manifest.Manifest, error) {
	root, err := os.OpenRoot(src)
	if err != nil {
		return manifest.Manifest{}, fmt.Errorf("open the checkout: %w", err)
	}
	defer root.Close()
	info, err := root.Lstat("mesh.json")
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return manifest.Manifest{}, errors.New("the checkout has no mesh.json at its root: commit one to build this module")
	case err != nil:
		return manifest.Manifest{}, fmt.Errorf("read mesh.json: %w", err)
	case !info.Mode().IsRegular():
		return manifest.Manifest{}, errors.New("mesh.json is not a regular file (a link?): commit the manifest itself")
	case info.Size() > maxManifestBytes:
		return manifest.Manifest{}, fmt.Errorf("mesh.json is %d bytes, more than %d: trim it", info.Size(), maxManifestBytes)
	}
	f, err := root.Open("mesh.json")
	if err != nil {
		return manifest.Manifest{}, fmt.Errorf("read mesh.json: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxManifestBytes+1))
	if err != nil {
		return manifest.Manifest{}, fmt.Errorf("read mesh.json: %w", err)
	}
	if len(data) > maxManifestBytes {
		return manifest.Manifest{}, fmt.Errorf("mesh.json is more than %d bytes: trim it", maxManifestBytes)
	}
	if json.Valid(data) {
		o.Manifest = json.RawMessage(data)
	}
	m, problems := manifest.Parse(data)
	o.Module, o.Version = m.Module, m.Version
	for _, p := range problems {
		o.Problems = append(o.Problems, p.String())
	}
	if len(problems) > 0 {
		return m, fmt.Errorf("mesh.json has %d problem(s), the first is %s: fix them (module check lists them all)", len(problems), problems[0])
	}
	if m.Build == nil {
		return m, errors.New("mesh.json has no build section: add build.command and build.outputs to build it with the mesh")
	}
	return m, nil
}

// runBuild runs the build command in the checkout.
func (b *Builder) runBuild(ctx context.Context, lg *buildLog, dir, src string, spec *manifest.Build, timeout time.Duration) error {
	prog, err := lookPath(spec.Command[0], src, b.path())
	if err != nil {
		return fmt.Errorf("build.command: %v: fix build.command or the builder's PATH", err)
	}
	// A scratch dir of its own, on the disk the build is on.
	if err := os.Mkdir(filepath.Join(dir, "tmp"), 0o700); err != nil {
		return fmt.Errorf("make the build's scratch dir: %w", err)
	}
	sb, err := newSandbox(dir, append([]string{b.WorkDir}, b.Hide...))
	if err != nil {
		return fmt.Errorf("make the build's sandbox: %w", err)
	}
	// Only what the manifest declares, and PATH, HOME and TMPDIR: a build
	// sees nothing of the builder's own environment.
	env := []string{"PATH=" + b.path(), "HOME=" + sandboxHome, "TMPDIR=" + sb.inside(filepath.Join(dir, "tmp"))}
	for _, k := range slices.Sorted(maps.Keys(spec.Env)) {
		env = append(env, k+"="+spec.Env[k])
	}
	lg.step("run %q in the checkout (timeout %v), %s", spec.Command, timeout, sb.who())
	started := time.Now()
	cmd, err := sb.command(&exec.Cmd{Path: prog, Args: spec.Command, Dir: src, Env: env, Stdout: lg, Stderr: lg})
	if err != nil {
		return fmt.Errorf("make the build's sandbox: %w", err)
	}
	r := runGroup(ctx, timeout, cmd)
	lg.flush()
	r.strays += sb.sweep(groupGoneBound)
	if r.strays > 0 {
		lg.step("%d process(es) of the build would not die within %v", r.strays, groupGoneBound)
	}
	took := time.Since(started).Round(time.Millisecond)
	switch {
	case r.err != nil:
		return fmt.Errorf("build.command: cannot start %s in its sandbox: %v: %s", spec.Command[0], r.err, sandboxHint)
	case r.state.ExitCode() == sandboxFailed && strings.HasPrefix(lg.lastLine(), sandboxSaid):
		return fmt.Errorf("the build's sandbox could not be made: %s: %s", strings.TrimPrefix(lg.lastLine(), sandboxSaid), sandboxHint)
	case r.stopped != nil:
		return fmt.Errorf("build killed after %v: %w", took, stoppedError(r.stopped))
	case r.timedOut:
		return fmt.Errorf("build outlived its timeout of %v and was killed: make it faster, or raise build.timeout", timeout)
	case !r.state.Success():
		how := fmt.Sprintf("exited with status %d", r.state.ExitCode())
		if ws, ok := r.state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			how = "was killed by signal " + ws.Signal().String()
		}
		last := ""
		if l := lg.lastLine(); l != "" {
			last = fmt.Sprintf(" (last line: %.200q)", l)
		}
		return fmt.Errorf("build command %s %s after %v%s: see the log tail", spec.Command[0], how, took, last)
	}
	lg.step("build command done in %v", took)
	return nil
}

// pack packs the outputs into the archive writer (or only hashes them for
// a dry run) and records digest, size and unpacked size.
func (b *Builder) pack(lg *buildLog, a Ask, src string, paths []string, o *Outcome) error {
	var w io.Writer = io.Discard
	var wc io.WriteCloser
	if !a.DryRun && b.ArchiveTo != nil {
		var err error
		if wc, err = b.ArchiveTo(a.ID); err != nil {
			return fmt.Errorf("open where the archive goes: %w", err)
		}
		w = wc
	}
	lg.step("pack %s", strings.Join(paths, " "))
	packed, err := archive.Pack(w, src, paths)
	if err != nil {
		if wc != nil {
			abort(wc, err)
		}
		// Pack names the checkout's path, which means nothing to the asker.
		return errors.New("pack the outputs: " + strings.TrimPrefix(err.Error(), "pack "+src+": "))
	}
	if wc != nil {
		if err := wc.Close(); err != nil {
			return fmt.Errorf("write the archive: %w", err)
		}
	}
	o.Digest, o.Bytes, o.UnpackedBytes = packed.Digest, packed.Bytes, packed.Unpacked
	lg.step("archive sha256:%s, %d bytes, unpacking to %d", packed.Digest, packed.Bytes, packed.Unpacked)
	return nil
}

// abort ends an archive writer whose archive is not whole.
func abort(wc io.WriteCloser, err error) {
	if ce, ok := wc.(interface{ CloseWithError(error) error }); ok {
		ce.CloseWithError(err)
		return
	}
	wc.Close()
}

// stoppedError says why a build was stopped from outside.
func stoppedError(cause error) error {
	if cause == nil || errors.Is(cause, context.Canceled) {
		return errors.New("stopped by the builder (canceled)")
	}
	return fmt.Errorf("stopped: %w", cause)
}

// removeTree removes a build's dir even where the build left directories
// without write permission (Go's module cache does).
func removeTree(dir string) error {
	if err := os.RemoveAll(dir); err == nil {
		return nil
	}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(p, 0o700)
		}
		return nil
	})
	return os.RemoveAll(dir)
}

// oneLine keeps a why on one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}

// short is a commit's first 12 characters.
func short(commit string) string {
	if len(commit) > 12 {
		return commit[:12]
	}
	return commit
}
