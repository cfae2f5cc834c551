package main

import (
	"bytes"
	"context"
	"fmt"
	mathrand "math/rand/v2"
	"mesh-controller/embedded/sqlite/sqlitetest"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/oauth2-proxy/mockoidc"
)

// walkthrough is the README's walkthrough: every ```sh block between its
// markers, in order.
func walkthrough(t *testing.T, readme string) string {
	t.Helper()
	return readmeScript(t, readme, "<!-- walkthrough", "<!-- end of the walkthrough -->", 10)
}

// readmeScript is every ```sh block of the README between two markers, in
// order; fewer than least blocks fails the test (a marker moved).
func readmeScript(t *testing.T, readme, from, to string, least int) string {
	t.Helper()
	b, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	start := bytes.Index(b, []byte(from))
	end := bytes.Index(b, []byte(to))
	if start < 0 || end < start {
		t.Fatalf("the README has no %q … %q markers", from, to)
	}
	blocks := regexp.MustCompile("(?ms)^```sh\n(.*?)^```\n").FindAllSubmatch(b[start:end], -1)
	if len(blocks) < least {
		t.Fatalf("the README has %d sh blocks between %q and %q", len(blocks), from, to)
	}
	var script strings.Builder
	for _, blk := range blocks {
		script.Write(blk[1])
	}
	return script.String()
}

// The README's walkthrough runs as a person runs it (issue 12, item 4): one
// bash, from the repository's root after make build, every command in order;
// the first that fails fails this test, with the output so far.
func TestREADME_Walkthrough(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries and runs the whole walkthrough")
	}
	// Beside the scenarios: it mostly waits, on hosts and timers (137 s of
	// make test's longest package, alone).
	t.Parallel()
	readmeTools(t, "bash", "jq", "curl", "restic")
	repo, bin := buildForReadme(t, "mesh-controller", "mesh-host", "mesh-builder", "mesh-backup") // make build, as the README asks first
	script := withBin(t, walkthrough(t, filepath.Join(repo, "README.md")), bin)
	ports := freePorts(t, 3, 1)
	// MESH_HOST_MODULE_USERS=false: as root, a host makes a system user
	// per module; the test leaves the machine's users as it found them.
	// 8 minutes: it took 4.3 to 4.7 on this 2-core machine at a load of 10;
	// each wait of the README's gives up sooner, saying what it waited for.
	out, err := runScript(t, repo, script, 8*time.Minute, "XDG_DATA_HOME=", "MESH_DATA=", "MESH_BROKER=", "MESH_HOST_MODULE_USERS=false",
		fmt.Sprintf("HELLO_PORT=%d", ports[0]), fmt.Sprintf("GREETER_PORT=%d", ports[1]), fmt.Sprintf("BACKUP_PORT=%d", ports[2]))
	if err != nil {
		t.Fatalf("the README's walkthrough stopped: %v\n%s", err, out)
	}
	if os.Getenv("MESH_README_SHOW") != "" {
		t.Logf("what the walkthrough printed:\n%s", out)
	}
	// What a reader is told to expect, there.
	for _, want := range []string{"manifests, no problems", "the-ocr-licence", "the-translation-key", "waits for licence translation", "licence chat refreshed by nas1/refresher: version 2", "node.silent/web1", "What is wrong", "node rack20 removed",
		"restored db1/postgres/cluster onto db1 from snapshot", "retired as cluster-before-restore-", "restored and verified on the holder", "/var/lib/postgres/data/PG_VERSION",
		"prepare of 2.0.0 ran", "data restored from the pre-upgrade snapshot", "opening balance 100", "ledger kept pid", "web9 back on mesh-host v0.3.0-walk",
		"signing key rotated", "refused: the overlap runs"} {
		if !strings.Contains(out, want) {
			t.Errorf("the walkthrough's output lacks %q", want)
		}
	}
	if _, err := os.Stat(filepath.Join(repo, "data")); err == nil {
		t.Error("the walkthrough wrote a data dir into the repository")
	}
}

