package host

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"mesh-controller/app/protocol"
)

// The tests of a module's prepare run a real host on the real broker,
// with the real restic against the holder's real REST server (bkMesh):
// the snapshots are taken and restored as on a node.

// goodData is what db 1.0.0 keeps in its data set main.
var goodData = map[string]string{"a": "one", "sub/b": "two"}

// dbAt is db at version, its data set main irreplaceable, backed up
// through the holder (unless noBackup), with prepare if given (its words,
// then its timeout if any).
func (m *bkMesh) dbAt(version string, prepare ...string) map[string]any {
	d := m.dbModule("/var/lib/db", nil)
	mod := d["modules"].([]any)[0].(map[string]any)
	mod["version"] = version
	if len(prepare) > 0 {
		p := map[string]any{"command": []any{"sh", "-c", prepare[0]}}
		if len(prepare) > 1 {
			p["timeout"] = prepare[1]
		}
		mod["prepare"] = p
	}
	return d
}

// pushFails pushes d and returns the host's report, which must say it
// failed.
func (m *bkMesh) pushFails(d map[string]any) protocol.AppliedBody {
	m.t.Helper()
	serial := m.push(d)
	r := m.report(60 * time.Second)
	if r.Serial != serial || r.OK {
		m.t.Fatalf("declaration %d: %+v, want it failed; the host's log:\n%s", serial, r, m.log.String())
	}
	return r
}

// readyAt waits until db runs version, ready, and returns its state.
func (m *bkMesh) readyAt(version string) protocol.ModuleState {
	m.t.Helper()
	var st protocol.ModuleState
	checkFor(m.t, 20*time.Second, 20*time.Millisecond, func() error {
		st, _ = stateOf(m.sup, "db")
		if st.Version != version || st.State != protocol.StateReady {
			return fmt.Errorf("db is %s %s (%s), want %s ready", st.Version, st.State, st.Detail, version)
		}
		return nil
	})
	return st
}

// kinds are the outcomes heard since, by kind, each checked OK.
func (m *bkMesh) heardOutcomes(n int) []protocol.BackupOutcome {
	m.t.Helper()
	var outs []protocol.BackupOutcome
	for range n {
		select {
		case out := <-m.outcomes:
			if !out.OK {
				m.t.Fatalf("an outcome failed: %+v", out)
			}
			outs = append(outs, out)
		case <-time.After(30 * time.Second):
			m.t.Fatalf("%d outcomes heard, want %d: %+v", len(outs), n, outs)
		}
	}
	select {
	case out := <-m.outcomes:
		m.t.Fatalf("an outcome more: %+v", out)
	case <-time.After(100 * time.Millisecond):
	}
	return outs
}

