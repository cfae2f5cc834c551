package restic

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"mesh-controller/app/restic/restictest"
)

// The real restic, on a repository in a directory: made, a data set
// backed up twice (the second adds only what changed), listed newest
// first, restored byte-identical, checked, pruned; a wrong password
// refused in one line.
func TestRepo_RealRestic(t *testing.T) {
	ctx := context.Background()
	dir, r := newRepo(t)
	if err := r.Init(ctx); err != nil {
		t.Fatalf("again: %v", err)
	}
	data := filepath.Join(dir, "data")
	os.MkdirAll(data, 0o755)
	big := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	os.WriteFile(filepath.Join(data, "big"), big, 0o644)
	first, err := r.Backup(ctx, data, "n1", "mesh:db/pg")
	if err != nil || first.SnapshotID == "" || first.Files != 1 || first.Bytes != int64(len(big)) {
		t.Fatalf("first backup: %+v, %v", first, err)
	}
	os.WriteFile(filepath.Join(data, "small"), []byte("new"), 0o644)
	second, err := r.Backup(ctx, data, "n1", "mesh:db/pg")
	if err != nil || second.Files != 2 || second.DataAdded >= first.DataAdded {
		t.Fatalf("second backup added %d (first %d): %+v, %v", second.DataAdded, first.DataAdded, second, err)
	}
	ss, err := r.Snapshots(ctx, "mesh:db/pg")
	if err != nil || len(ss) != 2 || ss[0].ShortID != second.SnapshotID || ss[0].Paths[0] != data {
		t.Fatalf("snapshots %+v, %v", ss, err)
	}
	if other, _ := r.Snapshots(ctx, "mesh:other/x"); len(other) != 0 {
		t.Fatalf("another tag's snapshots: %+v", other)
	}
	target := filepath.Join(dir, "restored")
	if err := r.Restore(ctx, ss[1].ID, target); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(target, data, "big")); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("restored: %v", err)
	}
	if _, err := os.Stat(filepath.Join(target, data, "small")); err == nil {
		t.Fatal("the first snapshot restored the second's file")
	}
	if err := r.Check(ctx, "100%"); err != nil {
		t.Fatal(err)
	}
	if err := r.Forget(ctx, "mesh:db/pg", Keep{Hourly: 1}); err != nil {
		t.Fatal(err)
	}
	if ss, _ := r.Snapshots(ctx, ""); len(ss) != 1 {
		t.Fatalf("after forget, %d snapshots", len(ss))
	}
	wrong := r
	wrong.Password = "battery staple"
	if _, err := wrong.Snapshots(ctx, ""); !errors.Is(err, ErrWrongPassword) {
		t.Fatalf("a wrong password: %v", err)
	}
	if err := wrong.Init(ctx); !errors.Is(err, ErrWrongPassword) {
		t.Fatalf("init with a wrong password: %v", err)
	}
}

// newRepo makes a repository in a directory with the real restic.
func newRepo(t *testing.T) (string, Repo) {
	restictest.Need(t)
	dir := t.TempDir()
	r := Repo{Repository: filepath.Join(dir, "repo"), Password: "correct horse"}
	if err := r.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	return dir, r
}

func TestRepo_Shown(t *testing.T) {
	for in, want := range map[string]string{
		"rest:http://n1:s3cret@10.0.0.1:8000/n1/": "rest:http://10.0.0.1:8000/n1/",
		"rest:http://10.0.0.1:8000/n1/":           "rest:http://10.0.0.1:8000/n1/",
		"/srv/repo":                               "/srv/repo",
	} {
		if got := (Repo{Repository: in}).Shown(); got != want {
			t.Errorf("%s shown as %s", in, got)
		}
	}
}

