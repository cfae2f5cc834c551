package host

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"mesh-controller/app/host/holdtest"
	"mesh-controller/app/protocol"
)

// holdInChild starts sleep holding ln's socket (inherited), and closes the
// test's own copies: the child is then the socket's only holder.
func holdInChild(t *testing.T, ln *net.TCPListener) *holdtest.Holder {
	t.Helper()
	h, err := holdtest.Hold(ln)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Stop)
	return h
}

func listenTCP(t *testing.T, addr string) (*net.TCPListener, int) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.(*net.TCPListener), ln.Addr().(*net.TCPAddr).Port
}

// Facts name every listening TCP and UDP socket with the process holding
// it: one held by a child (sleep, with the socket inherited), one by this
// test, v4 and v6; and say whether systemd runs, with the evidence.
func TestFacts_ListenersAndHolders(t *testing.T) {
	ln, tcpPort := listenTCP(t, "127.0.0.1:0")
	child := holdInChild(t, ln)
	udp, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	udpPort := udp.LocalAddr().(*net.UDPAddr).Port
	_, v6Port := listenTCP(t, "[::1]:0")

	f := Facts(t.TempDir())
	find := func(name, addr string) protocol.Found {
		for _, x := range f.Found {
			if x.Kind == "port" && x.Name == name && x.Address == addr {
				return x
			}
		}
		t.Fatalf("%s on %s not found in %+v", name, addr, f.Found)
		return protocol.Found{}
	}
	got := find("tcp/"+strconv.Itoa(tcpPort), "127.0.0.1")
	if got.Pid != child.Pid() || got.Command != "sleep" {
		t.Errorf("tcp/%d held by pid %d (%s), want the child %d (sleep): %+v", tcpPort, got.Pid, got.Command, child.Pid(), got)
	}
	self := commandOf(os.Getpid())
	if got := find("udp/"+strconv.Itoa(udpPort), "127.0.0.1"); got.Pid != os.Getpid() || got.Command != self {
		t.Errorf("udp/%d: %+v, want this test (pid %d, %s)", udpPort, got, os.Getpid(), self)
	}
	if got := find("tcp/"+strconv.Itoa(v6Port), "[::1]"); got.Pid != os.Getpid() {
		t.Errorf("tcp6 %d: %+v", v6Port, got)
	}
	var systemd *protocol.Fact
	for i := range f.Facts {
		if f.Facts[i].Name == "systemd" {
			systemd = &f.Facts[i]
		}
	}
	_, err = os.Stat("/run/systemd/system")
	if systemd == nil || systemd.Why == "" || systemd.Value != strconv.FormatBool(err == nil) {
		t.Errorf("systemd fact: %+v (does /run/systemd/system exist: %v)", systemd, err == nil)
	}
}

