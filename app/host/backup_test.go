package host

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
	restserver "github.com/restic/rest-server"
	"golang.org/x/crypto/bcrypt"
	"golang.org/x/sys/unix"

	"mesh-controller/app/protocol"
	"mesh-controller/app/restic"
	"mesh-controller/app/restic/restictest"
)

// The tests of backups run a real host (Runner) on the real embedded
// broker, with the real restic, against a real REST server (rest-server
// as a library, append-only, private repositories, an htpasswd file), as
// the backup seat's holder serves it. The controller's part is played by
// a connection of the controller's user: it declares, asks and hears the
// outcomes, each signed by the host.

// bkMesh is a broker, a REST server holding node n1's repository, and a
// host of n1.
type bkMesh struct {
	*liveMesh
	repoDir  string // the REST server's directory: n1's repository is repoDir/n1
	restURL  string // http://127.0.0.1:PORT
	access   protocol.BackupAccess
	sealed   string                // access, sealed to n1
	access2  protocol.BackupAccess // n2's, in the same REST server
	outcomes chan protocol.BackupOutcome

	sup   *Supervisor
	users bool // the host runs modules as their own users
	hold  atomic.Pointer[netHold]
}

// netHold holds packs' uploads: midway is told of each, release lets
// them go.
type netHold struct {
	midway  chan struct{}
	release chan struct{}
}

func newBkMesh(t *testing.T) *bkMesh {
	t.Helper()
	restictest.Need(t)
	m := &bkMesh{liveMesh: newLiveMesh(t, false), outcomes: make(chan protocol.BackupOutcome, 16)}
	m.answer(protocol.NodeSubject("n1", protocol.BackedUp), func(msg *nats.Msg) any {
		var out protocol.BackupOutcome
		if err := m.opened(msg, &out); err != nil {
			t.Errorf("an outcome not signed by the host: %v", err)
			return protocol.OKReply{Error: err.Error()}
		}
		m.outcomes <- out
		return protocol.OKReply{OK: true}
	})

	// The holder's REST server and n1's repository in it, made locally
	// as the holder makes it.
	m.repoDir = t.TempDir()
	m.access = protocol.BackupAccess{User: "n1", Password: "rest-" + rand.Text(), RepositoryPassword: "repo-" + rand.Text()}
	m.access2 = protocol.BackupAccess{User: "n2", Password: "rest-" + rand.Text(), RepositoryPassword: "repo2-" + rand.Text()}
	hash, _ := bcrypt.GenerateFromPassword([]byte(m.access.Password), bcrypt.MinCost)
	hash2, _ := bcrypt.GenerateFromPassword([]byte(m.access2.Password), bcrypt.MinCost)
	htpasswd := filepath.Join(t.TempDir(), "htpasswd")
	if err := os.WriteFile(htpasswd, []byte("n1:"+string(hash)+"\nn2:"+string(hash2)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	h, err := restserver.NewHandler(&restserver.Server{Path: m.repoDir, HtpasswdPath: htpasswd, AppendOnly: true, PrivateRepos: true})
	if err != nil {
		t.Fatal(err)
	}
	// A hold on the network, when set: a pack's upload waits until the
	// test lets it go, or restic gives up on it.
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if hold := m.hold.Load(); hold != nil && req.Method == http.MethodPost && strings.Contains(req.URL.Path, "/data/") {
			select {
			case hold.midway <- struct{}{}:
			default:
			}
			select {
			case <-hold.release:
			case <-req.Context().Done():
				return
			}
		}
		h.ServeHTTP(w, req)
	}))
	t.Cleanup(hs.Close)
	m.restURL = hs.URL
	if err := (restic.Repo{Repository: filepath.Join(m.repoDir, "n1"), Password: m.access.RepositoryPassword}).Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	m.sealed = m.seal(m.access)
	return m
}

// seal seals an access to n1, as the holder issues n1's own and grants it
// another node's.
func (m *bkMesh) seal(a protocol.BackupAccess) string {
	m.t.Helper()
	b, _ := json.Marshal(a)
	sealed, err := protocol.SealSecret(protocol.NewSecret(b), protocol.Label{Node: "n1", Module: protocol.BackupModule, Name: protocol.BackupAccessName}, m.st.Age.Recipient())
	if err != nil {
		m.t.Fatal(err)
	}
	return sealed
}