// A prepare that fails, or outlives its timeout, fails the apply whole:
// the old version runs again on its data, byte for byte as it was (a
// prepare that changed nothing needs no restore); the snapshot taken
// first is reported as any backup. One that corrupts the data and fails
// has the data set restored from that snapshot, byte for byte, what it
// left moved aside and kept (the restore reported with where), and the
// old version runs again on it. Each report says in one line what failed,
// that the old version runs again, and what became of the data.
func TestPrepare_FailsOldRunsAgain(t *testing.T) {
	t.Parallel()
	m := newBkMesh(t)
	m.start()
	m.write("var/lib/db", goodData)
	m.declare(m.dbAt("1.0.0"))
	first := m.readyAt("1.0.0")

	t.Run("fails", func(t *testing.T) {
		r := m.pushFails(m.dbAt("2.0.0", "echo migrating from $MESH_PREPARE_FROM; exit 3"))
		if want := "prepare of db 2.0.0 failed: exit status 3: migrating from 1.0.0; db 1.0.0 runs again: data left as it was (prepare changed none of it)"; r.Error != want {
			t.Fatalf("the report: %q\nwant %q", r.Error, want)
		}
		outs := m.heardOutcomes(1)
		if o := outs[0]; o.Kind != protocol.KindBackup || o.Module != "db" || o.Data != "main" || o.Snapshot == "" || o.Reason != "before the upgrade of db to 2.0.0" {
			t.Fatalf("the snapshot's outcome: %+v", o)
		}
		ss, err := m.repo().Snapshots(context.Background(), protocol.BackupTag("db", "main"))
		if err != nil || len(ss) != 1 || !strings.Contains(strings.Join(ss[0].Tags, " "), "mesh:before-upgrade-to-2.0.0") {
			t.Fatalf("the repository's snapshots: %+v %v", ss, err)
		}
		sameTree(t, "the data", m.tree("var/lib/db"), goodData)
		st := m.readyAt("1.0.0")
		if st.Pid == first.Pid || st.Detail != "prepare of 2.0.0 failed; data left as it was (prepare changed none of it)" {
			t.Fatalf("db was not stopped for the prepare, or says nothing of it: %+v (first pid %d)", st, first.Pid)
		}
		if logs, _ := os.ReadFile(filepath.Join(m.root, "var/log/mesh/db.log")); !strings.Contains(string(logs), "prepare of 2.0.0 failed: exit status 3") {
			t.Fatalf("the module's log says nothing of its prepare:\n%s", logs)
		}
	})

	t.Run("hangs past its timeout", func(t *testing.T) {
		r := m.pushFails(m.dbAt("2.0.0", "sleep 6661 & sleep 6662", "1s"))
		if !strings.HasPrefix(r.Error, "prepare of db 2.0.0 failed: stopped after 1s; db 1.0.0 runs again: data left as it was") {
			t.Fatalf("the report: %q", r.Error)
		}
		m.heardOutcomes(1)
		if out, _ := exec.Command("pgrep", "-f", "sleep 666[12]").Output(); len(out) > 0 {
			t.Fatalf("the prepare's processes outlive it: %s", out)
		}
		sameTree(t, "the data", m.tree("var/lib/db"), goodData)
		m.readyAt("1.0.0")
	})

	t.Run("corrupts the data and fails", func(t *testing.T) {
		r := m.pushFails(m.dbAt("2.0.0", "echo broken > $MESH_DATA_MAIN/a; rm $MESH_DATA_MAIN/sub/b; echo 'schema 2 half-applied' >&2; exit 4"))
		outs := m.heardOutcomes(2)
		snap, restore := outs[0], outs[1]
		if snap.Kind != protocol.KindBackup || restore.Kind != protocol.KindRestore || protocol.ShortSnapshot(restore.Snapshot) != snap.Snapshot ||
			!strings.HasPrefix(restore.Aside, "/var/lib/db.before-restore-") || restore.Reason != "prepare of 2.0.0 failed: main restored as it was before it" {
			t.Fatalf("the outcomes: %+v", outs)
		}
		want := fmt.Sprintf("prepare of db 2.0.0 failed: exit status 4: schema 2 half-applied; db 1.0.0 runs again: data restored from the pre-upgrade snapshot %s (what prepare left is kept at %s)",
			protocol.ShortSnapshot(snap.Snapshot), restore.Aside)
		if r.Error != want {
			t.Fatalf("the report: %q\nwant %q", r.Error, want)
		}
		sameTree(t, "restored", m.tree("var/lib/db"), goodData)
		sameTree(t, "what prepare left", m.tree(restore.Aside), map[string]string{"a": "broken\n"})
		st := m.readyAt("1.0.0")
		if want := "prepare of 2.0.0 failed; data restored from the pre-upgrade snapshot " + protocol.ShortSnapshot(snap.Snapshot); st.Detail != want {
			t.Fatalf("db says %q, want %q", st.Detail, want)
		}
		m.scratchLeft("var/lib/db")
	})
	m.noSecrets()
}