// TestREADME_Outgrowing runs the README's "Outgrowing one machine" block as a
// person runs it: a mesh moved onto PostgreSQL with store copy, three NATS
// servers configured by broker show --config, two controllers (one stands
// by), a host; a server and the serving controller killed, and the standby
// serving what the host applies. It needs the test PostgreSQL (make test
// starts one) and nats-server (make test builds it); without them it is
// skipped, and fails under CI.
func TestREADME_Outgrowing(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries and runs a mesh on PostgreSQL and a NATS cluster")
	}
	t.Parallel()
	required := os.Getenv("MESH_TEST_TOOLS") != "" || os.Getenv("CI") != ""
	need := func(what, how string) {
		if required {
			t.Fatalf("no %s: %s", what, how)
		}
		t.Skipf("no %s here; %s", what, how)
	}
	admin := os.Getenv(sqlitetest.PostgresVar)
	if admin == "" {
		need("PostgreSQL", "make test starts one")
	}
	if _, err := exec.LookPath("psql"); err != nil {
		need("psql", "make test installs postgresql")
	}
	natsServer := os.Getenv("MESH_NATS_SERVER")
	if natsServer == "" {
		need("nats-server", "make test builds it (make nats-server)")
	}
	repo, bin := buildForReadme(t, "mesh-controller", "mesh-host")
	// The roles and databases the block makes are the server's: dropped after.
	t.Cleanup(func() {
		for _, c := range []string{"inventory", "identity", "secrets", "licences", "builds", "health"} {
			exec.Command("psql", admin, "-q", "-c", "DROP DATABASE IF EXISTS mesh_"+c+" WITH (FORCE)", "-c", "DROP ROLE IF EXISTS mesh_"+c).Run()
		}
	})
	script := withBin(t, readmeScript(t, filepath.Join(repo, "README.md"), "<!-- outgrowing", "<!-- end of outgrowing -->", 1), bin)
	// nats-server on PATH as make nats-server leaves it in bin/.
	path := filepath.Dir(natsServer) + string(os.PathListSeparator) + os.Getenv("PATH")
	// NATS_BASE: the servers' client ports are the three above it, their
	// route ports the three above it + 2000.
	base := freePorts(t, 1, 2004, 1, 2, 3, 2001, 2002, 2003)[0]
	out, err := runScript(t, repo, script, 3*time.Minute, "PATH="+path, "PGADMIN="+admin, "MESH_DATA=", "MESH_BROKER=", "MESH_HOST_MODULE_USERS=false",
		fmt.Sprintf("NATS_BASE=%d", base))
	if err != nil {
		t.Fatalf("the README's outgrowing block stopped: %v\n%s", err, out)
	}
	for _, want := range []string{"(the same at both ends)", "stands by", "web1  converged  yes"} {
		if !strings.Contains(out, want) {
			t.Errorf("the block's output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "pw-inventory") {
		t.Error("a store's password was printed")
	}
}

// The README's overlay block runs as a person runs it: nodes placed, one
// endpoint refused, the overlay and a node's plan shown.
func TestREADME_Overlay(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs the README's overlay block")
	}
	readmeTools(t, "bash")
	repo, bin := buildForReadme(t, "mesh-controller")
	script := withBin(t, readmeScript(t, filepath.Join(repo, "README.md"), "<!-- overlay", "<!-- end of overlay -->", 1), bin)
	out, err := runScript(t, repo, script, time.Minute, "XDG_DATA_HOME=", "MESH_DATA=", "MESH_BROKER=")
	if err != nil {
		t.Fatalf("the README's overlay block stopped: %v\n%s", err, out)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^gw1: public, endpoint gw1\.example\.org:51820$`),
		regexp.MustCompile(`(?m)^nas1: overlay addresses 100\.64\.0\.2/10, fd[0-9a-f]{2}:[0-9a-f]{1,4}:[0-9a-f]{1,4}::2/48$`),
		regexp.MustCompile(`(?m)^refused: an endpoint is host:port$`),
		regexp.MustCompile(`(?m)^relay none \(no public node with a key\)$`),
		regexp.MustCompile(`(?m)^  missing: no WireGuard key: its host has not reported one$`),
		regexp.MustCompile(`(?m)^laptop1  100\.64\.0\.3/10  fd[0-9a-f:]+::3/48$`),
		regexp.MustCompile(`(?m)^  overlay: none yet \(its host has reported no WireGuard key\)$`),
	} {
		if !want.MatchString(out) {
			t.Errorf("the block's output lacks %s:\n%s", want, out)
		}
	}
}

// TestREADME_Adopted runs the README's "Adopted machines" blocks as a
// person runs them: an adopted node, a stand-in service holding the port a
// module declares, a take refused because the machine changed since its
// preview, then confirmed; the stand-in must end by the SIGTERM its host
// sent, and the module start on the data that was there.
func TestREADME_Adopted(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries and takes a module onto an adopted host")
	}
	readmeTools(t, "bash", "perl")
	repo, bin := buildForReadme(t, "mesh-controller", "mesh-host")
	script := withBin(t, readmeScript(t, filepath.Join(repo, "README.md"), "<!-- adopted", "<!-- end of adopted -->", 5), bin)
	port := fmt.Sprint(freePorts(t, 1, 1)[0])
	out, err := runScript(t, repo, script, 3*time.Minute, "XDG_DATA_HOME=", "MESH_DATA=", "MESH_BROKER=", "MESH_HOST_MODULE_USERS=false", "GUESTBOOK_PORT="+port)
	if err != nil {
		t.Fatalf("the README's adopted block stopped: %v\n%s", err, out)
	}
	// onPort: where the README's output shows its port, 18481, the test's.
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(onPort(`(?m)^  http 18481: tcp on 127\.0\.0\.1 held by pid \d+ \(perl\)$`, port)),
		regexp.MustCompile(`(?m)^digest: [0-9a-f]{16}$`),
		regexp.MustCompile(onPort(`nothing taken: what runs there changed since that preview: tcp/18481 on 127\.0\.0\.1 was held by pid \d+ \(perl\), now held by pid \d+ \(perl\)`, port)),
		regexp.MustCompile(`(?m)^took guestbook 1\.0\.0 onto old1, as previewed \([0-9a-f]{16}\)$`),
		// the stand-in ended by the host's SIGTERM: 128 + 15
		regexp.MustCompile(`(?m)^the stand-in ended: status 143$`),
		// started on the data that was there, never wiped: 41 starts, then its own
		regexp.MustCompile(`(?m)^42$`),
		regexp.MustCompile(onPort(`(?m)^  why: taken by a person on \S+ \(preview [0-9a-f]{16}\) from: tcp/18481 on 127\.0\.0\.1 held by pid \d+ \(perl\)$`, port)),
		regexp.MustCompile(onPort(`(?m)^  public: http \(port 18481\) routed as http\.guestbook\.example\.org$`, port)),
		regexp.MustCompile(`(?m)^  networks: 10\.20\.0\.0/16, 192\.168\.10\.0/24$`),
		regexp.MustCompile(`(?m)^to be: converged, the mesh's nftables filter, SSH kept open$`),
		regexp.MustCompile(onPort(`(?m)^  \t\ttcp dport 18481 accept comment "guestbook/http"$`, port)),
		regexp.MustCompile(`(?m)^converged old1, as previewed \([0-9a-f]{16}\)$`),
		regexp.MustCompile(`(?m)^old1\s+converged\b`),
		regexp.MustCompile(`node web2 is converged: take is for adopted nodes`),
		regexp.MustCompile(`(?m)^web2: adopted: `),
	} {
		if !want.MatchString(out) {
			t.Errorf("the block's output lacks %s:\n%s", want, out)
		}
	}
}

