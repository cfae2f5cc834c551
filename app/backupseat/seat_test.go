package backupseat

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"mesh-controller/app/protocol"
	"mesh-controller/app/restic"
	"mesh-controller/app/restic/restictest"
)

// The holder's tests run the real Seat's REST server (Handler, served by
// httptest: no broker is needed to serve) with the real restic as each
// node runs it, through rest-server as the holder serves it. The holder's
// lines come from its lines file, read by the round Serve runs: a line
// with no recipient and no backup yet asks nothing of the broker.

// The line every node of a test has.
const (
	testModule = "db"
	testData   = "main"
)

// testSeat is a holder whose REST server is served on loopback.
type testSeat struct {
	*Seat
	t   testing.TB
	url string // http://127.0.0.1:PORT
}

// newTestSeat is a holder over repositories with a daily line of each
// node, its round run once as Serve runs it: the nodes are its REST users
// and their repositories are made.
func newTestSeat(t testing.TB, repositories string, nodes ...string) *testSeat {
	t.Helper()
	restictest.Need(t)
	dir := t.TempDir()
	var ls protocol.BackupLines
	for _, n := range nodes {
		ls.Lines = append(ls.Lines, protocol.BackupLine{Node: n, Module: testModule, Data: testData, Path: "/var/lib/db", Cadence: "daily"})
	}
	b, err := json.Marshal(ls)
	if err != nil {
		t.Fatal(err)
	}
	lines := filepath.Join(dir, protocol.BackupLinesName)
	if err := os.WriteFile(lines, b, 0o600); err != nil {
		t.Fatal(err)
	}
	scratch := filepath.Join(dir, "scratch")
	if err := os.Mkdir(scratch, 0o700); err != nil {
		t.Fatal(err)
	}
	s := New(Options{Node: "h1", Module: protocol.BackupModule, Repositories: repositories, Scratch: scratch,
		Password: protocol.NewSecret([]byte("repo-" + rand.Text())), Lines: lines})
	s.round(t.Context())
	for _, n := range nodes {
		if !s.ready[n] {
			t.Fatalf("the round made no repository of %s", n)
		}
	}
	h, err := s.Handler()
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &testSeat{Seat: s, t: t, url: srv.URL}
}

// nodeRepo is node's repository as node reaches it: through the REST
// server, as node's REST user with password.
func (ts *testSeat) nodeRepo(node, password string) restic.Repo {
	host := strings.TrimPrefix(ts.url, "http://")
	return restic.Repo{Repository: "rest:http://" + node + ":" + password + "@" + host + "/" + node + "/",
		Password: string(ts.o.Password.Reveal()), LockWait: -1}
}

// asNode is node's repository reached with node's own REST password.
func (ts *testSeat) asNode(node string) restic.Repo { return ts.nodeRepo(node, ts.restPassword(node)) }

// backup backs dir up into node's repository through the REST server
// (restic 0.14's summary names the snapshot by its short id).
func (ts *testSeat) backup(node, dir string) restic.Summary {
	ts.t.Helper()
	sum, err := ts.asNode(node).Backup(ts.t.Context(), dir, node, protocol.BackupTag(testModule, testData))
	if err != nil {
		ts.t.Fatalf("backup of %s: %v", node, err)
	}
	return sum
}

