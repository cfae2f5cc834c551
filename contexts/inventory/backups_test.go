package inventory

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A backup run is kept with its data set's state: a failed backup leaves
// the last snapshot and the last backup heard as they were, a passing
// drill is the last verification, and each moves the backup seat's
// holder's plan; runs are bounded; an access is kept sealed, moving its
// node's plan. On both engines.
func TestStore_BackupRuns(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	t0 := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	if err := s.AddNodes(ctx, []string{"bk1", "db1"}, Converged, t0); err != nil {
		t.Fatal(err)
	}
	m := addExample(t, s, "backup", t0)
	if err := s.Apply(ctx, Change{Assign: []Assignment{{Node: "bk1", Module: m.Module, Version: m.Version, AssignedAt: t0}},
		Seats: []SeatChange{{Seat: "backup", Add: []Holder{{Node: "bk1", Module: m.Module}}}}}, t0); err != nil {
		t.Fatal(err)
	}
	planOf := func(node string) int64 {
		t.Helper()
		snap, err := s.Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return snap.Nodes[node].PlanVersion
	}
	state := func() BackupState {
		t.Helper()
		snap, err := s.Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return snap.Seats.BackupStates["db1/postgres/pg"]
	}
	before := planOf("bk1")
	ok := BackupRun{Ask: "bk-1", Node: "db1", Module: "postgres", Name: "pg", Kind: RunBackup, At: t0, OK: true, Snapshot: "0a1b2c3d", Files: 10, Bytes: 1000, BytesAdded: 400, DurationMS: 12}
	if err := s.RecordBackupRun(ctx, ok); err != nil {
		t.Fatal(err)
	}
	if planOf("bk1") == before {
		t.Error("a backup did not move the holder's plan (its lines carry the last backup)")
	}
	failed := BackupRun{Ask: "bk-2", Node: "db1", Module: "postgres", Name: "pg", Kind: RunBackup, At: t0.Add(time.Hour), Why: "the holder is away"}
	if err := s.RecordBackupRun(ctx, failed); err != nil {
		t.Fatal(err)
	}
	st := state()
	if st.AttemptOK || st.AttemptWhy != "the holder is away" || !st.AttemptAt.Equal(t0.Add(time.Hour)) || st.Snapshot != "0a1b2c3d" || st.BytesAdded != 400 {
		t.Fatalf("after a failure: %+v", st)
	}
	snap, _ := s.Snapshot(ctx)
	if last := snap.Seats.Backups["db1/postgres/pg"]; !last.Equal(t0) {
		t.Fatalf("last backup %v after a failure, want the one before", last)
	}
	drill := BackupRun{Ask: "dr-1", Node: "db1", Module: "postgres", Name: "pg", Kind: RunDrill, At: t0.Add(2 * time.Hour), OK: true, Snapshot: "0a1b2c3d"}
	if err := s.RecordBackupRun(ctx, drill); err != nil {
		t.Fatal(err)
	}
	tampered := BackupRun{Ask: "dr-2", Node: "db1", Module: "postgres", Name: "pg", Kind: RunDrill, At: t0.Add(3 * time.Hour), Why: "pack 9f… is damaged"}
	if err := s.RecordBackupRun(ctx, tampered); err != nil {
		t.Fatal(err)
	}
	if st := state(); st.DrillOK || st.DrillWhy != tampered.Why || st.VerifiedAt == nil || !st.VerifiedAt.Equal(drill.At) {
		t.Fatalf("after a failed drill: %+v", st)
	}
	// A restore that moved the data aside keeps it retired, and the data's
	// node declares its backup: its plan moves (before, its host refused
	// the holder's first due line for it: "declares no backup").
	db1 := planOf("db1")
	restored := BackupRun{Ask: "rs-1", Node: "db1", Module: "postgres", Name: "pg", Kind: RunRestore, At: t0.Add(4 * time.Hour), OK: true, Snapshot: "0a1b2c3d",
		Aside: "/var/lib/postgres/data.before-restore-20261201T070000", Precious: Irreplaceable}
	if err := s.RecordBackupRun(ctx, restored); err != nil {
		t.Fatal(err)
	}
	if planOf("db1") == db1 {
		t.Error("a restore that moved data aside did not move its node's plan")
	}
	if snap, _ := s.Snapshot(ctx); len(snap.Seats.Retired) != 1 || snap.Seats.Retired[0].DataSet != AsideName("pg", restored.At) {
		t.Fatalf("retired after the restore: %+v", snap.Seats.Retired)
	}
	if r, err := s.BackupRunOf(ctx, "bk-2"); err != nil || r == nil || r.OK || r.Why != failed.Why {
		t.Fatalf("run of bk-2: %+v, %v", r, err)
	}
	if r, err := s.BackupRunOf(ctx, "nope"); err != nil || r != nil {
		t.Fatalf("run of an ask not heard: %+v, %v", r, err)
	}
	for i := range RunsKept + 5 {
		r := ok
		r.Ask, r.At = "bulk", t0.Add(time.Duration(i)*time.Minute)
		if err := s.RecordBackupRun(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	runs, err := s.BackupRuns(ctx, "db1", "postgres", "pg", 1000)
	if err != nil {
		t.Fatal(err)
	}
	backups := 0
	for _, r := range runs {
		if r.Kind == RunBackup {
			backups++
		}
	}
	if backups != RunsKept || len(runs) != RunsKept+3 {
		t.Fatalf("%d backup runs kept (%d in all), want %d, the 2 drills and the restore", backups, len(runs), RunsKept)
	}
	if err := s.RecordBackupRun(ctx, BackupRun{Kind: "other"}); err == nil {
		t.Fatal("a run of no kind was kept")
	}

	before = planOf("db1")
	sealed := "-----BEGIN AGE ENCRYPTED FILE-----\nabc\n-----END AGE ENCRYPTED FILE-----\n"
	if err := s.KeepBackupAccess(ctx, "db1", BackupAccess{Holder: "bk1", Sealed: sealed, IssuedAt: t0}); err != nil {
		t.Fatal(err)
	}
	if planOf("db1") == before {
		t.Error("an access did not move its node's plan")
	}
	if snap, _ := s.Snapshot(ctx); snap.Seats.Access["db1"].Sealed != sealed || snap.Seats.Access["db1"].Holder != "bk1" {
		t.Fatalf("access %+v", snap.Seats.Access["db1"])
	}
	if err := s.KeepBackupAccess(ctx, "gone", BackupAccess{Holder: "bk1", Sealed: sealed, IssuedAt: t0}); !errors.Is(err, ErrNodeNotFound) {
		t.Fatalf("an access for a node not in the mesh: %v", err)
	}
	if err := s.KeepBackupAccess(ctx, "db1", BackupAccess{Holder: "bk1", Sealed: "plaintext", IssuedAt: t0}); err == nil {
		t.Fatal("an access that is not age ciphertext was kept")
	}
}