// The README's "The HTTP API", "Metrics" and "The log, and alerts to a
// person" run as a person runs them, against a real issuer (mockoidc) whose
// tokens stand for the person's: one for mesh-admin, one for mesh-read.
func TestREADME_Elsewhere(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs the README's block")
	}
	readmeTools(t, "bash", "jq", "curl")
	repo, bin := buildForReadme(t, "mesh-controller")
	issuer, err := mockoidc.Run()
	if err != nil {
		t.Fatal(err)
	}
	defer issuer.Shutdown()
	admin, err := issuerToken(issuer, "ci-deploy", "mesh-admin")
	if err != nil {
		t.Fatal(err)
	}
	read, err := issuerToken(issuer, "board", "mesh-read")
	if err != nil {
		t.Fatal(err)
	}
	script := withBin(t, readmeScript(t, filepath.Join(repo, "README.md"), "<!-- elsewhere", "<!-- end of elsewhere -->", 3), bin)
	out, err := runScript(t, repo, script, 2*time.Minute, "ISSUER="+issuer.Issuer(), "TOKEN="+admin, "READ_TOKEN="+read, "MESH_DATA=", "MESH_BROKER=")
	if err != nil {
		t.Fatalf("the README's block stopped: %v\n%s", err, out)
	}
	for _, want := range []string{
		"/v1/assign\n", "/v1/openapi.json\n", // the routes
		"\nweb1\n",                               // a read
		`{"node":"web1","modules":["postgres"]}`, // an assign
		`{"error":"board may not do this: the token's claim groups holds no mesh-admin"}`,
		`api:ci-deploy (ops@example.org)`, // the hand-act
		`mesh_nodes{state="not_joined"} 1`, `mesh_serving 1`, `mesh_store_size_bytes{store="inventory"} `,
		"\nready\n", // /readyz, the api's and serve's
		`msg=request method=POST path=/v1/assign status=200 duration_ms=`, // the request log, which the token check below reads too
		`{"msg":"serving","version":"development build","broker":"nats://127.0.0.1:`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the block's output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, admin) || strings.Contains(out, read) {
		t.Error("a token was printed")
	}
}