// start runs the host until the test ends or stop is called.
func (m *bkMesh) start() {
	m.sup = &Supervisor{BackoffBase: 20 * time.Millisecond, BackoffCap: 100 * time.Millisecond}
	m.run(&Runner{Heartbeat: time.Second, Supervisor: m.sup, BeforeTimeout: 2 * time.Second, ModuleUsers: m.users})
}

// ask asks the host on its inbox (backup or restore) and returns its
// answer, checked to be signed by it.
func (m *bkMesh) ask(what string, ask any) protocol.BackupTaken {
	m.t.Helper()
	b, _ := json.Marshal(ask)
	// Answered where the controller asks to be (the host may publish
	// nowhere else).
	reply := protocol.AnswerSubject("n1", nuid.Next())
	sub, err := m.ctl.SubscribeSync(reply)
	if err != nil {
		m.t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := m.ctl.PublishRequest(protocol.NodeSubject("n1", "inbox."+what), reply, b); err != nil {
		m.t.Fatal(err)
	}
	msg, err := sub.NextMsg(protocol.AnswerTimeout)
	if err != nil {
		m.t.Fatalf("ask a %s: %v", what, err)
	}
	var taken protocol.BackupTaken
	if err := protocol.Open(msg.Data, m.st.HostKey.Public().(ed25519.PublicKey), &taken); err != nil {
		m.t.Fatalf("the answer to a %s: %v", what, err)
	}
	return taken
}

// outcome waits for the outcome of ask id.
func (m *bkMesh) outcome(id string) protocol.BackupOutcome {
	m.t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case out := <-m.outcomes:
			if out.ID == id {
				return out
			}
			m.t.Errorf("an outcome of %s while waiting for %s: %+v", out.ID, id, out)
		case <-deadline:
			m.t.Fatalf("no outcome of %s; the host's log:\n%s", id, m.log.String())
		}
	}
}

// backedUp asks a backup and waits for its outcome, which must be OK.
func (m *bkMesh) backedUp(id, module, data string) protocol.BackupOutcome {
	m.t.Helper()
	if tk := m.ask(protocol.BackupAskName, protocol.BackupAsk{ID: id, Module: module, Data: data}); !tk.Taken {
		m.t.Fatalf("backup %s not taken: %s", id, tk.Why)
	}
	out := m.outcome(id)
	if !out.OK || out.Kind != protocol.KindBackup || out.Snapshot == "" {
		m.t.Fatalf("backup %s: %+v", id, out)
	}
	return out
}

// repo is n1's repository, opened locally as the holder does.
func (m *bkMesh) repo() restic.Repo {
	return restic.Repo{Repository: filepath.Join(m.repoDir, "n1"), Password: m.access.RepositoryPassword}
}

// dbModule is a module db holding the data set main at path, running a
// sleep, and its backup line, with before as its hook.
func (m *bkMesh) dbModule(path string, before []string) map[string]any {
	return m.moduleDecl("db", path, before)
}

// moduleDecl is dbModule with another module's name.
func (m *bkMesh) moduleDecl(module, path string, before []string) map[string]any {
	return map[string]any{
		"modules": []any{map[string]any{"module": module, "version": "1.0.0",
			"data": []any{map[string]any{"name": "main", "path": path, "precious": "irreplaceable"}},
			"run":  map[string]any{"command": []any{"sh", "-c", "sleep 1000"}, "ready": map[string]any{"after": "100ms"}}}},
		"backups": []any{map[string]any{"module": module, "data": "main", "path": path, "cadence": "daily", "before": before,
			"repository": "rest:" + m.restURL + "/n1/", "access": m.sealed}},
	}
}

// write writes files (name → content) beneath dir, under the host's root.
func (m *bkMesh) write(dir string, files map[string]string) {
	m.t.Helper()
	for name, body := range files {
		p := filepath.Join(m.root, dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			m.t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			m.t.Fatal(err)
		}
	}
}

