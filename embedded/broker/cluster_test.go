package broker

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// freePorts are n distinct loopback ports nothing listens on now: all are
// held until the last is picked, so none is given twice.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	ports := make([]int, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// startCluster runs three servers in this process, each from the
// configuration ServerConfig prints, as nats-server would read it; it
// returns their client URLs.
func startCluster(t *testing.T, tr Trust) []string {
	t.Helper()
	const n = 3
	ports := freePorts(t, 2*n)
	clients, routes := ports[:n], ports[n:]
	var routeURLs []string
	for _, port := range routes {
		routeURLs = append(routeURLs, fmt.Sprintf("nats-route://127.0.0.1:%d", port))
	}
	var urls []string
	var servers []*server.Server
	for i := range n {
		dir := t.TempDir()
		conf := ServerConfig(tr, ClusterNode{Name: fmt.Sprintf("n%d", i), Listen: fmt.Sprintf("127.0.0.1:%d", clients[i]),
			ClusterListen: fmt.Sprintf("127.0.0.1:%d", routes[i]), Routes: routeURLs, Dir: dir})
		path := filepath.Join(dir, "nats.conf")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		opts, err := server.ProcessConfigFile(path)
		if err != nil {
			t.Fatalf("the printed configuration: %v\n%s", err, conf)
		}
		opts.NoLog, opts.NoSigs = true, true
		s, err := server.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		go s.Start()
		servers = append(servers, s)
		urls = append(urls, s.ClientURL())
	}
	t.Cleanup(func() {
		for _, s := range servers {
			s.Shutdown()
			s.WaitForShutdown()
		}
	})
	for _, s := range servers {
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatal("a cluster server is not ready")
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, s := range servers {
		for s.NumRoutes() < n-1 || !s.JetStreamIsCurrent() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d routes, jetstream current %v", s.Name(), s.NumRoutes(), s.JetStreamIsCurrent())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return urls
}

// A cluster configured as ServerConfig prints trusts the operator, admits
// the join user without credentials, and takes the mesh account's JWT
// pushed through the system account on every server: a revoked user is
// then refused by each.
func TestServerConfig_Cluster(t *testing.T) {
	k := newKeys(t)
	tr, err := k.ClusterTrust(testJoin, nil)
	if err != nil {
		t.Fatal(err)
	}
	urls := startCluster(t, tr)
	userJWT, seed, err := k.NewUser("host", Permissions{Publish: []string{"mesh.>"}, Subscribe: []string{"mesh.>"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range urls {
		nc, err := nats.Connect(u, nats.UserJWTAndSeed(userJWT, string(seed)), nats.NoReconnect())
		if err != nil {
			t.Fatalf("%s: a mesh user: %v", u, err)
		}
		nc.Close()
		anon, err := nats.Connect(u, nats.NoReconnect())
		if err != nil {
			t.Fatalf("%s: a connection without credentials: %v", u, err)
		}
		anon.Close()
	}
	sysJWT, sysSeed, err := k.NewSystemUser("controller system")
	if err != nil {
		t.Fatal(err)
	}
	sc, err := nats.Connect(urls[0], nats.UserJWTAndSeed(sysJWT, string(sysSeed)))
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	if n, err := JetStreamClusterSize(sc, 5*time.Second); err != nil || n != 3 {
		t.Fatalf("jetstream cluster size %d, %v; want 3", n, err)
	}

	kp, _ := nkeys.FromSeed(seed)
	pub, _ := kp.PublicKey()
	revoked, err := k.ClusterTrust(testJoin, map[string]time.Time{pub: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := PushAccount(sc, revoked, 5*time.Second); err != nil || n != 3 {
		t.Fatalf("pushed: taken by %d, %v; want 3", n, err)
	}
	for _, u := range urls {
		nc, err := nats.Connect(u, nats.UserJWTAndSeed(userJWT, string(seed)), nats.NoReconnect())
		if err == nil {
			nc.Close()
			t.Fatalf("%s: the revoked user connected", u)
		}
		if !errors.Is(err, nats.ErrAuthorization) && !errors.Is(err, nats.ErrAuthRevoked) {
			t.Logf("%s: refused: %v", u, err)
		}
	}
}

// A broker without a full resolver (the embedded kind) takes no pushed JWT:
// PushAccount says a person must give it one.
func TestPushAccount_NoResolver(t *testing.T) {
	k := newKeys(t)
	s := startServer(t, k)
	sysJWT, sysSeed, err := k.NewSystemUser("controller system")
	if err != nil {
		t.Fatal(err)
	}
	sc, err := nats.Connect(s.ClientURL(), nats.UserJWTAndSeed(sysJWT, string(sysSeed)))
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	tr, _ := k.ClusterTrust(testJoin, nil)
	if _, err := PushAccount(sc, tr, 2*time.Second); !errors.Is(err, ErrNoResolver) {
		t.Fatalf("pushed to a broker without a full resolver: %v", err)
	}
}
