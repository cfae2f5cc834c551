package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"mesh-controller/app"
	"mesh-controller/app/host"
	"mesh-controller/app/protocol"
)

// The mesh's packet filter, for real: a host in a network namespace of its
// own, joined to the test's (the controller's) by a veth pair, applies
// rulesets with nft, and connections from the controller's side prove what
// they let through.

// netns is a network namespace joined to this one by a veth pair: ours is
// Near, its Far.
type netns struct {
	name      string
	near, far string // addresses, without a prefix length
}

// toolPath finds a tool on PATH or where Debian puts it (a test's PATH
// may lack /usr/sbin).
func toolPath(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin"} {
		if p := filepath.Join(dir, name); fileExists(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s is not installed", name)
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// needNetns skips the test where namespaces cannot be made (not root, no
// ip or nft), and fails it where they must be (make test, CI): a filter
// test that passes without checking is no test.
func needNetns(t *testing.T) {
	t.Helper()
	needFor(t, "the filter test needs network namespaces", nil, "ip", "nft")
}

// needFor skips a test that needs root, files and tools where they are
// missing, and fails it where they must be there (make test, CI).
func needFor(t *testing.T, what string, files []string, tools ...string) {
	t.Helper()
	var why []string
	if os.Geteuid() != 0 {
		why = append(why, "not root")
	}
	for _, f := range files {
		if !fileExists(f) {
			why = append(why, "no "+f)
		}
	}
	for _, tool := range tools {
		if _, err := toolPath(tool); err != nil {
			why = append(why, err.Error())
		}
	}
	if len(why) == 0 {
		return
	}
	if os.Getenv("MESH_TEST_TOOLS") != "" || os.Getenv("CI") != "" {
		t.Fatalf("%s: %s", what, strings.Join(why, "; "))
	}
	t.Skipf("%s: %s", what, strings.Join(why, "; "))
}

// run runs a tool, failing the test with its output on error.
func run(t *testing.T, tool string, args ...string) string {
	t.Helper()
	out, err := runErr(tool, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func runErr(tool string, args ...string) (string, error) {
	bin, err := toolPath(tool)
	if err != nil {
		return "", err
	}
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %v: %s", tool, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// newNetns makes a network namespace and a veth pair into it, each named
// uniquely for this run, with addresses in a /30 of 10.231/16; removed
// when the test ends, whatever happens (deleting the namespace deletes
// its end of the pair, and with it ours).
func newNetns(t *testing.T) netns {
	t.Helper()
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	id := hex.EncodeToString(b[:])
	n := netns{name: "meshf-" + id, near: fmt.Sprintf("10.231.%d.%d", b[0], b[1]&0xfc|1), far: fmt.Sprintf("10.231.%d.%d", b[0], b[1]&0xfc|2)}
	near, far := "mf"+id+"n", "mf"+id+"f"
	addNetns(t, n.name)
	// Cleanups run last first: this before the namespace goes.
	t.Cleanup(func() { runErr("ip", "link", "del", near) }) // gone already when the pair went with the namespace
	run(t, "ip", "link", "add", near, "type", "veth", "peer", "name", far)
	run(t, "ip", "link", "set", far, "netns", n.name)
	run(t, "ip", "addr", "add", n.near+"/30", "dev", near)
	run(t, "ip", "link", "set", near, "up")
	run(t, "ip", "-n", n.name, "addr", "add", n.far+"/30", "dev", far)
	run(t, "ip", "-n", n.name, "link", "set", far, "up")
	return n
}

// addNetns makes a network namespace named name, its loopback up, removed
// when the test ends.
func addNetns(t *testing.T, name string) {
	t.Helper()
	run(t, "ip", "netns", "add", name)
	t.Cleanup(func() {
		if out, err := runErr("ip", "netns", "del", name); err != nil {
			t.Errorf("remove namespace %s: %v %s", name, err, out)
		}
	})
	run(t, "ip", "-n", name, "link", "set", "lo", "up")
}

// nft runs nft inside the namespace.
func (n netns) nft(args ...string) (string, error) {
	nft, err := toolPath("nft")
	if err != nil {
		return "", err
	}
	return runErr("ip", append([]string{"netns", "exec", n.name, nft}, args...)...)
}

// listen opens a TCP server on the namespace's end of its veth pair,
// each connection answered "hello" and closed.
func (n netns) listen(t *testing.T) int {
	t.Helper()
	return n.listenOn(t, n.far)
}

// listenOn opens a TCP server inside the namespace on addr ("": every
// address, the overlay's included), each connection answered "hello" and
// closed.
func (n netns) listenOn(t *testing.T, addr string) int {
	t.Helper()
	var ln net.Listener
	if err := n.do(func() (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort(addr, "0"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(c, "hello")
			c.Close()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// The main goroutine keeps the main thread. A goroutine of do (below)
// moves its thread into a namespace and, exiting locked, ends it — but the
// main thread cannot end: it would stay in the namespace, and /proc/net,
// which follows the main thread, would show every later test (and the
// hosts they run in this process: their facts, looks, ready checks) the
// namespace's sockets instead of this one's. Locked here, no other
// goroutine ever runs on it.
func init() { runtime.LockOSThread() }

// do runs f inside the namespace: on a thread moved into it (a socket
// stays in the namespace it was made in), a thread never given back to
// the runtime.
func (n netns) do(f func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		h, err := os.Open("/var/run/netns/" + n.name)
		if err != nil {
			done <- err
			return
		}
		defer h.Close()
		if err := unix.Setns(int(h.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- fmt.Errorf("setns %s: %w", n.name, err)
			return
		}
		done <- f()
	}()
	return <-done
}

// connects says whether a TCP connection from this namespace to port in n
// is answered by its server; a connection the filter drops is a timeout.
func (n netns) connects(t *testing.T, port int) bool {
	t.Helper()
	c, err := net.DialTimeout("tcp", fmt.Sprintf("%s:%d", n.far, port), 700*time.Millisecond)
	if err != nil {
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("port %d: not dropped but %v", port, err)
		}
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "hello\n" {
		t.Fatalf("port %d connected but its server did not answer: %q %v", port, line, err)
	}
	return true
}

// meshRuleset is a ruleset as the renderer writes one: the mesh's table,
// input dropped but for established and related, loopback and the open
// ports. Without established (a broken ruleset) even the answers to the
// host's own connections are dropped: the host can no longer hear the
// controller.
func meshRuleset(established bool, open ...int) string {
	var b strings.Builder
	b.WriteString("table inet mesh {\n\tchain input {\n\t\ttype filter hook input priority 0; policy drop;\n")
	if established {
		b.WriteString("\t\tct state established,related accept\n")
	}
	b.WriteString("\t\tiif \"lo\" accept\n")
	for _, p := range open {
		fmt.Fprintf(&b, "\t\ttcp dport %d accept\n", p)
	}
	b.WriteString("\t}\n}\n")
	return b.String()
}

func filterBody(ruleset string) string {
	f, _ := json.Marshal(protocol.DeclaredFilter{Kind: protocol.FilterNftables, Ruleset: ruleset})
	return `{"mode": "converged", "modules": [], "filter": ` + string(f) + `}`
}

// hostIn joins node and runs a real mesh-host process for it inside the
// namespace, its filter confirmed within confirm; stopped when the test ends.
func (m *testMesh) hostIn(t *testing.T, n netns, node string, confirm time.Duration) *syncBuffer {
	t.Helper()
	return m.runIn(t, n, node, false, "--filter-confirm", confirm.String()).logs
}

// joinState issues a token for a new node and joins a host with it, its
// state dir in a temporary dir (returned) for a real mesh-host to run.
func (m *testMesh) joinState(t *testing.T, node string) (string, *host.State) {
	t.Helper()
	tok, err := m.c.TokenIssue(context.Background(), app.TokenRequest{Node: node, New: true, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	st, err := host.Join(context.Background(), host.JoinOptions{Broker: m.url, Token: tok.Token, Node: node, State: filepath.Join(dir, "state")})
	if err != nil {
		t.Fatalf("join %s: %v", node, err)
	}
	return dir, st
}

// hostProc is a real mesh-host process running in a namespace.
type hostProc struct {
	t     *testing.T
	node  string
	state string // its state dir
	ns    string
	argv  []string // ip's arguments that run it
	logs  *syncBuffer
	pid   int
	// done has the process's end, once it is waited for.
	done chan error
}

// runIn joins node and runs a real mesh-host process for it inside the
// namespace, with args besides the usual; stopped when the test ends.
// ownRun gives it a /run/wireguard of its own (a tmpfs in the mount
// namespace ip netns exec makes for it): wg(8) finds an interface by its
// socket there, and several hosts on one machine each have a mesh0.
func (m *testMesh) runIn(t *testing.T, n netns, node string, ownRun bool, args ...string) *hostProc {
	t.Helper()
	dir, st := m.joinState(t, node)
	bin := buildProgram(t, "mesh-host", "../../cmd/mesh-host")
	argv := append([]string{"netns", "exec", n.name}, append([]string{bin, "run", "--state", st.Dir, "--root", filepath.Join(dir, "root"),
		"--heartbeat", "200ms", "--no-module-users"}, args...)...)
	if ownRun {
		// sh execs the host: the signal reaches it, as below. Its
		// interface is its namespace's, whatever make test's
		// MESH_HOST_OVERLAY_INTERFACE says for hosts in the machine's.
		argv = append([]string{"netns", "exec", n.name, "sh", "-c",
			`mkdir -p /run/wireguard && mount -t tmpfs -o mode=0755 mesh-test /run/wireguard && exec "$0" "$@"`}, append(argv[3:], "--overlay-interface")...)
	}
	p := &hostProc{t: t, node: node, state: st.Dir, ns: n.name, argv: argv, logs: &syncBuffer{}}
	p.start()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("the host's log:\n%s", p.logs.String())
		}
	})
	return p
}

// start runs the host (again: its log goes on in the same buffer).
func (p *hostProc) start() {
	p.t.Helper()
	ip, err := toolPath("ip")
	if err != nil {
		p.t.Fatal(err)
	}
	cmd := exec.Command(ip, p.argv...)
	cmd.Stdout, cmd.Stderr = p.logs, p.logs
	if err := cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	p.pid, p.done = cmd.Process.Pid, make(chan error, 1)
	go func() { p.done <- cmd.Wait() }()
}

// stop ends the host with SIGTERM, as a person's machine stops it; one
// stopped already is left as it is. ip netns exec becomes the host (it
// execs it): the signal reaches it.
func (p *hostProc) stop() {
	if p.done == nil {
		return
	}
	syscall.Kill(p.pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		syscall.Kill(p.pid, syscall.SIGKILL)
		<-p.done
		p.t.Errorf("the host in %s did not stop on SIGTERM within 15s", p.ns)
	}
	p.done = nil
}

// kill ends the host with SIGKILL: nothing of its own stopping runs.
func (p *hostProc) kill() {
	syscall.Kill(p.pid, syscall.SIGKILL)
	<-p.done
	p.done = nil
}

// filterIs is a check that node reports the mesh's filter as value; it
// says what it reports instead.
func (m *testMesh) filterIs(node, value string) func() error {
	return func() error {
		if f := m.filterFact(node); f.Value != value {
			return fmt.Errorf("%s reports its filter %q, not %q: %s", node, f.Value, value, f.Why)
		}
		return nil
	}
}

// filterFact is the node's report of the mesh's filter, "" if none.
func (m *testMesh) filterFact(node string) protocol.Fact {
	for _, f := range m.node(node).Facts {
		if f.Name == protocol.FilterFact {
			return protocol.Fact{Name: f.Name, Value: f.Value, Why: f.Why}
		}
	}
	return protocol.Fact{}
}

func TestFilter_Namespace(t *testing.T) {
	t.Parallel()
	needNetns(t)
	n := newNetns(t)
	m := newTestMeshOn(t, nil, n.near+":0")
	const confirm = 3 * time.Second
	logs := m.hostIn(t, n, "web1", confirm)
	checkFor(t, settle, m.reported("web1"))

	open, undeclared := n.listen(t), n.listen(t)
	if !n.connects(t, open) || !n.connects(t, undeclared) {
		t.Fatal("without a filter both servers must answer through the veth")
	}
	// A table of the machine's own, which the mesh must never touch.
	if _, err := n.nft("add", "table", "inet", "theirs"); err != nil {
		t.Fatalf("this kernel cannot run nftables in a namespace: %v", err)
	}
	if _, err := n.nft("add", "chain", "inet", "theirs", "input", "{ type filter hook input priority 10; policy accept; }"); err != nil {
		t.Fatal(err)
	}

	// A filter with one port open to anyone: it connects, the undeclared
	// one does not, and the host keeps it once it hears the controller.
	good := meshRuleset(true, open)
	d := m.declare("web1", filterBody(good))
	checkFor(t, settle, m.filterIs("web1", protocol.FilterKept))
	if !strings.Contains(m.filterFact("web1").Why, fmt.Sprintf("declaration %d's filter applied and kept", d.Serial)) {
		t.Fatalf("kept, but says: %+v", m.filterFact("web1"))
	}
	if !n.connects(t, open) {
		t.Fatal("the declared port does not connect through the filter")
	}
	if n.connects(t, undeclared) {
		t.Fatal("the undeclared port connects through the filter")
	}
	kept, err := n.nft("list", "table", "inet", "mesh")
	if err != nil {
		t.Fatal(err)
	}

	// A ruleset nft -c refuses is refused whole, in one line, and the
	// filter kept stays.
	refused := m.declare("web1", filterBody(strings.Replace(good, "accept\n", "accept\n\t\ttcp dport 70000 accept\n", 1)))
	checkFor(t, settle, m.answered("web1", refused.Serial))
	if a := m.node("web1").LastApply; a.OK || !strings.HasPrefix(a.Error, "refused: the packet filter: nft -c -f -:") || strings.Contains(a.Error, "\n") {
		t.Fatalf("the bad ruleset: %+v", a)
	}
	if out, _ := n.nft("list", "table", "inet", "mesh"); out != kept {
		t.Fatalf("a refused ruleset changed the table:\n%s", out)
	}

	// A ruleset that locks the host out (no established): the host cannot
	// hear the controller, and within the confirm window puts back the
	// ruleset before it by itself, then says so; the controller raises
	// node.filter-rolled-back.
	applied := time.Now()
	bad := m.declare("web1", filterBody(meshRuleset(false, open)))
	checkFor(t, settle, func() error {
		if out, _ := n.nft("list", "table", "inet", "mesh"); strings.Contains(out, "established") {
			return fmt.Errorf("the locking-out filter is not applied; the mesh's table:\n%s", out)
		}
		return nil
	})
	var back time.Duration
	checkFor(t, settle, func() error {
		out, _ := n.nft("list", "table", "inet", "mesh")
		back = time.Since(applied)
		if out != kept {
			return fmt.Errorf("the filter is not rolled back; the mesh's table:\n%s", out)
		}
		return nil
	})
	if back < confirm-500*time.Millisecond || back > confirm+5*time.Second {
		t.Fatalf("rolled back after %s, the confirm window being %s", back, confirm)
	}
	checkFor(t, settle, m.filterIs("web1", protocol.FilterRolledBack))
	if f := m.filterFact("web1"); !strings.Contains(f.Why, fmt.Sprintf("declaration %d's filter rolled back", bad.Serial)) || !strings.Contains(f.Why, "not heard within 3s") || !strings.Contains(f.Why, "restored") {
		t.Fatalf("the rollback says: %+v", f)
	}
	if !m.openAfterCheck(t, "node.filter-rolled-back/web1") {
		t.Fatal("no node.filter-rolled-back")
	}
	if !n.connects(t, open) || n.connects(t, undeclared) {
		t.Fatal("the ruleset before is not what judges connections after the rollback")
	}
	t.Logf("rolled back %s after applying (confirm window %s)", back.Round(100*time.Millisecond), confirm)

	// adopt: the node's declaration carries no filter, and the mesh's
	// table goes, and only it.
	p, err := m.c.Adopt(context.Background(), "web1")
	if err != nil || !p.Sent {
		t.Fatalf("adopt: %+v %v", p, err)
	}
	checkFor(t, settle, m.filterIs("web1", protocol.FilterRemoved))
	if out, err := n.nft("list", "table", "inet", "mesh"); err == nil {
		t.Fatalf("the mesh's table is still there:\n%s", out)
	}
	if _, err := n.nft("list", "table", "inet", "theirs"); err != nil {
		t.Fatalf("the machine's own table went with the mesh's: %v", err)
	}
	if !n.connects(t, undeclared) {
		t.Fatal("without the mesh's table the undeclared port must connect again")
	}
	if m.openAfterCheck(t, "node.filter-rolled-back/web1") {
		t.Fatal("node.filter-rolled-back still open with no filter owned")
	}
	if !strings.Contains(logs.String(), "removed the mesh's packet filter") {
		t.Fatalf("the host's log does not say it removed the filter:\n%s", logs.String())
	}
}

// converge, end to end: a host in a namespace with two servers, one a
// module declares public on a node with a public domain. The preview
// names the other as not kept and renders the filter; nothing changes
// until --yes with its digest, then the host applies the rendered ruleset:
// the declared port connects from the other namespace, the undeclared one
// does not, and node.unmanaged-listener names it; adopt opens it again.
func TestConverge_Namespace(t *testing.T) {
	t.Parallel()
	needNetns(t)
	n := newNetns(t)
	// Listening before the host starts: its first facts name both.
	open, undeclared := n.listen(t), n.listen(t)
	m := newTestMeshOn(t, nil, n.near+":0")
	m.hostIn(t, n, "web1", 10*time.Second)
	checkFor(t, settle, m.reported("web1"))
	ctx := context.Background()
	m.addModule(writeManifest(t, fmt.Sprintf(`{"module": "site", "version": "1.0.0", "ports": [{"name": "http", "port": %d, "expose": "public"}]}`, open)))
	m.assign(t, "web1", "site")
	if _, err := m.c.SetPublicDomain(ctx, "web1", "example.org"); err != nil {
		t.Fatal(err)
	}

	p, done, err := m.c.Converge(ctx, app.ConvergeRequest{Node: "web1", Filter: "nftables"})
	if err != nil || done != nil {
		t.Fatalf("preview: %v", err)
	}
	notKept := fmt.Sprintf("tcp/%d", undeclared)
	if len(p.Unmanaged) != 1 || p.Unmanaged[0].Name != notKept || !strings.Contains(p.Ruleset, fmt.Sprintf("tcp dport %d accept", open)) {
		t.Fatalf("the preview: %+v\n%s", p.Unmanaged, p.Ruleset)
	}
	if !n.connects(t, open) || !n.connects(t, undeclared) {
		t.Fatal("a preview changed what connects")
	}

	if _, done, err = m.c.Converge(ctx, app.ConvergeRequest{Node: "web1", Filter: "nftables", Yes: p.Digest}); err != nil || !done.Pushed.Sent {
		t.Fatalf("converge --yes: %v %+v", err, done)
	}
	checkFor(t, settle, m.filterIs("web1", protocol.FilterKept))
	if out, err := n.nft("list", "table", "inet", "mesh"); err != nil || !strings.Contains(out, fmt.Sprintf("tcp dport %d accept", open)) {
		t.Fatalf("the mesh's table: %v\n%s", err, out)
	}
	if !n.connects(t, open) {
		t.Fatal("the declared public port does not connect through the filter")
	}
	if n.connects(t, undeclared) {
		t.Fatal("the undeclared port connects through the filter")
	}
	key := "node.unmanaged-listener/web1"
	if c, names, open := m.unmanagedNamed(t, "web1"); !open || !slices.Equal(names, []string{notKept}) || c.Evidence["count"] != float64(1) {
		t.Fatalf("%s names %v: %+v", key, names, c)
	}

	if _, err := m.c.Adopt(ctx, "web1"); err != nil {
		t.Fatal(err)
	}
	checkFor(t, settle, m.filterIs("web1", protocol.FilterRemoved))
	if !n.connects(t, undeclared) {
		t.Fatal("adopted, the undeclared port must connect again")
	}
	if m.openAfterCheck(t, key) {
		t.Fatal("an adopted node's listener still raised")
	}
}