// readmeTools skips without the tools a README block runs, or fails under
// make test and CI, which install them.
func readmeTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("MESH_TEST_TOOLS") != "" || os.Getenv("CI") != "" {
				t.Fatalf("no %s: 'make test' installs it", tool)
			}
			t.Skipf("no %s here; 'make test' installs it", tool)
		}
	}
}

// readmeBin is where the README tests' binaries are built, each once a
// run: never into the repository's bin/, which keeps what make build
// stamped there. TestMain removes it after the run.
var readmeBin struct {
	sync.Mutex
	dir   string
	built map[string]bool
}

// removingReadmeBin runs the tests, then removes readmeBin's dir.
type removingReadmeBin struct{ m *testing.M }

// Run runs the tests and removes what they built.
func (r removingReadmeBin) Run() int {
	code := r.m.Run()
	if readmeBin.dir != "" {
		os.RemoveAll(readmeBin.dir)
	}
	return code
}

// buildForReadme builds each command (as make build does, unstamped) into
// a dir of the run's own, and returns the repository's root and that dir.
func buildForReadme(t *testing.T, cmds ...string) (repo, bin string) {
	t.Helper()
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	readmeBin.Lock()
	defer readmeBin.Unlock()
	if readmeBin.dir == "" {
		if readmeBin.dir, err = os.MkdirTemp("", "mesh-readme-bin-"); err != nil {
			t.Fatal(err)
		}
		readmeBin.built = map[string]bool{}
	}
	for _, c := range cmds {
		if readmeBin.built[c] {
			continue
		}
		build := exec.Command("go", "build", "-o", filepath.Join(readmeBin.dir, c), "./cmd/"+c)
		build.Dir = repo
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", c, err, out)
		}
		readmeBin.built[c] = true
	}
	return repo, readmeBin.dir
}

// readmeBinPath is how the README names the binaries make build made.
var readmeBinPath = regexp.MustCompile(`\$(repo|PWD)/bin\b`)

// withBin points a README script at bin wherever it names the
// repository's bin/ ("$repo/bin", or "$PWD/bin" from the repository's
// root); a script that names neither finds its binaries elsewhere, which
// fails the test.
func withBin(t *testing.T, script, bin string) string {
	t.Helper()
	if !readmeBinPath.MatchString(script) {
		t.Fatal("the README's block names no $repo/bin or $PWD/bin: the test cannot give it the binaries it built")
	}
	return readmeBinPath.ReplaceAllLiteralString(script, bin)
}

// onPort is a pattern of the README's output with its port, 18481, as
// the test chose it.
func onPort(pattern, port string) string { return strings.ReplaceAll(pattern, "18481", port) }

// freePorts returns n ports of loopback, each with every port at the
// given offsets from it free too (none given: the port alone), apart
// from each other by span. They are drawn below the kernel's ephemeral
// range, where an outgoing connection never takes one meanwhile.
func freePorts(t *testing.T, n, span int, offsets ...int) []int {
	t.Helper()
	if len(offsets) == 0 {
		offsets = []int{0}
	}
	free := func(p int) bool {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			return false
		}
		ln.Close()
		return true
	}
	var ports []int
	for try := 0; len(ports) < n; try++ {
		if try == 1000 {
			t.Fatalf("no %d free ports found between 20000 and 30000", n)
		}
		p := 20000 + mathrand.IntN(10000-span*n)
		ok := true
		for _, q := range ports {
			ok = ok && (p+span <= q || q+span <= p)
		}
		for _, o := range offsets {
			ok = ok && free(p+o)
		}
		if ok {
			ports = append(ports, p)
		}
	}
	return ports
}

