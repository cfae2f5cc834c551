package restic

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// The real restic, on a repository in a directory: made, a data set
// backed up twice (the second adds only what changed), listed newest
// first, restored byte-identical, checked, pruned; a wrong password
// refused in one line.
func TestRepo_RealRestic(t *testing.T) {
	ctx := context.Background()
	if _, err := Version(ctx); err != nil {
		if os.Getenv("MESH_TEST_TOOLS") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	dir := t.TempDir()
	r := Repo{Repository: filepath.Join(dir, "repo"), Password: "correct horse"}
	if err := r.Init(ctx); err != nil {
		t.Fatal(err)
	}
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