// tree reads every regular file beneath dir under the host's root.
func (m *bkMesh) tree(dir string) map[string]string {
	m.t.Helper()
	out := map[string]string{}
	base := filepath.Join(m.root, dir)
	filepath.WalkDir(base, func(p string, e os.DirEntry, err error) error {
		if err == nil && e.Type().IsRegular() {
			b, _ := os.ReadFile(p)
			rel, _ := filepath.Rel(base, p)
			out[rel] = string(b)
		}
		return nil
	})
	return out
}

// noSecrets fails if the host's log holds the access's passwords.
func (m *bkMesh) noSecrets() {
	m.t.Helper()
	log := m.log.String()
	if strings.Contains(log, m.access.Password) || strings.Contains(log, m.access.RepositoryPassword) {
		m.t.Fatalf("a credential is in the host's log:\n%s", log)
	}
}

func sameTree(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s: %v, want %v", what, got, want)
	}
}

// A backup asked is taken at once and done by the host: its before hook
// (as its module, with its environment) writes into the data set, restic
// backs the data set up through the REST server as n1, tagged with the
// data set, and the outcome, signed, says the snapshot, files and bytes;
// the second backup adds only what changed. Asks not to be taken are
// refused at once, each saying why; a before hook that fails fails the
// backup with its last line, and makes no snapshot. No credential is ever
// in the host's log.
func TestBackup_AskedAndReported(t *testing.T) {
	m := newBkMesh(t)
	m.start()
	m.write("var/lib/db", map[string]string{"a": strings.Repeat("a", 100_000), "sub/b": "b"})
	m.declare(m.dbModule("/var/lib/db", []string{"sh", "-c", "echo dumped $MESH_MODULE > $MESH_DATA_MAIN/dump.sql"}))

	first := m.backedUp("b1", "db", "main")
	if first.Module != "db" || first.Data != "main" || first.Files != 3 || first.Bytes != int64(100_000+1+len("dumped db\n")) || first.BytesAdded == 0 || first.At.IsZero() {
		t.Fatalf("first backup: %+v", first)
	}
	m.write("var/lib/db", map[string]string{"c": "new"})
	second := m.backedUp("b2", "db", "main")
	if second.Files != 4 || second.BytesAdded >= first.BytesAdded {
		t.Fatalf("second backup added %d bytes (first %d): %+v", second.BytesAdded, first.BytesAdded, second)
	}
	ss, err := m.repo().Snapshots(context.Background(), protocol.BackupTag("db", "main"))
	if err != nil || len(ss) != 2 || ss[0].ShortID != second.Snapshot || ss[0].Hostname != "n1" || ss[0].Paths[0] != filepath.Join(m.root, "var/lib/db") {
		t.Fatalf("the repository's snapshots: %+v, %v", ss, err)
	}
	if b, err := os.ReadFile(filepath.Join(m.root, "var/lib/db/dump.sql")); err != nil || string(b) != "dumped db\n" {
		t.Fatalf("the before hook's dump: %q, %v", b, err)
	}
	if logs, _ := os.ReadFile(filepath.Join(m.root, "var/log/mesh/db.log")); !strings.Contains(string(logs), "before hook done") {
		t.Fatalf("the module's log says nothing of its hook:\n%s", logs)
	}

	for why, ask := range map[string]protocol.BackupAsk{
		"n1 declares no backup of db/other": {ID: "x1", Module: "db", Data: "other"},
		"the ask has no id":                 {Module: "db", Data: "main"},
		"no valid module and data set":      {ID: "x2", Module: "../db", Data: "main"},
	} {
		if tk := m.ask(protocol.BackupAskName, ask); tk.Taken || !strings.Contains(tk.Why, why) {
			t.Errorf("ask %+v: %+v, want not taken: %s", ask, tk, why)
		}
	}
	noAccess := m.dbModule("/var/lib/db", nil)
	noAccess["backups"].([]any)[0].(map[string]any)["access"] = ""
	m.declare(noAccess)
	if tk := m.ask(protocol.BackupAskName, protocol.BackupAsk{ID: "x3", Module: "db", Data: "main"}); tk.Taken || !strings.Contains(tk.Why, "no access to its backup repository yet") {
		t.Fatalf("without access: %+v", tk)
	}

	// A hook that fails, slowly: a second ask meanwhile is busy.
	m.declare(m.dbModule("/var/lib/db", []string{"sh", "-c", "echo dumping; sleep 0.5; echo 'pg_dump: connection refused' >&2; exit 3"}))
	if tk := m.ask(protocol.BackupAskName, protocol.BackupAsk{ID: "b3", Module: "db", Data: "main"}); !tk.Taken {
		t.Fatalf("b3: %+v", tk)
	}
	if tk := m.ask(protocol.BackupAskName, protocol.BackupAsk{ID: "b4", Module: "db", Data: "main"}); tk.Taken || !strings.Contains(tk.Why, "a backup of db/main runs already on n1") {
		t.Fatalf("a second backup at once: %+v", tk)
	}
	failed := m.outcome("b3")
	if failed.OK || !strings.Contains(failed.Why, "the before hook sh failed: exit status 3: pg_dump: connection refused") || failed.Snapshot != "" {
		t.Fatalf("a failed hook: %+v", failed)
	}
	if ss, _ := m.repo().Snapshots(context.Background(), ""); len(ss) != 2 {
		t.Fatalf("a failed hook made a snapshot: %d", len(ss))
	}
	// A hook past its timeout is stopped, its group with it.
	m.declare(m.dbModule("/var/lib/db", []string{"sh", "-c", "sleep 777 & sleep 778"}))
	if tk := m.ask(protocol.BackupAskName, protocol.BackupAsk{ID: "b5", Module: "db", Data: "main"}); !tk.Taken {
		t.Fatalf("b5: %+v", tk)
	}
	if out := m.outcome("b5"); out.OK || !strings.Contains(out.Why, "stopped after 2s") {
		t.Fatalf("a hook past its timeout: %+v", out)
	}
	checkFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if out, _ := exec.Command("pgrep", "-f", "sleep 77[78]").Output(); len(out) > 0 {
			return fmt.Errorf("the hook's processes still run: %s", out)
		}
		return nil
	})
	m.noSecrets()
}

