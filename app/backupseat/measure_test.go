package backupseat

import (
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"mesh-controller/app/protocol"
	"mesh-controller/app/restic"
)

// TestMeasure_Backup measures the backup seat's holder, when
// MESH_MEASURE_BACKUP=1 (make test does not run it; it takes a minute or
// two):
//
//	MESH_MEASURE_BACKUP=1 go test -count=1 -v -run TestMeasure_Backup ./app/backupseat/
//
// A 200 MiB data set (200 files of 1 MiB, random: nothing compresses or
// dedups) is backed up by the real restic through the real Seat's REST
// server on loopback, as a node backs up; then again with 1 % of its
// files changed; restored through the REST server; and drilled by the
// holder. A month of daily backups (restic's --time, a day apart, 1 %
// changed each) is then pruned as the holder prunes its line. The REST
// server runs in this test's process, so this process's peak RSS is the
// server's (restic is a child: its peak is apart). It prints one table.
func TestMeasure_Backup(t *testing.T) {
	if os.Getenv("MESH_MEASURE_BACKUP") != "1" {
		t.Skip("MESH_MEASURE_BACKUP=1 not set")
	}
	repos := t.TempDir()
	ts := newTestSeat(t, repos, "n1", "n2")
	ctx := t.Context()
	data := filepath.Join(t.TempDir(), "db")
	const files = 200
	writeRandom(t, data, files, 1<<20)
	var rows [][]string
	row := func(what string, cells ...any) {
		r := []string{what}
		for _, c := range cells {
			r = append(r, fmt.Sprint(c))
		}
		rows = append(rows, r)
	}

	// (a) A first backup, a second with 1 % changed, a restore, a drill.
	rssBefore := maxRSS(t, syscall.RUSAGE_SELF)
	resetPeak := resetHWM()
	start := time.Now()
	first := ts.backup("n1", data)
	firstTook := time.Since(start)
	rssAfter, hwm := maxRSS(t, syscall.RUSAGE_SELF), vmHWM(t)
	row("first backup", secs(firstTook), fmt.Sprintf("%.1f MiB added", mib(first.DataAdded)), fmt.Sprintf("%.1f MiB on disk", mib(onDisk(t, filepath.Join(repos, "n1")))))

	rewrite(t, data, 7, 150) // 2 files of 200: 1 %
	start = time.Now()
	second := ts.backup("n1", data)
	row("second backup, 1 % changed", secs(time.Since(start)), fmt.Sprintf("%.2f MiB added", mib(second.DataAdded)), fmt.Sprintf("%.1f MiB on disk", mib(onDisk(t, filepath.Join(repos, "n1")))))

	target := t.TempDir()
	start = time.Now()
	if err := ts.asNode("n1").Restore(ctx, second.SnapshotID, target); err != nil {
		t.Fatal(err)
	}
	row("restore through the REST server (--verify)", secs(time.Since(start)), fmt.Sprintf("%.1f MiB", mib(treeBytes(t, target))), "")
	sameTree(t, data, filepath.Join(target, data))

	o := ts.Drill(ctx, "n1", testModule, testData)
	if !o.OK || o.Files != files {
		t.Fatalf("the drill: %+v", o)
	}
	row("drill (check 1/7 of the data, restore --verify)", secs(time.Duration(o.DurationMS*float64(time.Millisecond))), fmt.Sprintf("%d files, %.1f MiB", o.Files, mib(o.Bytes)), "")

	// (b) A month of dailies, then the holder's prune of the line.
	day := time.Date(2026, 1, 2, 3, 4, 5, 0, time.Local)
	start = time.Now()
	const days = 30
	for i := range days {
		if i > 0 {
			rewrite(t, data, (2*i)%files, (2*i+1)%files)
		}
		ts.backupAt("n2", data, day.AddDate(0, 0, i))
	}
	row(fmt.Sprintf("%d daily backups, 1 %% changed each", days), secs(time.Since(start)), fmt.Sprintf("%.2f s each", time.Since(start).Seconds()/days), "")
	// restic's --keep-hourly 24 keeps the newest snapshot of each of the
	// last 24 hours that have one: of daily snapshots, the last 24 days.
	// So the default retention leaves 24 dailies and the older weeks'
	// last (25 of this month), not 7 and the weeks'. And prune repacks
	// no pack less than 5 % of the repository unused (restic's
	// --max-unused): what it frees here is little.
	l, ok := ts.line("n2", testModule, testData)
	if !ok {
		t.Fatal("no line of n2")
	}
	before := onDisk(t, filepath.Join(repos, "n2"))
	start = time.Now()
	if err := ts.prune(ctx, l); err != nil {
		t.Fatal(err)
	}
	pruneTook := time.Since(start)
	ss, err := ts.repo("n2").Snapshots(ctx, protocol.BackupTag(testModule, testData))
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for i := len(ss) - 1; i >= 0; i-- {
		kept = append(kept, ss[i].Time.Format("Jan 2"))
	}
	k := keep(l)
	row("prune (forget --prune, the default retention)", secs(pruneTook), fmt.Sprintf("%d of %d snapshots left", len(ss), days),
		fmt.Sprintf("%.1f MiB on disk before, %.1f MiB after", mib(before), mib(onDisk(t, filepath.Join(repos, "n2")))))

	// (c) Peak RSS: maxrss is the process's high-water mark since it
	// began, so what it was before the first backup (the test's own
	// setup) is given beside it; the kernel's VmHWM, reset just before
	// the backup, is the peak while the server took it in.
	row("in-process REST server: this process's maxrss", "", fmt.Sprintf("%.1f MiB before the first backup, %.1f MiB after", rssBefore, rssAfter), "")
	if resetPeak {
		row("in-process REST server: peak RSS during the first backup", "", fmt.Sprintf("%.1f MiB (VmHWM, reset before it)", hwm), "")
	}
	row("restic (the node's side): largest child's maxrss", "", fmt.Sprintf("%.1f MiB", maxRSS(t, syscall.RUSAGE_CHILDREN)), "")

	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "what\ttime\tfigure\trepository on disk")
	for _, r := range rows {
		fmt.Fprintln(w, strings.Join(r, "\t"))
	}
	w.Flush()
	version, err := restic.Version(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the holder, 200 MiB of random files (200 × 1 MiB), restic %s:\n%s"+
		"kept after the prune (keep hourly %d, daily %d, weekly %d, monthly %d, within %s): %s",
		version, b.String(), k.Hourly, k.Daily, k.Weekly, k.Monthly, k.Within, strings.Join(kept, ", "))
}