// The repository (a REST one names its credential) and its password reach
// restic in its environment alone: never on its command line, which every
// user of the machine may read in /proc.
func TestRepo_CredentialNotOnCommandLine(t *testing.T) {
	dir := t.TempDir()
	prog := filepath.Join(dir, "restic")
	seen := filepath.Join(dir, "seen")
	script := "#!/bin/sh\nprintf '%s\\n' \"$@\" > " + seen + ".args\nenv > " + seen + ".env\necho '[]'\n"
	if err := os.WriteFile(prog, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	r := Repo{Repository: "rest:http://n1:s3cret-rest@10.0.0.1:8000/n1/", Password: "s3cret-repo", Program: prog}
	if _, err := r.Snapshots(context.Background(), "mesh:db/pg"); err != nil {
		t.Fatal(err)
	}
	args, _ := os.ReadFile(seen + ".args")
	env, _ := os.ReadFile(seen + ".env")
	if bytes.Contains(args, []byte("s3cret")) || !bytes.HasPrefix(args, []byte("--no-cache\nsnapshots\n")) {
		t.Fatalf("the command line:\n%s", args)
	}
	if !bytes.Contains(env, []byte("RESTIC_REPOSITORY="+r.Repository+"\n")) || !bytes.Contains(env, []byte("RESTIC_PASSWORD=s3cret-repo\n")) {
		t.Fatalf("the environment:\n%s", env)
	}
}

// A restic killed while it held the repository locked exclusively leaves
// its lock: the next backup is refused as locked (ErrLocked, saying by
// whom), Unlock removes the stale lock, and the backup then goes.
func TestRepo_StaleLock(t *testing.T) {
	ctx := context.Background()
	dir, r := newRepo(t)
	data := filepath.Join(dir, "data")
	os.MkdirAll(data, 0o755)
	os.WriteFile(filepath.Join(data, "f"), []byte("kept"), 0o644)
	restictest.StaleLock(t, r.Repository, r.Password)
	r.LockWait = -1 // refused at once, not waited for
	_, err := r.Backup(ctx, data, "n1", "mesh:db/pg")
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "locked exclusively by PID") {
		t.Fatalf("a backup of a locked repository: %v", err)
	}
	if err := r.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Backup(ctx, data, "n1", "mesh:db/pg"); err != nil {
		t.Fatalf("after unlock: %v", err)
	}
}

// A repository another restic holds locked is waited for (Debian's restic
// 0.14 does not wait by itself): a backup asked while the holder prunes
// goes once the prune is done; a stale lock is removed on the way.
func TestRepo_LockWaitedFor(t *testing.T) {
	ctx := context.Background()
	dir, r := newRepo(t)
	data := filepath.Join(dir, "data")
	os.MkdirAll(data, 0o755)
	os.WriteFile(filepath.Join(data, "f"), []byte("kept"), 0o644)
	kill := restictest.HeldLock(t, r.Repository, r.Password)
	released := make(chan time.Time, 1)
	go func() {
		time.Sleep(2 * time.Second)
		kill() // its lock is stale now: the waiting backup removes it
		released <- time.Now()
	}()
	if _, err := r.Backup(ctx, data, "n1", "mesh:db/pg"); err != nil {
		t.Fatalf("a backup waiting for a lock: %v", err)
	}
	select {
	case <-released:
	default:
		t.Fatal("the backup went while the repository was locked")
	}
}

// A repository restic cannot open is said by restic's Fatal line, not its
// "is there a repository at the following location?"; and restic's words
// never carry the REST password, however restic wrote it.
func TestRepo_FailureSaid(t *testing.T) {
	restictest.Need(t)
	r := Repo{Repository: "rest:http://n1:s3cret%2Fpw@127.0.0.1:1/n1/", Password: "x"}
	_, err := r.Snapshots(context.Background(), "")
	if err == nil || !strings.Contains(err.Error(), "unable to open config file") || !strings.Contains(err.Error(), "connection refused") ||
		strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("an unreachable repository: %v", err)
	}
	if got := r.redact("Head http://n1:s3cret/pw@127.0.0.1:1/n1/config and s3cret%2Fpw"); strings.Contains(got, "s3cret") {
		t.Fatalf("redacted: %s", got)
	}
}
