// Package restic runs the restic command (Debian's restic package) for
// the mesh's backups: the data's host backs a data set up into its node's
// repository and restores it; the backup seat's holder makes
// repositories, lists, prunes and drills them. It uses restic itself for
// the format and the work, so that a person opens any repository with a
// stock restic and its password alone. Every failure is one line.
package restic

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"mesh-controller/app/process"
)

// ErrNotInstalled means there is no restic on the PATH.
var ErrNotInstalled = errors.New("restic is not installed: install Debian's restic package (apt-get install --no-install-recommends restic)")

// ErrWrongPassword means the repository did not open with the password.
var ErrWrongPassword = errors.New("the repository password is wrong: give the repository_password the repository was made with")

// ErrLocked means another restic holds the repository locked (or one
// killed midway left its lock): Unlock removes a lock whose restic is gone.
var ErrLocked = errors.New("the repository is locked")

// Repo is one repository and how to reach it.
type Repo struct {
	// Repository is restic's name for it: a directory, or
	// rest:http://USER:PASSWORD@HOST:PORT/NODE/ (never printed: see Shown;
	// given in the child's environment, RESTIC_REPOSITORY, never on its
	// command line, which every user of the machine may read).
	Repository string
	// Password encrypts it (RESTIC_PASSWORD, given in the child's
	// environment alone, never on its command line).
	Password string
	// CacheDir is restic's cache ("" : none, --no-cache).
	CacheDir string
	// Program is the restic program ("" : restic on the PATH).
	Program string
	// LockWait bounds how long a command waits for a lock another restic
	// holds (0: DefaultLockWait; negative: it does not wait).
	LockWait time.Duration
}

// Shown is the repository as it may be printed: no credential.
func (r Repo) Shown() string {
	rest, ok := strings.CutPrefix(r.Repository, "rest:")
	if !ok {
		return r.Repository
	}
	scheme, after, ok := strings.Cut(rest, "://")
	if at := strings.LastIndexByte(after, '@'); ok && at >= 0 {
		return "rest:" + scheme + "://" + after[at+1:]
	}
	return r.Repository
}

// Version is the restic on the PATH's version ("0.14.0"), or
// ErrNotInstalled.
func Version(ctx context.Context) (string, error) {
	prog, err := exec.LookPath("restic")
	if err != nil {
		return "", ErrNotInstalled
	}
	out, err := exec.CommandContext(ctx, prog, "version").Output()
	if err != nil {
		return "", fmt.Errorf("restic version: %w", err)
	}
	f := strings.Fields(string(out))
	if len(f) < 2 || f[0] != "restic" {
		return "", fmt.Errorf("restic version said %q", strings.TrimSpace(string(out)))
	}
	return f[1], nil
}

// run runs restic with args, stdin closed, and returns its standard
// output; its error is one line: restic's last line on stderr. The child
// dies with its parent (a host killed midway leaves no restic running on
// behind it: the lock it leaves is stale, and Unlock removes it).
func (r Repo) run(ctx context.Context, args ...string) ([]byte, error) {
	// restic 0.14 (Debian's) does not wait for a lock: the holder's prune
	// holds its repository exclusively a while, and a node's backup or
	// restore that finds it locked waits here, bounded, then says so.
	wait := r.LockWait
	if wait == 0 {
		wait = DefaultLockWait
	}
	deadline := time.Now().Add(wait)
	for {
		out, err := r.runOnce(ctx, args...)
		if !errors.Is(err, ErrLocked) || wait < 0 || time.Now().After(deadline) {
			return out, err
		}
		select {
		case <-ctx.Done():
			return out, err
		case <-time.After(lockRetry):
		}
		// A lock whose restic is gone (killed midway) goes; a live one stays.
		_, _ = r.runOnce(ctx, "unlock")
	}
}

// DefaultLockWait is how long a command waits for a repository another
// restic holds locked; lockRetry how often it tries again meanwhile.
const (
	DefaultLockWait = 5 * time.Minute
	lockRetry       = time.Second
)