// restored asks a restore and waits for its outcome.
func (m *bkMesh) restored(ask protocol.RestoreAsk) protocol.BackupOutcome {
	m.t.Helper()
	if tk := m.ask(protocol.RestoreAskName, ask); !tk.Taken {
		m.t.Fatalf("restore %s not taken: %s", ask.ID, tk.Why)
	}
	return m.outcome(ask.ID)
}

// scratchLeft fails if a restore's scratch directory is left beside dir.
func (m *bkMesh) scratchLeft(dir string) {
	m.t.Helper()
	if left, _ := filepath.Glob(filepath.Join(m.root, filepath.Dir(dir), "."+filepath.Base(dir)+".restore-*")); len(left) > 0 {
		m.t.Fatalf("scratch left: %v", left)
	}
}

// A restore onto a node that runs the module: the snapshot is restored
// and verified beside the data set, the module stopped, the damaged
// contents moved aside (never overwritten: a second restore moves its own
// aside under another name), the snapshot's contents put in place byte
// for byte, the module started again, and the outcome says the snapshot,
// files, bytes and where the contents went. Two restores at once: the
// second is refused, as a backup of the set is meanwhile. A restore that
// fails (no such snapshot) leaves the data and the module as they were.
func TestRestore_MovedAside(t *testing.T) {
	m := newBkMesh(t)
	m.start()
	good := map[string]string{"a": "one", "sub/b": "two"}
	m.write("var/lib/db", good)
	// A set-user-id file is restored without its bit.
	if err := os.Chmod(filepath.Join(m.root, "var/lib/db/a"), 0o4755); err != nil {
		t.Fatal(err)
	}
	m.declare(m.dbModule("/var/lib/db", nil))
	before := waitState(t, m.sup, "db", protocol.StateReady)
	snap := m.backedUp("b1", "db", "main")
	ss, _ := m.repo().Snapshots(context.Background(), protocol.BackupTag("db", "main"))

	damaged := map[string]string{"a": "damaged", "sub/b": "two", "junk": "x"}
	m.write("var/lib/db", damaged)
	if tk := m.ask(protocol.RestoreAskName, protocol.RestoreAsk{ID: "r1", Module: "db", Data: "main", Snapshot: snap.Snapshot, From: "n1"}); !tk.Taken {
		t.Fatalf("r1: %+v", tk)
	}
	if tk := m.ask(protocol.RestoreAskName, protocol.RestoreAsk{ID: "r2", Module: "db", Data: "main", Snapshot: "latest", From: "n1"}); tk.Taken || !strings.Contains(tk.Why, "a restore of db/main runs already on n1") {
		t.Fatalf("a second restore at once: %+v", tk)
	}
	if tk := m.ask(protocol.BackupAskName, protocol.BackupAsk{ID: "b2", Module: "db", Data: "main"}); tk.Taken || !strings.Contains(tk.Why, "a restore of db/main runs already") {
		t.Fatalf("a backup during a restore: %+v", tk)
	}
	out := m.outcome("r1")
	if !out.OK || out.Kind != protocol.KindRestore || out.Snapshot != ss[0].ID || out.Files != 2 || out.Bytes != 6 ||
		!strings.HasPrefix(out.Aside, "/var/lib/db.before-restore-"+time.Now().UTC().Format("20060102T")) {
		t.Fatalf("r1: %+v", out)
	}
	sameTree(t, "restored", m.tree("var/lib/db"), good)
	sameTree(t, "moved aside", m.tree(out.Aside), damaged)
	if fi, err := os.Stat(filepath.Join(m.root, "var/lib/db/a")); err != nil || fi.Mode() != 0o755 {
		t.Fatalf("restored as %v: %v", fi.Mode(), err)
	}
	m.scratchLeft("var/lib/db")
	after := waitState(t, m.sup, "db", protocol.StateReady)
	if after.Pid == before.Pid {
		t.Fatalf("the module was not stopped and started again: pid %d", after.Pid)
	}

	// Again, at once: the first aside is kept as it is.
	again := m.restored(protocol.RestoreAsk{ID: "r3", Module: "db", Data: "main", Snapshot: "latest", From: "n1"})
	if !again.OK || again.Aside == "" || again.Aside == out.Aside {
		t.Fatalf("r3: %+v (r1 moved aside to %s)", again, out.Aside)
	}
	sameTree(t, "the first aside", m.tree(out.Aside), damaged)
	sameTree(t, "the second aside", m.tree(again.Aside), good)

	// No such snapshot: nothing moves, the module runs on.
	running := waitState(t, m.sup, "db", protocol.StateReady)
	failed := m.restored(protocol.RestoreAsk{ID: "r4", Module: "db", Data: "main", Snapshot: "deadbeef", From: "n1"})
	if failed.OK || !strings.Contains(failed.Why, "no snapshot deadbeef of db/main") {
		t.Fatalf("r4: %+v", failed)
	}
	if st, _ := stateOf(m.sup, "db"); st.Pid != running.Pid {
		t.Fatalf("a failed restore stopped the module: %+v", st)
	}
	sameTree(t, "after a failed restore", m.tree("var/lib/db"), good)
	m.scratchLeft("var/lib/db")

	// A snapshot holding a device file (a holder could make one: it has
	// the repository's password) is refused, and nothing moves.
	if err := unix.Mknod(filepath.Join(m.root, "var/lib/db/disk"), unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	m.backedUp("b3", "db", "main")
	refused := m.restored(protocol.RestoreAsk{ID: "r5", Module: "db", Data: "main", Snapshot: "latest", From: "n1"})
	if refused.OK || !strings.Contains(refused.Why, "/disk is a device file: refused") {
		t.Fatalf("r5: %+v", refused)
	}
	sameTree(t, "after a refused restore", m.tree("var/lib/db"), good)
	m.scratchLeft("var/lib/db")

	for why, ask := range map[string]protocol.RestoreAsk{
		"n1 has no data set db/other":                  {ID: "x1", Module: "db", Data: "other", From: "n1"},
		"n1 has no access to the repository of n2 yet": {ID: "x2", Module: "db", Data: "main", From: "n2"},
		"the ask names no valid module and data set":   {ID: "x3", Module: "db", Data: ""},
	} {
		if tk := m.ask(protocol.RestoreAskName, ask); tk.Taken || !strings.Contains(tk.Why, why) {
			t.Errorf("ask %+v: %+v, want not taken: %s", ask, tk, why)
		}
	}
	m.noSecrets()
}

// A snapshot taken where the data set was (/var/lib/old) is restored where
// it is now (/var/lib/new): the snapshot's own path is found in it; what
// is at the new place, an empty directory, needs no aside; the old place
// is left alone. Then another node's snapshot (data restore --to: n2's
// repository, its access granted to n1), taken beneath n2's root, is
// restored onto n1.
func TestRestore_PathChanged(t *testing.T) {
	m := newBkMesh(t)
	m.start()
	files := map[string]string{"x": "kept", "d/y": "too"}
	m.write("var/lib/old", files)
	m.declare(m.dbModule("/var/lib/old", nil))
	m.backedUp("b1", "db", "main")
	m.write("var/lib/old", map[string]string{"x": "changed since"})

	m.declare(m.dbModule("/var/lib/new", nil))
	out := m.restored(protocol.RestoreAsk{ID: "r1", Module: "db", Data: "main", Snapshot: "latest", From: "n1", SnapshotPath: "/var/lib/old"})
	if !out.OK || out.Aside != "" || out.Files != 2 {
		t.Fatalf("r1: %+v", out)
	}
	sameTree(t, "restored at the new path", m.tree("var/lib/new"), files)
	sameTree(t, "the old path", m.tree("var/lib/old"), map[string]string{"x": "changed since", "d/y": "too"})
	m.scratchLeft("var/lib/new")

	// n2's host backs up its own db/main, beneath its own root.
	ctx := context.Background()
	n2 := restic.Repo{Repository: filepath.Join(m.repoDir, "n2"), Password: m.access2.RepositoryPassword}
	if err := n2.Init(ctx); err != nil {
		t.Fatal(err)
	}
	n2data := filepath.Join(t.TempDir(), "n2root", "var/lib/db")
	os.MkdirAll(n2data, 0o755)
	os.WriteFile(filepath.Join(n2data, "from-n2"), []byte("n2's"), 0o644)
	if _, err := n2.Backup(ctx, n2data, "n2", protocol.BackupTag("db", "main")); err != nil {
		t.Fatal(err)
	}
	to := protocol.RestoreAsk{ID: "r2", Module: "db", Data: "main", Snapshot: "latest", From: "n2",
		Repository: "rest:" + m.restURL + "/n2/", Access: m.seal(m.access2), SnapshotPath: "/var/lib/db"}
	out = m.restored(to)
	if !out.OK || !strings.HasPrefix(out.Aside, "/var/lib/new.before-restore-") {
		t.Fatalf("r2: %+v", out)
	}
	sameTree(t, "n2's restored on n1", m.tree("var/lib/new"), map[string]string{"from-n2": "n2's"})
	sameTree(t, "n1's moved aside", m.tree(out.Aside), files)
	// n1's own access opens no other node's repository.
	to.ID, to.Access = "r3", m.sealed
	if out := m.restored(to); out.OK || !strings.Contains(out.Why, "Unauthorized") {
		t.Fatalf("n2's repository with n1's access: %+v", out)
	}
}

// A before hook runs as its module's own user where modules run as their
// own users: what it writes into the data set is that user's.
func TestBackup_BeforeAsItsUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make users")
	}
	if _, err := exec.LookPath("useradd"); err != nil {
		t.Skip("no useradd")
	}
	m := newBkMesh(t)
	m.users = true
	module := fmt.Sprintf("bu%d", time.Now().UnixNano()%1_000_000)
	t.Cleanup(func() {
		m.stop() // before userdel, which refuses a user with processes
		if out, err := exec.Command("userdel", "mesh-"+module).CombinedOutput(); err != nil {
			t.Errorf("userdel mesh-%s: %v: %s", module, err, out)
		}
	})
	for dir := m.root; dir != "/"; dir = filepath.Dir(dir) {
		if strings.HasPrefix(dir, os.TempDir()+"/") {
			os.MkdirAll(dir, 0o755)
			os.Chmod(dir, 0o755) // t.TempDir's are 0700: its user must pass through
		}
	}
	m.start()
	m.declare(m.moduleDecl(module, "/var/lib/"+module, []string{"sh", "-c", "id -u > $MESH_DATA_MAIN/dump.uid"}))
	// A file of root's in the snapshot is the module's once restored.
	m.write("var/lib/"+module, map[string]string{"roots": "r"})
	m.backedUp("b1", module, "main")
	if out := m.restored(protocol.RestoreAsk{ID: "r1", Module: module, Data: "main", Snapshot: "latest", From: "n1"}); !out.OK {
		t.Fatalf("r1: %+v", out)
	}
	u, err := user.Lookup("mesh-" + module)
	if err != nil {
		t.Fatal(err)
	}
	dump := filepath.Join(m.root, "var/lib", module, "dump.uid")
	b, err := os.ReadFile(dump)
	fi, serr := os.Stat(dump)
	if err != nil || serr != nil || strings.TrimSpace(string(b)) != u.Uid || strconv.Itoa(int(fi.Sys().(*syscall.Stat_t).Uid)) != u.Uid {
		t.Fatalf("the hook ran as %q (its file %v), want uid %s: %v", b, fi, u.Uid, err)
	}
	for _, name := range []string{"", "roots"} {
		fi, err := os.Lstat(filepath.Join(m.root, "var/lib", module, name))
		if err != nil || strconv.Itoa(int(fi.Sys().(*syscall.Stat_t).Uid)) != u.Uid || strconv.Itoa(int(fi.Sys().(*syscall.Stat_t).Gid)) != u.Gid {
			t.Fatalf("restored %q is not the module's: %v %v", name, fi, err)
		}
	}
}