// status asks the REST server for path with header, and says its status.
func (ts *testSeat) status(method, path string, header http.Header) int {
	ts.t.Helper()
	req, err := http.NewRequestWithContext(ts.t.Context(), method, ts.url+path, nil)
	if err != nil {
		ts.t.Fatal(err)
	}
	req.Header = header
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		ts.t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// basic is a request's header with node's REST user and password.
func basic(node, password string) http.Header {
	r, _ := http.NewRequest(http.MethodGet, "/", nil)
	r.SetBasicAuth(node, password)
	return r.Header
}

// writeRandom writes n files of size random bytes (nothing compresses or
// dedups) named f000… into dir.
func writeRandom(t testing.TB, dir string, n, size int) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, size)
	for i := range n {
		rand.Read(b)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%03d", i)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// sameTree fails unless every regular file beneath want is beneath got
// with the same content, and got holds no other.
func sameTree(t testing.TB, want, got string) {
	t.Helper()
	var files int64
	err := filepath.WalkDir(want, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		files++
		rel, _ := filepath.Rel(want, p)
		a, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(filepath.Join(got, rel))
		if err != nil {
			return err
		}
		if !bytes.Equal(a, b) {
			return fmt.Errorf("%s differs", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	restored, _, _ := treeSize(t, got)
	if restored != files {
		t.Fatalf("%d files restored, %d backed up", restored, files)
	}
}

// treeSize is what is beneath dir: how many regular files, their bytes,
// and what dir and all beneath it take on its disk (blocks, as du counts).
func treeSize(t testing.TB, dir string) (files, size, disk int64) {
	t.Helper()
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			disk += st.Blocks * 512
		}
		if d.Type().IsRegular() {
			files++
			size += info.Size()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files, size, disk
}

// oneLine fails unless err is a non-empty error of one line, and returns it.
func oneLine(t testing.TB, what string, err error) string {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error", what)
	}
	msg := err.Error()
	if strings.TrimSpace(msg) == "" || strings.ContainsAny(msg, "\r\n") {
		t.Fatalf("%s: the error is not one line: %q", what, msg)
	}
	return msg
}

// TestSeat_AppendOnlyAndPrivate: a node's REST user backs up into its own
// repository with stock restic and reads it back, but cannot delete what
// it wrote (a node that is taken over cannot destroy its own backups),
// nor reach another node's repository; a wrong password and a request
// naming its node in the header the holder hands rest-server are refused.
func TestSeat_AppendOnlyAndPrivate(t *testing.T) {
	ts := newTestSeat(t, t.TempDir(), "n1", "n2")
	ctx := t.Context()
	data := filepath.Join(t.TempDir(), "db")
	writeRandom(t, data, 3, 16<<10)

	// The holder made the repository; the node opens it through the REST
	// server as restic init would find it, and backs up.
	n1 := ts.asNode("n1")
	if err := n1.Init(ctx); err != nil {
		t.Fatalf("n1 opens its own repository: %v", err)
	}
	sum := ts.backup("n1", data)
	ss, err := n1.Snapshots(ctx, "")
	if err != nil || len(ss) != 1 || !strings.HasPrefix(ss[0].ID, sum.SnapshotID) {
		t.Fatalf("n1 lists its own snapshots: %v %+v", err, ss)
	}

	// Nothing it wrote may go: not a snapshot, a pack or a key (restic's
	// own forget is not tried: it retries a refusal for most of a
	// minute).
	own := basic("n1", ts.restPassword("n1"))
	keys, _ := os.ReadDir(filepath.Join(ts.o.Repositories, "n1", "keys"))
	packs, _ := filepath.Glob(filepath.Join(ts.o.Repositories, "n1", "data", "*", "*"))
	if len(keys) == 0 || len(packs) == 0 {
		t.Fatalf("n1's repository holds %d keys and %d packs", len(keys), len(packs))
	}
	for _, path := range []string{"/n1/snapshots/" + ss[0].ID, "/n1/data/" + filepath.Base(packs[0]), "/n1/keys/" + keys[0].Name()} {
		if got := ts.status(http.MethodDelete, path, own); got != http.StatusForbidden {
			t.Errorf("n1 deleting %s: %d, want 403", path, got)
		}
	}
	if ss, err := n1.Snapshots(ctx, ""); err != nil || len(ss) != 1 {
		t.Errorf("after the deletes, n1's snapshots: %v %+v", err, ss)
	}
	if err := ts.repo("n1").Check(ctx, "100%"); err != nil {
		t.Errorf("after the deletes, n1's repository: %v", err)
	}

	// Another node's repository, with n1's own credential: refused by
	// rest-server's private repositories, whatever header n1 sends (its
	// own is served: the refusals below are not a server that serves
	// nothing).
	if got := ts.status(http.MethodGet, "/n1/config", own); got != http.StatusOK {
		t.Fatalf("n1 reading its own config: %d, want 200", got)
	}
	for _, path := range []string{"/n2/config", "/n2/snapshots/"} {
		if got := ts.status(http.MethodGet, path, own); got != http.StatusUnauthorized {
			t.Errorf("n1 reading %s: %d, want 401", path, got)
		}
	}
	claimed := own.Clone()
	claimed.Set(nodeHeader, "n2")
	if got := ts.status(http.MethodGet, "/n2/config", claimed); got != http.StatusUnauthorized {
		t.Errorf("n1 claiming n2 in %s: %d, want 401", nodeHeader, got)
	}
	if _, err := ts.nodeRepo("n2", ts.restPassword("n1")).Snapshots(ctx, ""); err == nil {
		t.Error("restic with n1's REST password opened n2's repository")
	}

	if got := ts.status(http.MethodGet, "/n1/config", basic("n1", ts.restPassword("n2"))); got != http.StatusUnauthorized {
		t.Errorf("a wrong password: %d, want 401", got)
	}
	if got := ts.status(http.MethodGet, "/n3/config", basic("n3", ts.restPassword("n3"))); got != http.StatusUnauthorized {
		t.Errorf("a node with no line: %d, want 401", got)
	}
	bare := http.Header{}
	bare.Set(nodeHeader, "n1")
	for _, path := range []string{"/n1/config", "/n1/snapshots/"} {
		if got := ts.status(http.MethodGet, path, bare); got != http.StatusUnauthorized {
			t.Errorf("no auth, %s: n1 on %s: %d, want 401", nodeHeader, path, got)
		}
	}
}

// TestSeat_FullDisk: when the holder's disk fills midway through a
// backup, the backup fails and says so in one line, and what the
// repository kept before is whole: it checks, every byte read, and
// restores as it was. The disk is a small tmpfs, so root alone runs it.
// It takes most of a minute: restic 0.14 tries a pack the server refused
// (507) ten times, backing off, before it gives up, and nothing shortens
// that.
func TestSeat_FullDisk(t *testing.T) {
	t.Parallel() // its minute overlaps the others'
	restictest.Need(t)
	if testing.Short() {
		t.Skip("-short: restic takes most of a minute to give up on a full disk")
	}
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs as the holder's full disk needs root")
	}
	disk := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", disk).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs (%v): %s", err, strings.TrimSpace(string(out)))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", disk).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", disk, err, out)
		}
	})
	ts := newTestSeat(t, disk, "n1")
	ctx := t.Context()

	first := filepath.Join(t.TempDir(), "db")
	writeRandom(t, first, 4, 64<<10)
	kept := ts.backup("n1", first)

	big := filepath.Join(t.TempDir(), "db")
	writeRandom(t, big, 20, 1<<20)
	start := time.Now()
	_, err := ts.asNode("n1").Backup(ctx, big, "n1", protocol.BackupTag(testModule, testData))
	msg := oneLine(t, "a backup larger than the disk", err)
	if !strings.Contains(msg, "507") && !strings.Contains(msg, "Insufficient Storage") && !strings.Contains(msg, "no space left") {
		t.Errorf("the failed backup does not say the disk is full: %s", msg)
	}
	t.Logf("the backup failed after %s: %s", time.Since(start).Round(time.Millisecond), msg)

	repo := ts.repo("n1")
	if err := repo.Check(ctx, "100%"); err != nil {
		t.Fatalf("the repository after the full disk: %v", err)
	}
	target := t.TempDir()
	if err := repo.Restore(ctx, kept.SnapshotID, target); err != nil {
		t.Fatalf("the first snapshot does not restore: %v", err)
	}
	sameTree(t, first, filepath.Join(target, first))
}