// backupAt backs dir up into node's repository through the REST server as
// if at when (restic's --time): a month of daily backups in a minute.
func (ts *testSeat) backupAt(node, dir string, when time.Time) {
	ts.t.Helper()
	r := ts.asNode(node)
	cmd := exec.CommandContext(ts.t.Context(), "restic", "--no-cache", "backup", "--host", node,
		"--tag", protocol.BackupTag(testModule, testData), "--time", when.Format("2006-01-02 15:04:05"), "--", dir)
	cmd.Env = append(os.Environ(), "RESTIC_REPOSITORY="+r.Repository, "RESTIC_PASSWORD="+r.Password)
	if out, err := cmd.CombinedOutput(); err != nil {
		ts.t.Fatalf("restic backup --time %s: %v: %s", when, err, out)
	}
}

// rewrite gives the files numbered so in dir new random contents.
func rewrite(t testing.TB, dir string, numbers ...int) {
	t.Helper()
	for _, i := range numbers {
		p := filepath.Join(dir, fmt.Sprintf("f%03d", i))
		info, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		b := make([]byte, info.Size())
		rand.Read(b)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// maxRSS is who's peak resident set (getrusage), in MiB.
func maxRSS(t testing.TB, who int) float64 {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(who, &ru); err != nil {
		t.Fatal(err)
	}
	return float64(ru.Maxrss) / 1024 // Linux says KiB
}

// resetHWM resets this process's peak RSS (VmHWM) to what it holds now,
// and says whether the kernel let it.
func resetHWM() bool { return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil }

// vmHWM is this process's peak RSS since it began or resetHWM, in MiB.
func vmHWM(t testing.TB) float64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			var kib float64
			if _, err := fmt.Sscanf(strings.TrimSpace(v), "%f kB", &kib); err != nil {
				t.Fatal(err)
			}
			return kib / 1024
		}
	}
	t.Fatal("no VmHWM in /proc/self/status")
	return 0
}

// onDisk is what dir takes on its disk.
func onDisk(t testing.TB, dir string) int64 { _, _, disk := treeSize(t, dir); return disk }

// treeBytes is what the regular files beneath dir hold.
func treeBytes(t testing.TB, dir string) int64 { _, n, _ := treeSize(t, dir); return n }

func secs(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }

func mib(n int64) float64 { return float64(n) / (1 << 20) }