// A prepare that succeeds is remembered (upgrades.json, 0600), and the
// new version runs on the data it prepared; a later declaration that moves
// the module back to the version it came from restores the data from the
// snapshot taken before the prepare (what the new version left moved
// aside and kept), and says so. A move back to an older version no
// prepare moved it from leaves the data as it is, and says that.
func TestPrepare_SucceedsThenBack(t *testing.T) {
	t.Parallel()
	m := newBkMesh(t)
	m.start()
	m.write("var/lib/db", goodData)
	m.declare(m.dbAt("1.0.0"))
	m.readyAt("1.0.0")

	m.declare(m.dbAt("2.0.0", "echo 2 > $MESH_DATA_MAIN/schema"))
	snap := m.heardOutcomes(1)[0]
	short := protocol.ShortSnapshot(snap.Snapshot)
	st := m.readyAt("2.0.0")
	if want := "prepare of 2.0.0 ran; snapshotted first: main " + short; st.Detail != want {
		t.Fatalf("db says %q, want %q", st.Detail, want)
	}
	prepared := map[string]string{"a": "one", "sub/b": "two", "schema": "2\n"}
	sameTree(t, "prepared", m.tree("var/lib/db"), prepared)
	fi, err := os.Stat(filepath.Join(m.st.Dir, fileUpgrades))
	ups, _ := loadJSON[upgradesState](m.st.Dir, fileUpgrades)
	if err != nil || fi.Mode().Perm() != 0o600 || len(ups.Prepared) != 1 || ups.Prepared[0].From != "1.0.0" || ups.Prepared[0].To != "2.0.0" ||
		ups.Prepared[0].Snapshots[0].Snapshot != snap.Snapshot {
		t.Fatalf("what the host remembers: %+v (%v, %v)", ups, fi, err)
	}
	// 2.0.0 writes what 1.0.0 cannot read.
	m.write("var/lib/db", map[string]string{"v2-only": "x"})

	t.Run("back from a prepared version", func(t *testing.T) {
		m.declare(m.dbAt("1.0.0"))
		restore := m.heardOutcomes(1)[0]
		if restore.Kind != protocol.KindRestore || protocol.ShortSnapshot(restore.Snapshot) != snap.Snapshot || !strings.HasPrefix(restore.Aside, "/var/lib/db.before-restore-") {
			t.Fatalf("the restore's outcome: %+v", restore)
		}
		sameTree(t, "restored", m.tree("var/lib/db"), goodData)
		sameTree(t, "what 2.0.0 left", m.tree(restore.Aside), map[string]string{"a": "one", "sub/b": "two", "schema": "2\n", "v2-only": "x"})
		st := m.readyAt("1.0.0")
		if want := "data restored from the pre-upgrade snapshot " + short + " (prepare of 2.0.0 had run)"; st.Detail != want {
			t.Fatalf("db says %q, want %q", st.Detail, want)
		}
		if ups, _ := loadJSON[upgradesState](m.st.Dir, fileUpgrades); len(ups.Prepared) != 0 {
			t.Fatalf("the way back is still remembered: %+v", ups)
		}
		m.scratchLeft("var/lib/db")
	})

	t.Run("back when no prepare had run", func(t *testing.T) {
		m.declare(m.dbAt("3.0.0"))
		m.readyAt("3.0.0")
		m.write("var/lib/db", map[string]string{"v3": "y"})
		m.declare(m.dbAt("1.0.0"))
		st := m.readyAt("1.0.0")
		if want := "data left as it was (no prepare of 3.0.0 had run)"; st.Detail != want {
			t.Fatalf("db says %q, want %q", st.Detail, want)
		}
		sameTree(t, "left", m.tree("var/lib/db"), map[string]string{"a": "one", "sub/b": "two", "v3": "y"})
		m.heardOutcomes(0)
	})
}

