package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"mesh-controller/app"
	"mesh-controller/app/backupseat"
	"mesh-controller/app/host"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/inventory"
)

// notesManifest is a module with one irreplaceable data set backed up
// hourly, whose program only sleeps.
const notesManifest = `{"module": "notes", "version": "1.0.0", "run": {"command": ["bin/notes"]},
 "data": [{"name": "files", "path": "/srv/notes", "keeps": "the notes", "precious": "irreplaceable", "backup": "hourly"}]}`

// backupManifest is the example backup module's manifest, its holder
// looking for what is due every second.
func backupManifest(t *testing.T) string {
	// The copy kept beside the manifest tests: a clone has it wherever
	// it is, shared/ or not.
	b, err := os.ReadFile(filepath.Join("..", "..", "contexts", "inventory", "testdata", "backup.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	m["run"].(map[string]any)["env"] = map[string]string{"BACKUP_TICK": "1s"}
	out, _ := json.Marshal(m)
	return writeManifest(t, string(out))
}

// backupMesh is a mesh whose nas1 runs the real backup module (mesh-backup)
// on the backup seat and whose db1 runs notes, backed up hourly.
type backupMesh struct {
	*testMesh
	nas1, db1 *testHost
	rest      string // the holder's REST server, host:port
	password  string
	notes     string // db1's notes directory
	repos     string // nas1's repositories
}

func newBackupMesh(t *testing.T) *backupMesh {
	m := newTestMesh(t)
	b := &backupMesh{testMesh: m, nas1: m.joinWith("nas1", &host.Supervisor{BackoffBase: 50 * time.Millisecond, BackoffCap: time.Second}), db1: m.join("db1")}
	b.nas1.install(t, "backup", "bin/backup", buildProgram(t, "mesh-backup", "../../cmd/mesh-backup"))
	sleeper := filepath.Join(t.TempDir(), "notes")
	if err := os.WriteFile(sleeper, []byte("#!/bin/sh\nexec sleep 1000\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	b.db1.install(t, "notes", "bin/notes", sleeper)
	m.addModule(backupManifest(t))
	m.addModule(writeManifest(t, notesManifest))
	ctx := context.Background()
	b.rest = freeAddr(t)
	host, port, _ := strings.Cut(b.rest, ":")
	if _, err := m.c.SettingsSet(ctx, app.SettingsRequest{Module: "backup", Body: []byte(`{"address": "` + host + `", "port": ` + port + `}`), From: "test"}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.c.Assign(ctx, "nas1", []string{"backup"}); err != nil {
		t.Fatal(err)
	}
	b.password = "repo-" + rand.Text()
	if _, err := m.c.SecretAccept(ctx, "nas1", "backup", "repository_password", protocol.NewSecret([]byte(b.password))); err != nil {
		t.Fatal(err)
	}
	b.notes = filepath.Join(b.db1.root, "srv", "notes")
	b.repos = filepath.Join(b.nas1.root, "srv", "backup", "repository")
	if err := os.MkdirAll(b.notes, 0o755); err != nil {
		t.Fatal(err)
	}
	b.write(t, map[string]string{"a.txt": "first note\n", "sub/b.txt": strings.Repeat("b", 100_000)})
	if _, err := m.c.Assign(ctx, "db1", []string{"notes"}); err != nil {
		t.Fatal(err)
	}
	return b
}

// dump logs the holder's lines and the controller's, for a failure.
func (b *backupMesh) dump(t *testing.T) {
	lines, _ := b.nas1.sup.Tail("backup", 60)
	t.Logf("the holder said:\n%s", strings.Join(lines, "\n"))
	t.Logf("the controller said:\n%s", b.logs.String())
	t.Logf("db1 is %+v", b.state(t))
	lf, _ := os.ReadFile(filepath.Join(b.nas1.root, protocol.ModulesDir, "backup", protocol.BackupLinesName))
	t.Logf("the holder's lines: %s", lf)
}

// write writes files beneath db1's notes.
func (b *backupMesh) write(t *testing.T, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(b.notes, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// tree reads every regular file beneath dir.
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		out[rel] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// state is the controller's record of db1/notes/files' backups.
func (b *backupMesh) state(t *testing.T) inventory.BackupState {
	t.Helper()
	st, err := b.c.Stores(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	snap, err := st.Inventory.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return snap.Seats.BackupStates["db1/notes/files"]
}

// firstBackup bounds the wait for a line's first backup: the holder asks
// on its tick, then restic makes the repository and writes it, which on a
// loaded machine took longer than settle.
const firstBackup = 45 * time.Second

// backedUp is a check that db1/notes/files' last backup made a snapshot;
// it says why not.
func (b *backupMesh) backedUp(t *testing.T) func() error {
	return func() error {
		if s := b.state(t); !s.AttemptOK {
			return fmt.Errorf("db1/notes/files not backed up yet; the last attempt: at %s, %s", timeOf(s.AttemptAt), s.AttemptWhy)
		}
		return nil
	}
}

// stockRestic runs Debian's restic on the holder's repository of db1 with
// the repository password alone.
func (b *backupMesh) stockRestic(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("restic", append([]string{"--no-cache", "-r", filepath.Join(b.repos, "db1")}, args...)...)
	cmd.Env = append(os.Environ(), "RESTIC_PASSWORD="+b.password)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// The whole of a backup's life with real hosts, the real backup module on
// the seat's holder, real restic and a real REST server: db1's notes are
// backed up on their cadence with no one asking, drilled, backed up by
// hand with only what changed added; Debian's restic opens the repository
// with its password alone; db1 cannot delete its own snapshots with its
// access; notes lost on db1 are restored byte-identical with the damaged
// contents kept aside (a retired data set data lists); a tampered
// repository fails a drill and raises data.restore-unverified.
func TestBackups_EndToEnd(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("restic"); err != nil {
		if os.Getenv("MESH_TEST_TOOLS") != "" {
			t.Fatal("restic is not installed: make test installs it")
		}
		t.Skip("restic is not installed (make test installs it)")
	}
	b := newBackupMesh(t)
	ctx := context.Background()
	var outputs []any
	t.Cleanup(func() {
		if t.Failed() {
			b.dump(t)
		}
	})

	// On its cadence: never backed up, it is due at once.
	checkFor(t, firstBackup, b.backedUp(t))
	first := b.state(t)
	if first.Snapshot == "" || first.Files != 2 || first.BytesAdded <= 0 {
		t.Fatalf("the first backup: %+v", first)
	}
	checkFor(t, settle, func() error {
		if s := b.state(t); s.VerifiedAt == nil {
			return fmt.Errorf("no drill of db1's notes passed yet; the last: at %s, ok %v, %s", timeOf(s.DrillAt), s.DrillOK, s.DrillWhy)
		}
		return nil
	})

	// By hand, after a change: only what changed is added.
	b.write(t, map[string]string{"c.txt": "a new note\n"})
	done, err := b.c.DataBackup(ctx, app.BackupRequest{Sets: []string{"db1/notes/files"}, Why: "the test", Wait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	outputs = append(outputs, done)
	if len(done) != 1 || !done[0].Run.OK || done[0].Run.Snapshot == "" || done[0].Run.Snapshot == first.Snapshot {
		t.Fatalf("data backup: %+v", done)
	}
	if added := done[0].Run.BytesAdded; added <= 0 || added >= first.BytesAdded {
		t.Fatalf("the second backup added %d bytes, the first %d: only what changed should cross", added, first.BytesAdded)
	}
	want := tree(t, b.notes)

	snaps, err := b.c.DataSnapshots(ctx, "db1/notes/files")
	if err != nil {
		t.Fatal(err)
	}
	outputs = append(outputs, snaps)
	if len(snaps) != 2 || !strings.HasPrefix(snaps[0].ID, done[0].Run.Snapshot) || !snaps[0].Time.After(snaps[1].Time) {
		t.Fatalf("data snapshots, newest first: %+v", snaps)
	}

	// Break-glass: Debian's restic and the repository password alone.
	out, err := b.stockRestic(t, "ls", "--no-lock", "latest")
	if err != nil || !strings.Contains(out, "c.txt") {
		t.Fatalf("stock restic could not list the latest snapshot: %v\n%s", err, out)
	}

	// db1's own access cannot remove what is kept: the server is
	// append-only; nor can it reach another node's repository.
	access := protocol.BackupAccess{User: "db1", Password: backupseat.NodePassword([]byte(b.password), "db1"), RepositoryPassword: b.password}
	rest := func(node string, args ...string) (string, error) {
		cmd := exec.Command("restic", append([]string{"--no-cache"}, args...)...)
		cmd.Env = append(os.Environ(), "RESTIC_PASSWORD="+access.RepositoryPassword,
			"RESTIC_REPOSITORY=rest:http://"+access.User+":"+access.Password+"@"+b.rest+"/"+node+"/")
		o, err := cmd.CombinedOutput()
		return string(o), err
	}
	if out, err := rest("db1", "snapshots"); err != nil {
		t.Fatalf("db1's access does not open its repository: %v\n%s", err, out)
	}
	// restic itself retries a refused delete for minutes: the server's
	// answer is read as restic's REST backend asks it.
	del, _ := http.NewRequest(http.MethodDelete, "http://"+b.rest+"/db1/snapshots/"+snaps[1].ID, nil)
	del.SetBasicAuth(access.User, access.Password)
	if resp, err := http.DefaultClient.Do(del); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("db1 deleting its own snapshot: %v %v (want 403 Forbidden: append-only)", resp, err)
	}
	other, _ := http.NewRequest(http.MethodGet, "http://"+b.rest+"/nas1/config", nil)
	other.SetBasicAuth(access.User, access.Password)
	if resp, err := http.DefaultClient.Do(other); err != nil || resp.StatusCode == http.StatusOK {
		t.Fatalf("db1 reading nas1's repository: %v %v", resp, err)
	}
	bad, _ := http.NewRequest(http.MethodGet, "http://"+b.rest+"/db1/config", nil)
	bad.SetBasicAuth("db1", "not-its-password")
	if resp, err := http.DefaultClient.Do(bad); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a wrong REST password: %v %v", resp, err)
	}
	if again, err := b.c.DataSnapshots(ctx, "db1/notes/files"); err != nil || len(again) != 2 {
		t.Fatalf("after db1 tried to forget one, the snapshots are %+v (%v)", again, err)
	}

	// Lost on its node: restored byte-identical, the damaged contents
	// moved aside and kept.
	if err := os.Remove(filepath.Join(b.notes, "a.txt")); err != nil {
		t.Fatal(err)
	}
	b.write(t, map[string]string{"sub/b.txt": "damaged"})
	damaged := tree(t, b.notes)
	restored, err := b.c.DataRestore(ctx, app.RestoreRequest{Set: "db1/notes/files", Snapshot: done[0].Run.Snapshot, Why: "the test lost them", Wait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	outputs = append(outputs, restored)
	if got := tree(t, b.notes); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("restored %v, backed up %v", got, want)
	}
	if restored.AsideName == "" || restored.Restore.Aside == "" {
		t.Fatalf("the restore kept nothing aside: %+v", restored)
	}
	if got := tree(t, filepath.Join(b.db1.root, strings.TrimPrefix(restored.Restore.Aside, "/"))); fmt.Sprint(got) != fmt.Sprint(damaged) {
		t.Fatalf("aside %v, damaged %v", got, damaged)
	}
	views, err := b.c.Data(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, v := range views {
		found = found || (v.Node == "db1" && v.Name == restored.AsideName && v.State == "retired")
	}
	if !found {
		t.Fatalf("data does not list the aside %s as retired: %+v", restored.AsideName, views)
	}
	if restored.Before == nil || !restored.Before.OK {
		t.Fatalf("no fresh snapshot before the restore: %+v", restored.Before)
	}

	// A drill now passes; one of a tampered repository fails.
	drill, err := b.c.DataVerify(ctx, app.VerifyRequest{Set: "db1/notes/files", Wait: time.Minute})
	if err != nil || !drill.OK {
		t.Fatalf("data verify: %+v %v", drill, err)
	}
	outputs = append(outputs, drill)
	packs := 0
	err = filepath.WalkDir(filepath.Join(b.repos, "db1", "data"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		packs++
		_, err = f.WriteAt([]byte("tampered"), 40)
		return err
	})
	if err != nil || packs == 0 {
		t.Fatalf("tamper with the packs: %d, %v", packs, err)
	}
	if o, err := b.c.DataVerify(ctx, app.VerifyRequest{Set: "db1/notes/files", Wait: time.Minute}); err == nil || o.OK {
		t.Fatalf("a drill of a tampered repository passed: %+v", o)
	}
	checkFor(t, settle, b.opened(t, "data.restore-unverified/db1/notes/files"))

	// Every document's keys are snake_case, as --json prints them.
	for _, v := range outputs {
		doc, _ := json.Marshal(v)
		var tree any
		json.Unmarshal(doc, &tree)
		if bad := notSnake(tree); bad != "" {
			t.Errorf("%T has key %q", v, bad)
		}
	}
}

// notSnake is the first key of a JSON document that is not snake_case.
func notSnake(v any) string {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			for _, r := range k {
				if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
					return k
				}
			}
			if bad := notSnake(e); bad != "" {
				return bad
			}
		}
	case []any:
		for _, e := range x {
			if bad := notSnake(e); bad != "" {
				return bad
			}
		}
	}
	return ""
}

// The holder's REST server is away when a backup is asked: it fails, says
// why in one line and raises data.backup-failed; nothing kept is lost, and
// once it is back the next backup completes.
func TestBackups_HolderAway(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("restic"); err != nil {
		t.Skip("restic is not installed (make test installs it)")
	}
	b := newBackupMesh(t)
	ctx := context.Background()
	checkFor(t, firstBackup, b.backedUp(t))
	kept := b.state(t).Snapshot
	b.nas1.stop()
	b.nas1.sup.StopAll()
	_, err := b.c.DataBackup(ctx, app.BackupRequest{Sets: []string{"db1/notes/files"}, Why: "the holder is away", Wait: time.Minute})
	if err == nil || strings.Contains(err.Error(), "\n") {
		t.Fatalf("a backup with the holder away: %v", err)
	}
	t.Logf("with the holder away: %v", err)
	checkFor(t, settle, b.opened(t, "data.backup-failed/db1/notes/files"))
	b.nas1.sup = &host.Supervisor{BackoffBase: 50 * time.Millisecond, BackoffCap: time.Second}
	b.nas1.start()
	checkFor(t, time.Minute, func() error {
		_, err := b.c.DataBackup(ctx, app.BackupRequest{Sets: []string{"db1/notes/files"}, Why: "the holder is back", Wait: time.Minute})
		return err
	})
	// A listing takes no lock: the holder may be pruning beside it (under a
	// CPU hog its exclusive lock was still held when this asked).
	if out, err := b.stockRestic(t, "snapshots", "--no-lock", kept); err != nil {
		t.Fatalf("the snapshot kept before is gone: %v\n%s", err, out)
	}
	checkFor(t, settle, b.cleared(t, "data.backup-failed/db1/notes/files"))
}