// A look names who holds a declared port, each data path (its size, a
// symlink named and not followed, one missing), and a process of the
// module's name.
func TestLook_PortsDataAndNamesake(t *testing.T) {
	ln, port := listenTCP(t, "127.0.0.1:0")
	child := holdInChild(t, ln)
	root := t.TempDir()
	data := filepath.Join(root, "var", "lib", "sleep")
	if err := os.MkdirAll(filepath.Join(data, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, n := range map[string]int{"a": 100, "sub/b": 23} {
		if err := os.WriteFile(filepath.Join(data, name), make([]byte, n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc", filepath.Join(root, "var", "lib", "linked")); err != nil {
		t.Fatal(err)
	}
	a := Look(root, protocol.LookAsk{Module: "sleep", Ports: []protocol.Port{{Name: "http", Port: port}},
		Data: []protocol.DeclaredData{{Name: "state", Path: "/var/lib/sleep"}, {Name: "linked", Path: "/var/lib/linked/x"}, {Name: "none", Path: "/var/lib/none"}}})
	if len(a.Ports) != 1 || a.Ports[0].Proto != "tcp" || a.Ports[0].Name != "http" || len(a.Ports[0].Holders) != 1 ||
		a.Ports[0].Holders[0].Pid != child.Pid() || a.Ports[0].Holders[0].Command != "sleep" {
		t.Errorf("ports: %+v, want tcp/%d held by %d (sleep)", a.Ports, port, child.Pid())
	}
	want := []protocol.LookData{
		{Name: "state", Path: "/var/lib/sleep", Exists: true, Dir: true, Bytes: 123, Entries: 4},
		{Name: "linked", Path: "/var/lib/linked/x", Exists: true, Symlink: "/var/lib/linked -> /etc"},
		{Name: "none", Path: "/var/lib/none"},
	}
	if len(a.Data) != len(want) {
		t.Fatalf("data: %+v", a.Data)
	}
	for i := range want {
		if a.Data[i] != want[i] {
			t.Errorf("data[%d] = %+v, want %+v", i, a.Data[i], want[i])
		}
	}
	found := false
	for _, p := range a.Processes {
		found = found || p.Pid == child.Pid()
	}
	if !found {
		t.Errorf("processes named sleep: %+v, want the child %d among them", a.Processes, child.Pid())
	}
}

// A cutover stops a process only while its pid runs the command approved:
// one that runs something else now is left alone; the one approved ends.
func TestCutover_StopsOnlyWhatWasApproved(t *testing.T) {
	ln, _ := listenTCP(t, "127.0.0.1:0")
	child := holdInChild(t, ln)
	done, err := cutover([]protocol.DeclaredTake{{Digest: "d1", Module: "x", Processes: []protocol.TakeProcess{{Pid: child.Pid(), Command: "not-sleep"}}}}, nil)
	if err != nil || len(done) != 1 {
		t.Fatalf("cutover: %v %v", done, err)
	}
	if !running(child.Pid(), "sleep") {
		t.Fatal("a pid running another command than approved was stopped")
	}
	if _, err := cutover([]protocol.DeclaredTake{{Digest: "d2", Module: "x", Processes: []protocol.TakeProcess{{Pid: child.Pid(), Command: "sleep"}}}}, nil); err != nil {
		t.Fatal(err)
	}
	<-child.Exited()
	if _, err := cutover([]protocol.DeclaredTake{{Digest: "d2", Module: "x", Units: []string{"never-run.service"}}}, []string{"d2"}); err != nil {
		t.Fatalf("a cutover done before was done again: %v", err)
	}
}

// The SSH port the filter keeps open is the lowest TCP port sshd holds;
// another program on 22, or sshd on UDP, says nothing.
func TestSSHPort(t *testing.T) {
	for _, c := range []struct {
		name  string
		found []protocol.Found
		want  string
	}{
		{"none", nil, ""},
		{"another program on 22", []protocol.Found{{Kind: "port", Name: "tcp/22", Command: "dropbear"}}, ""},
		{"sshd on udp", []protocol.Found{{Kind: "port", Name: "udp/2222", Command: "sshd"}}, ""},
		{"the lowest of two", []protocol.Found{{Kind: "port", Name: "tcp/2222", Command: "sshd", Pid: 7}, {Kind: "port", Name: "tcp/922", Command: "sshd", Pid: 7, Address: "0.0.0.0"}}, "922"},
	} {
		f, ok := sshPort(c.found)
		if ok != (c.want != "") || f.Value != c.want {
			t.Errorf("%s: %+v %v, want %q", c.name, f, ok, c.want)
		}
		if ok && (f.Name != protocol.FactSSHPort || !strings.Contains(f.Why, "sshd (pid 7) listens on tcp/922 at 0.0.0.0")) {
			t.Errorf("%s: %+v", c.name, f)
		}
	}
}

// Facts are compared leaving aside the free disk space, which moves all
// the time: a changed listener is a change, another free size is not.
func TestFactsCompared(t *testing.T) {
	body := func(free, port string) protocol.FactsBody {
		return protocol.FactsBody{Facts: []protocol.Fact{{Name: "disk_free_mb", Value: free}, {Name: "cores", Value: "2"}},
			Found: []protocol.Found{{Kind: "port", Name: port}}}
	}
	if !bytes.Equal(factsCompared(body("10", "tcp/80")), factsCompared(body("9", "tcp/80"))) {
		t.Fatal("another free size made a change")
	}
	if bytes.Equal(factsCompared(body("10", "tcp/80")), factsCompared(body("10", "tcp/81"))) {
		t.Fatal("another listener made no change")
	}
}