// A version with a prepare whose module keeps an irreplaceable data set
// no snapshot can be taken of (no backup holder, no access yet, the
// holder unreachable) is refused before anything changes, in one line
// naming the set and why: the old version never stopped, the prepare never
// ran. Allowed without a snapshot (the roll-out's mark), it goes on and
// says so, as it does for a costly set without one.
func TestPrepare_NoSnapshotRefused(t *testing.T) {
	t.Parallel()
	m := newBkMesh(t)
	m.start()
	m.write("var/lib/db", goodData)
	base := func(version string, prepare ...string) map[string]any {
		d := m.dbAt(version, prepare...)
		mod := d["modules"].([]any)[0].(map[string]any)
		mod["data"] = append(mod["data"].([]any), map[string]any{"name": "cache", "path": "/var/lib/db-cache", "precious": "costly"})
		return d
	}
	m.declare(base("1.0.0"))
	first := m.readyAt("1.0.0")
	marker := "touch $HOME/prepared"
	ran := filepath.Join(m.root, protocol.ModulesDir, "db", "prepared")
	for why, change := range map[string]func(d map[string]any){
		"no backup holder keeps it":                            func(d map[string]any) { delete(d, "backups") },
		"this node has no access to its backup repository yet": func(d map[string]any) { d["backups"].([]any)[0].(map[string]any)["access"] = "" },
		"the backup holder at 127.0.0.1:": func(d map[string]any) {
			d["backups"].([]any)[0].(map[string]any)["repository"] = "rest:http://127.0.0.1:1/n1/"
		},
	} {
		d := base("2.0.0", marker)
		change(d)
		r := m.pushFails(d)
		if !strings.HasPrefix(r.Error, "refused: db cannot be upgraded to 2.0.0: its irreplaceable data set main cannot be snapshotted first: "+why) ||
			!strings.HasSuffix(r.Error, "db 1.0.0 runs on, untouched (upgrade db roll-out --without-snapshot --why ... allows it)") {
			t.Errorf("%s: %q", why, r.Error)
		}
	}
	if st, _ := stateOf(m.sup, "db"); st.Pid != first.Pid || st.Version != "1.0.0" {
		t.Fatalf("db was stopped: %+v (was pid %d)", st, first.Pid)
	}
	if _, err := os.Stat(ran); err == nil {
		t.Fatal("the prepare ran")
	}

	d := base("2.0.0", marker)
	delete(d, "backups")
	d["modules"].([]any)[0].(map[string]any)["without_snapshot"] = true
	m.declare(d)
	st := m.readyAt("2.0.0")
	want := "prepare of 2.0.0 ran; main not snapshotted (allowed without a snapshot: no backup holder keeps it (no module holds the backup seat, or its address is unknown)); " +
		"cache not snapshotted (no backup holder keeps it (no module holds the backup seat, or its address is unknown))"
	if st.Detail != want {
		t.Fatalf("db says %q\nwant %q", st.Detail, want)
	}
	if _, err := os.Stat(ran); err != nil {
		t.Fatalf("the prepare did not run: %v", err)
	}
	sameTree(t, "the data", m.tree("var/lib/db"), goodData)
}

// A roll-out's mark on a declared module (without_snapshot), set or
// dropped, does not change how it runs: its host restarts nothing for it.
func TestRunRecords_WithoutSnapshotRestartsNothing(t *testing.T) {
	raw := func(mark bool) json.RawMessage {
		m := protocol.DeclaredModule{Module: "db", Version: "2.0.0", Run: &protocol.Run{Command: []string{"bin/db", "<&>"}},
			Prepare: &protocol.Prepare{Command: []string{"bin/migrate"}}, WithoutSnapshot: mark, Settings: json.RawMessage(`{"a":"<b>"}`)}
		b, err := protocol.Declaration{Node: "n1", Modules: []protocol.DeclaredModule{m}}.Encode()
		if err != nil {
			t.Fatal(err)
		}
		var d struct{ Modules []json.RawMessage }
		json.Unmarshal(b, &d)
		return d.Modules[0]
	}
	with, without := raw(true), raw(false)
	if string(with) == string(without) || sha256.Sum256(runPart(with)) != sha256.Sum256(runPart(without)) {
		t.Fatalf("the mark changes the run's digest:\n%s\n%s", runPart(with), runPart(without))
	}
}