func (r Repo) runOnce(ctx context.Context, args ...string) ([]byte, error) {
	prog := r.Program
	if prog == "" {
		p, err := exec.LookPath("restic")
		if err != nil {
			return nil, ErrNotInstalled
		}
		prog = p
	}
	// The global flags go first: after a backup's "--" they would be paths.
	full := []string{"--no-cache"}
	if r.CacheDir != "" {
		full = []string{"--cache-dir", r.CacheDir}
	}
	full = append(full, args...)
	cmd := exec.CommandContext(ctx, prog, full...)
	cmd.Env = []string{"RESTIC_REPOSITORY=" + r.Repository, "RESTIC_PASSWORD=" + r.Password, "PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir(), "LC_ALL=C"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &limited{w: &stderr, left: 64 << 10}
	cmd.WaitDelay = 5 * time.Second
	// Started on the one thread that never ends: the parent-death signal
	// is sent when the thread that started the child ends, not the process.
	err := process.Start(cmd)
	if err == nil {
		err = cmd.Wait()
	}
	if err == nil {
		return stdout.Bytes(), nil
	}
	last := lastLine(stderr.String())
	if fatal := fatalLine(stderr.String()); fatal != "" {
		last = fatal // what went wrong, not restic's "at the following location?"
	}
	switch {
	case ctx.Err() != nil:
		return nil, fmt.Errorf("restic %s stopped: %w", args[0], context.Cause(ctx))
	case strings.Contains(last, "wrong password") || strings.Contains(stderr.String(), "wrong password or no key found"):
		return nil, ErrWrongPassword
	case strings.Contains(stderr.String(), "repository is already locked"):
		return nil, fmt.Errorf("restic %s: %w (%s)", args[0], ErrLocked, lockedBy(stderr.String()))
	case last == "":
		return nil, fmt.Errorf("restic %s: %w", args[0], err)
	}
	return nil, fmt.Errorf("restic %s: %s", args[0], r.redact(last))
}

// redact takes the repository's credential out of a line of restic's:
// restic may name the repository, credential and all; it hides the
// password itself, and this never repeats it, however it is written.
func (r Repo) redact(line string) string {
	line = strings.ReplaceAll(line, r.Repository, r.Shown())
	rest, ok := strings.CutPrefix(r.Repository, "rest:")
	if u, err := url.Parse(rest); ok && err == nil && u.User != nil {
		if pw, set := u.User.Password(); set && pw != "" {
			line = strings.ReplaceAll(line, pw, "***")
			line = strings.ReplaceAll(line, url.PathEscape(pw), "***")
			line = strings.ReplaceAll(line, url.QueryEscape(pw), "***")
		}
	}
	return line
}

// fatalLine is restic's "Fatal: …" line, less its lead-in, or "".
func fatalLine(stderr string) string {
	for _, l := range strings.Split(stderr, "\n") {
		if after, ok := strings.CutPrefix(strings.TrimSpace(l), "Fatal: "); ok {
			return after
		}
	}
	return ""
}

// Init makes the repository if it is not there; one there already is left
// as it is (and must open with the password).
func (r Repo) Init(ctx context.Context) error {
	if _, err := r.run(ctx, "cat", "config"); err == nil {
		return nil
	} else if errors.Is(err, ErrWrongPassword) || errors.Is(err, ErrNotInstalled) {
		return err
	}
	_, err := r.run(ctx, "init")
	return err
}

// Summary is what a backup did (restic backup --json's summary).
type Summary struct {
	SnapshotID    string  `json:"snapshot_id"`
	FilesNew      int64   `json:"files_new"`
	FilesChanged  int64   `json:"files_changed"`
	Files         int64   `json:"total_files_processed"`
	Bytes         int64   `json:"total_bytes_processed"`
	DataAdded     int64   `json:"data_added"`
	TotalDuration float64 `json:"total_duration"`
}

// Backup backs path up as host, tagged with tags, and returns its summary.
func (r Repo) Backup(ctx context.Context, path, host string, tags ...string) (Summary, error) {
	args := []string{"backup", "--json", "--host", host}
	for _, t := range tags {
		args = append(args, "--tag", t)
	}
	out, err := r.run(ctx, append(args, "--", path)...)
	if err != nil {
		return Summary{}, err
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var s struct {
			Type string `json:"message_type"`
			Summary
		}
		if json.Unmarshal(sc.Bytes(), &s) == nil && s.Type == "summary" && s.SnapshotID != "" {
			return s.Summary, nil
		}
	}
	return Summary{}, errors.New("restic backup said no snapshot id")
}

// Snapshot is one snapshot of a repository.
type Snapshot struct {
	ID       string    `json:"id"`
	ShortID  string    `json:"short_id"`
	Time     time.Time `json:"time"`
	Paths    []string  `json:"paths"`
	Hostname string    `json:"hostname"`
	Tags     []string  `json:"tags"`
}

// Snapshots lists the snapshots carrying tag (every one if ""), newest first.
func (r Repo) Snapshots(ctx context.Context, tag string) ([]Snapshot, error) {
	args := []string{"snapshots", "--json"}
	if tag != "" {
		args = append(args, "--tag", tag)
	}
	out, err := r.run(ctx, args...)
	if err != nil {
		return nil, err
	}
	var ss []Snapshot
	if err := json.Unmarshal(out, &ss); err != nil {
		return nil, fmt.Errorf("restic snapshots said no JSON: %w", err)
	}
	for i, j := 0, len(ss)-1; i < j; i, j = i+1, j-1 {
		ss[i], ss[j] = ss[j], ss[i] // restic lists oldest first
	}
	return ss, nil
}

// Restore restores snapshot id into target (the snapshot's paths beneath
// it, as they were), verifying every file's content against the snapshot.
func (r Repo) Restore(ctx context.Context, id, target string) error {
	_, err := r.run(ctx, "restore", id, "--target", target, "--verify")
	return err
}

// Check checks the repository's structure and reads subset of its data
// ("1/7", "10%").
func (r Repo) Check(ctx context.Context, subset string) error {
	args := []string{"check"}
	if subset != "" {
		args = append(args, "--read-data-subset", subset)
	}
	_, err := r.run(ctx, args...)
	return err
}

// Keep is what Forget keeps of each period, and every snapshot taken
// Within the last while (whole hours; 0: none so).
type Keep struct {
	Hourly, Daily, Weekly, Monthly int
	Within                         time.Duration
}

// Forget drops the snapshots carrying tag beyond keep and prunes what no
// snapshot holds any more. Only the holder runs it, on its own disk: nodes
// can only append.
func (r Repo) Forget(ctx context.Context, tag string, keep Keep) error {
	args := []string{"forget", "--prune", "--tag", tag, "--group-by", "host,tags"}
	for _, k := range []struct {
		flag string
		n    int
	}{{"--keep-hourly", keep.Hourly}, {"--keep-daily", keep.Daily}, {"--keep-weekly", keep.Weekly}, {"--keep-monthly", keep.Monthly}} {
		if k.n > 0 {
			args = append(args, k.flag, strconv.Itoa(k.n))
		}
	}
	if h := int(keep.Within.Hours()); h > 0 {
		args = append(args, "--keep-within", strconv.Itoa(h)+"h")
	}
	_, err := r.run(ctx, args...)
	return err
}

// Unlock removes stale locks (a backup killed midway leaves one).
func (r Repo) Unlock(ctx context.Context) error {
	_, err := r.run(ctx, "unlock")
	return err
}

// lockedBy is restic's line that says who holds the lock ("… locked
// exclusively by PID 12 on n1 by root …"), less its lead-in.
func lockedBy(stderr string) string {
	for _, l := range strings.Split(stderr, "\n") {
		if _, after, ok := strings.Cut(l, "repository is already "); ok {
			return strings.TrimSpace(after)
		}
	}
	return "by another restic"
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(lines[i]); l != "" {
			return l
		}
	}
	return ""
}

// limited keeps at most left bytes of what is written to it.
type limited struct {
	w    io.Writer
	left int
}

func (l *limited) Write(p []byte) (int, error) {
	n := len(p)
	if l.left > 0 {
		k := min(l.left, len(p))
		l.w.Write(p[:k])
		l.left -= k
	}
	return n, nil
}
