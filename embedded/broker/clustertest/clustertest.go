// Package clustertest runs a NATS cluster for tests: nats-server processes
// on loopback, built from the module go.mod names, each configured as
// 'mesh-controller broker show --config' prints, so that a server can be
// killed with SIGKILL as a machine is lost.
package clustertest

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"mesh-controller/embedded/broker"
)

// Cluster is a running cluster of nats-server processes.
type Cluster struct {
	t       testing.TB
	Servers []*Server
}

// Server is one nats-server process of a cluster.
type Server struct {
	Name string
	// URL is where its clients dial.
	URL string
	// monitor is its monitoring address (host:port).
	monitor string
	conf    string
	log     string
	cmd     *exec.Cmd
	exited  chan struct{}
}

// Config is one server's configuration, given what differs between them.
type Config func(broker.ClusterNode) (string, error)

// Start runs n servers, configured by config, and waits until each is
// healthy: routed to the others, and its JetStream current.
func Start(t testing.TB, n int, config Config) *Cluster {
	t.Helper()
	bin := Binary(t)
	c := &Cluster{t: t}
	var routes []string
	nodes := make([]broker.ClusterNode, n)
	// Every server's three ports are picked at once, each distinct: picked
	// one by one, a port closed for a later server's routes was given
	// again to an earlier one's monitor, and that server's routes met HTTP.
	addrs := freeAddrs(t, 3*n)
	for i := range nodes {
		route := addrs[3*i+1]
		routes = append(routes, "nats-route://"+route)
		nodes[i] = broker.ClusterNode{Name: fmt.Sprintf("nats%d", i+1), Listen: addrs[3*i], ClusterListen: route, Dir: t.TempDir()}
	}
	for i, node := range nodes {
		node.Routes = routes
		conf, err := config(node)
		if err != nil {
			t.Fatal(err)
		}
		s := &Server{Name: node.Name, URL: "nats://" + node.Listen, monitor: addrs[3*i+2],
			conf: filepath.Join(node.Dir, "nats.conf"), log: filepath.Join(node.Dir, "nats.log")}
		if err := os.WriteFile(s.conf, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		c.Servers = append(c.Servers, s)
		c.start(i, bin)
	}
	t.Cleanup(func() {
		for _, s := range c.Servers {
			s.stop()
		}
	})
	c.WaitHealthy()
	return c
}

// URLs is every server's client URL, separated by commas, as serve
// --broker takes them.
func (c *Cluster) URLs() string {
	var urls []string
	for _, s := range c.Servers {
		urls = append(urls, s.URL)
	}
	return strings.Join(urls, ",")
}

func (c *Cluster) start(i int, bin string) {
	c.t.Helper()
	s := c.Servers[i]
	_, port, _ := net.SplitHostPort(s.monitor)
	logf, err := os.OpenFile(s.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		c.t.Fatal(err)
	}
	defer logf.Close()
	// -m adds a monitoring port, which the configuration does not have:
	// its /healthz says when the server is ready, /connz who is on it.
	s.cmd = exec.Command(bin, "-c", s.conf, "-m", port)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	s.exited = make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) {
		cmd.Wait()
		close(exited)
	}(s.cmd, s.exited)
}

// Kill kills server i with SIGKILL, as a machine lost, and waits until it
// is gone.
func (c *Cluster) Kill(i int) {
	c.t.Helper()
	s := c.Servers[i]
	if err := s.cmd.Process.Kill(); err != nil {
		c.t.Fatal(err)
	}
	<-s.exited
}

// Restart starts server i again on its configuration and files, and waits
// until every server is healthy.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	c.start(i, Binary(c.t))
	c.WaitHealthy()
}

// Pid is the server process's, for a measure of its memory and CPU.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

func (s *Server) stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.exited:
	default:
		s.cmd.Process.Kill()
		<-s.exited
	}
}

// WaitHealthy waits until every running server says it is healthy (its
// JetStream current, which takes the routes to the others).
func (c *Cluster) WaitHealthy() {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range c.Servers {
		select {
		case <-s.exited:
			continue
		default:
		}
		for {
			err := s.healthy()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				log, _ := os.ReadFile(s.log)
				c.t.Fatalf("%s not healthy after 30s: %v\n%s", s.Name, err, log)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func (s *Server) healthy() error {
	var h struct {
		Status string `json:"status"`
		Error  string `json:"error"`
	}
	if err := s.get("/healthz", &h); err != nil {
		return err
	}
	if h.Status != "ok" {
		return fmt.Errorf("%s: %s", h.Status, h.Error)
	}
	return nil
}

// Clients are the names of the clients connected to server i now.
func (c *Cluster) Clients(i int) []string {
	c.t.Helper()
	var z struct {
		Conns []struct {
			Name string `json:"name"`
		} `json:"connections"`
	}
	if err := c.Servers[i].get("/connz?limit=100000", &z); err != nil {
		c.t.Fatal(err)
	}
	var names []string
	for _, cn := range z.Conns {
		names = append(names, cn.Name)
	}
	return names
}

// Hosts are the nodes whose hosts are connected to server i now, by their
// connections' names (mesh-host NODE).
func (c *Cluster) Hosts(i int) []string {
	c.t.Helper()
	var nodes []string
	for _, name := range c.Clients(i) {
		if node, ok := strings.CutPrefix(name, "mesh-host "); ok {
			nodes = append(nodes, node)
		}
	}
	return nodes
}

// Holding is the index of the server a client of that name is connected
// to, -1 if none.
func (c *Cluster) Holding(name string) int {
	c.t.Helper()
	for i, s := range c.Servers {
		select {
		case <-s.exited:
			continue
		default:
		}
		for _, n := range c.Clients(i) {
			if n == name {
				return i
			}
		}
	}
	return -1
}

func (s *Server) get(path string, v any) error {
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get("http://" + s.monitor + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// Binary is the nats-server program: MESH_NATS_SERVER if set (make test
// builds it), else built once per test binary from the module go.mod names.
func Binary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		if binPath = os.Getenv("MESH_NATS_SERVER"); binPath != "" {
			return
		}
		dir, err := os.MkdirTemp("", "nats-server-")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "nats-server")
		if out, err := exec.Command("go", "build", "-o", binPath, "github.com/nats-io/nats-server/v2").CombinedOutput(); err != nil {
			binErr = errors.New(string(out))
		}
	})
	if binErr != nil {
		t.Fatalf("build nats-server: %v", binErr)
	}
	return binPath
}

// freeAddrs are n distinct loopback addresses free now: all are held
// until the last is picked, so none is given twice.
func freeAddrs(t testing.TB, n int) []string {
	t.Helper()
	addrs := make([]string, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		addrs = append(addrs, ln.Addr().String())
	}
	return addrs
}