// runScript runs a README script in one bash (-euo pipefail) from the
// repository's root, in a temporary dir and home of its own, with env added,
// and returns what it printed. Its own process group: whatever it started in
// the background is stopped with it, whatever happens (stopScript).
func runScript(t *testing.T, repo, script string, timeout time.Duration, env ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = repo
	tmp := t.TempDir()
	cmd.Env = append(append(os.Environ(), "TMPDIR="+tmp, "HOME="+filepath.Join(tmp, "home")), env...)
	// Go's caches stay the person's: a home of its own would have the
	// README's go builds fetch every module and compile every package again.
	cmd.Env = append(cmd.Env, goCaches(t)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// SIGTERM first, as a person's Ctrl-C would: hosts stop their modules.
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = 20 * time.Second
	// A file, not a pipe: what the script left running in the background
	// may hold its output open, and must not keep Run from returning.
	out, err := os.Create(filepath.Join(tmp, "script.out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	err = cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("stopped after %s, its deadline: %w", timeout, err)
	}
	if cmd.Process != nil {
		stopScript(cmd.Process.Pid, tmp)
	}
	b, rerr := os.ReadFile(out.Name())
	if rerr != nil {
		t.Fatal(rerr)
	}
	return string(b), err
}

// goCaches names the go command's build and module caches, as this
// process's go sees them.
func goCaches(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOCACHE", "GOMODCACHE").Output()
	if err != nil {
		t.Fatalf("go env: %v", err)
	}
	f := strings.Fields(string(out))
	if len(f) != 2 {
		t.Fatalf("go env GOCACHE GOMODCACHE: %q", out)
	}
	return []string{"GOCACHE=" + f[0], "GOMODCACHE=" + f[1]}
}

// stopScript ends what a script left running: SIGTERM to its process group,
// so hosts stop their modules (each in a process group of its own, which a
// SIGKILL of its host would leave running, holding its port for the next
// run); then, within 20 s, SIGKILL to the group and to every process still
// working or running beneath the script's dir.
func stopScript(pgid int, dir string) {
	syscall.Kill(-pgid, syscall.SIGTERM)
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if syscall.Kill(-pgid, 0) != nil && len(runningBeneath(dir)) == 0 {
			return
		}
	}
	syscall.Kill(-pgid, syscall.SIGKILL)
	for _, pid := range runningBeneath(dir) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

// runningBeneath is every process whose working dir or program is beneath
// dir.
func runningBeneath(dir string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		for _, link := range []string{"cwd", "exe"} {
			if to, err := os.Readlink(filepath.Join("/proc", e.Name(), link)); err == nil && strings.HasPrefix(to, dir+string(filepath.Separator)) {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// The README's quick start runs as it is: a controller, one host, a module
// of the reader's own answering curl. Its port, 18400, is one the test
// chose free.
func TestREADME_QuickStart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries and runs a controller and a host")
	}
	t.Parallel()
	if _, err := exec.LookPath("python3"); err != nil {
		if os.Getenv("MESH_TEST_TOOLS") != "" || os.Getenv("CI") != "" {
			t.Fatal("no python3: make test installs it (the quick start's module is python3's http.server)")
		}
		t.Skip("no python3: the quick start's module is python3's http.server")
	}
	repo, bin := buildForReadme(t, "mesh-controller", "mesh-host")
	script := withBin(t, readmeScript(t, filepath.Join(repo, "README.md"), "<!-- quick start", "<!-- end of the quick start -->", 1), bin)
	if lines := strings.Count(script, "\n"); lines > 20 {
		t.Errorf("the quick start is %d lines; it promises 20 at most", lines)
	}
	port := strconv.Itoa(freePorts(t, 1, 1)[0])
	out, err := runScript(t, repo, strings.ReplaceAll(script, "18400", port), 2*time.Minute, "MESH_DATA=", "MESH_BROKER=")
	if err != nil {
		t.Fatalf("the README's quick start stopped: %v\n%s", err, out)
	}
	if os.Getenv("MESH_README_SHOW") != "" {
		t.Logf("what the quick start printed:\n%s", out)
	}
	if !strings.Contains(out, "hello from box") {
		t.Errorf("curl did not get the module's page:\n%s", out)
	}
}