// A host killed in the middle of a backup (here stopped while restic was
// uploading: restic dies with it) leaves no restic running and no
// snapshot, and its restic's lock. Started again, the host backs up to the
// end; the stale lock is gone with it (restic unlock), so the holder's
// check, which locks exclusively, goes. A lock left by an exclusive restic
// killed midway does not keep a backup from going either.
func TestBackup_KilledMidway(t *testing.T) {
	m := newBkMesh(t)
	m.start()
	big := make([]byte, 8<<20)
	rand.Read(big)
	m.write("var/lib/db", map[string]string{"big": string(big), "small": "s"})
	m.declare(m.dbModule("/var/lib/db", nil))
	u := "rest:" + strings.Replace(m.restURL, "http://", "http://n1:"+m.access.Password+"@", 1) + "/n1/"
	restictest.StaleLock(t, u, m.access.RepositoryPassword)

	hold := &netHold{midway: make(chan struct{}, 1), release: make(chan struct{})}
	m.hold.Store(hold)
	if tk := m.ask(protocol.BackupAskName, protocol.BackupAsk{ID: "b1", Module: "db", Data: "main"}); !tk.Taken {
		t.Fatalf("b1: %+v", tk)
	}
	select {
	case <-hold.midway:
	case <-time.After(30 * time.Second):
		t.Fatalf("restic uploaded nothing; the host's log:\n%s", m.log.String())
	}
	m.stop()
	m.hold.Store(nil)
	close(hold.release)
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if out, _ := exec.Command("pgrep", "-x", "restic").Output(); len(out) > 0 {
			return fmt.Errorf("restic outlives its host: %s", out)
		}
		return nil
	})
	ctx := context.Background()
	if ss, err := m.repo().Snapshots(ctx, ""); err != nil || len(ss) != 0 {
		t.Fatalf("a killed backup made snapshots %+v, %v", ss, err)
	}
	now := m.repo()
	now.LockWait = -1 // said at once, not waited for (and unlocked)
	if err := now.Check(ctx, ""); err == nil || !strings.Contains(err.Error(), "locked") {
		t.Fatalf("the killed backup left no lock: %v", err)
	}

	m.start()
	// b1's outcome, if its host said it before it stopped, is a failure.
	select {
	case out := <-m.outcomes:
		if out.ID != "b1" || out.OK {
			t.Fatalf("the killed backup's outcome: %+v", out)
		}
	default:
	}
	if out := m.backedUp("b2", "db", "main"); out.Files != 2 {
		t.Fatalf("b2: %+v", out)
	}
	if err := m.repo().Check(ctx, "100%"); err != nil {
		t.Fatal(err)
	}
	m.noSecrets()
}