// TestSeat_DrillTampered: a drill restores the latest snapshot and says
// what it restored; once every pack in the repository is damaged (a
// failing disk, a hand that edited it), the drill fails and says why in
// one line.
func TestSeat_DrillTampered(t *testing.T) {
	repos := t.TempDir()
	ts := newTestSeat(t, repos, "n1")
	data := filepath.Join(t.TempDir(), "db")
	writeRandom(t, data, 5, 32<<10)
	sum := ts.backup("n1", data)

	o := ts.Drill(t.Context(), "n1", testModule, testData)
	if !o.OK || o.Why != "" || !strings.HasPrefix(o.Snapshot, sum.SnapshotID) || o.Files != 5 || o.Bytes != 5*32<<10 {
		t.Fatalf("the drill of a good repository: %+v", o)
	}

	packs := 0
	err := filepath.WalkDir(filepath.Join(repos, "n1", "data"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		// Inside a blob's ciphertext (a pack's header is at its end):
		// the blob no longer authenticates.
		for i := len(b) / 4; i < len(b)/4+16; i++ {
			b[i] ^= 0xff
		}
		packs++
		return os.WriteFile(p, b, 0o600)
	})
	if err != nil || packs == 0 {
		t.Fatalf("no pack damaged (%d): %v", packs, err)
	}
	o = ts.Drill(t.Context(), "n1", testModule, testData)
	if o.OK || strings.TrimSpace(o.Why) == "" || strings.ContainsAny(o.Why, "\r\n") {
		t.Fatalf("the drill of a damaged repository: %+v", o)
	}
	t.Logf("damaged %d packs; the drill says: %s", packs, o.Why)
}

// TestPeriod: a line's cadence is the manifest's word or the duration
// the controller writes; anything else is no cadence.
func TestPeriod(t *testing.T) {
	for _, c := range []struct {
		cadence string
		want    time.Duration
	}{
		{"hourly", time.Hour},
		{"daily", 24 * time.Hour},
		{"weekly", 7 * 24 * time.Hour},
		{"1h0m0s", time.Hour},
		{"24h0m0s", 24 * time.Hour},
		{"30m", 30 * time.Minute},
		{"", 0},
		{"monthly", 0},
		{"Daily", 0},
		{"0s", 0},
		{"-1h", 0},
		{"1d", 0},
	} {
		if got := Period(c.cadence); got != c.want {
			t.Errorf("Period(%q) = %v, want %v", c.cadence, got, c.want)
		}
	}
}

// A line keeps its manifest's retention less the periods finer than its
// cadence (a daily line keeping 24 hourlies would keep 24 days), and every
// snapshot of its last two cadences.
func TestKeep(t *testing.T) {
	for _, c := range []struct {
		cadence string
		keep    protocol.Retention
		want    restic.Keep
	}{
		{"1h0m0s", protocol.Retention{}, restic.Keep{Hourly: 24, Daily: 7, Weekly: 5, Monthly: 12, Within: 2 * time.Hour}},
		{"24h0m0s", protocol.Retention{}, restic.Keep{Daily: 7, Weekly: 5, Monthly: 12, Within: 48 * time.Hour}},
		{"weekly", protocol.Retention{Daily: 3, Weekly: 8}, restic.Keep{Weekly: 8, Within: 14 * 24 * time.Hour}},
	} {
		if got := keep(protocol.BackupLine{Cadence: c.cadence, Keep: c.keep}); got != c.want {
			t.Errorf("a %s line keeping %+v: %+v, want %+v", c.cadence, c.keep, got, c.want)
		}
	}
}
