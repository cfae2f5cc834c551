package app

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"runtime"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"

	"mesh-controller/app/protocol"
	"mesh-controller/embedded/broker"
)

// BenchmarkBrokerConnection measures what the embedded broker keeps for each
// connected host, as serve starts it: a host's user JWT and permissions, its
// two subscriptions and a heartbeat sent. The clients speak the NATS
// protocol on bare sockets so that nothing of a client library is counted;
// the figures are the process's live heap and goroutine stacks after
// collections, per connection.
//
// Measured on the project's machine: about 30 KB of live heap and 8 KB of
// stacks a host (the heap's spans hold about a tenth more, partly empty).
// Of the heap, the server's client itself is about 7 KB and the host's
// permissions, one tree per user, about 15 KB: 10 KB for the five
// JetStream subjects that let a host read archives, 5 KB for its own
// subjects; with '>' for both lists a host costs 15 KB of heap. Issue 33:
// a host's answers moved under its own subjects (protocol.AnswerSubject),
// its publish list lost _INBOX.*.*, and a host about 1 KB (19.5 KB of
// heap a host before, 18.6 KB after, on a shared machine).
//
//	go test -run '^$' -bench BrokerConnection -benchtime 1x ./app/
func BenchmarkBrokerConnection(b *testing.B) {
	const hosts = 1000
	bb := startBenchBroker(b, b.TempDir())
	srv, keys := bb.srv, bb.keys
	addr := strings.TrimPrefix(srv.ClientURL(), "nats://")
	// The users are made first: their keys and JWTs are the hosts', not the broker's.
	type user struct {
		node, jwt string
		kp        nkeys.KeyPair
	}
	users := make([]user, hosts)
	for i := range users {
		kp, _ := nkeys.CreateUser()
		pub, _ := kp.PublicKey()
		node := fmt.Sprintf("h%d", i)
		jwt, err := keys.IssueUser("host "+node, pub, hostPermissions(node), false)
		if err != nil {
			b.Fatal(err)
		}
		users[i] = user{node, jwt, kp}
	}
	var heap, stacks float64
	for b.Loop() {
		h0, s0 := heapAndStacks()
		conns := make([]net.Conn, 0, hosts)
		for _, u := range users {
			c, _, err := hostConnect(addr, u.node, u.jwt, u.kp)
			if err != nil {
				b.Fatal(err)
			}
			conns = append(conns, c)
		}
		h1, s1 := heapAndStacks()
		heap, stacks = float64(h1-h0)/hosts, float64(s1-s0)/hosts
		for _, c := range conns {
			c.Close()
		}
	}
	b.ReportMetric(heap, "heap-bytes/conn")
	b.ReportMetric(stacks, "stack-bytes/conn")
}

// heapAndStacks are the live heap and the goroutine stacks after
// collections. The live heap, not the heap's spans in use: those depend on
// how full the spans others left are.
func heapAndStacks() (heap, stacks int64) {
	// Each collection halves a goroutine's stack that uses under a quarter
	// of it: a few, as a serving daemon's would, bring them to their size.
	for range 4 {
		runtime.GC()
	}
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc), int64(m.StackInuse)
}

// hostConnect connects as a host does: CONNECT with its JWT and the server's
// nonce signed, its two subscriptions, a heartbeat, and waits for the PONG;
// what arrives next is read from the reader it returns.
func hostConnect(addr, node, userJWT string, kp nkeys.KeyPair) (net.Conn, *bufio.Reader, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	var info struct {
		Nonce string `json:"nonce"`
	}
	if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "INFO ")), &info); err != nil {
		c.Close()
		return nil, nil, err
	}
	sig, _ := kp.Sign([]byte(info.Nonce))
	connect, _ := json.Marshal(map[string]any{"jwt": userJWT, "sig": base64.RawURLEncoding.EncodeToString(sig),
		"verbose": false, "pedantic": false, "lang": "go", "version": "1.55.0", "protocol": 1, "headers": true,
		"no_responders": true, "name": "mesh-host " + node})
	fmt.Fprintf(c, "CONNECT %s\r\nSUB %s 1\r\nSUB %s.* 2\r\nPUB %s 2\r\nhi\r\nPING\r\n", connect,
		protocol.DeclarationInbox(node), protocol.HostInboxPrefix(node), protocol.NodeSubject(node, protocol.Heartbeat))
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			c.Close()
			return nil, nil, err
		}
		switch {
		case strings.HasPrefix(line, "PONG"):
			return c, r, nil
		case strings.HasPrefix(line, "-ERR"):
			c.Close()
			return nil, nil, fmt.Errorf("%s: %s", node, strings.TrimSpace(line))
		}
	}
}

// benchBroker is a broker of a benchmark's own, with new keys.
type benchBroker struct {
	srv  *broker.Server
	keys broker.Keys
	// op, acc and sys are the keys' seeds (operator, account, system).
	op, acc, sys []byte
}

// startBenchBroker starts a broker with new keys on a loopback port (its
// JetStream store in storeDir, none if ""), shut down as b ends.
func startBenchBroker(b *testing.B, storeDir string) benchBroker {
	b.Helper()
	op, acc, sys, err := broker.NewSeeds()
	if err != nil {
		b.Fatal(err)
	}
	keys, err := broker.KeysFromSeeds(op, acc, sys)
	if err != nil {
		b.Fatal(err)
	}
	trust, err := keys.Trust(joinUser(), nil)
	if err != nil {
		b.Fatal(err)
	}
	srv, err := broker.StartWith(broker.Config{Listen: "127.0.0.1:0", Trust: trust, StoreDir: storeDir})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Shutdown)
	return benchBroker{srv: srv, keys: keys, op: op, acc: acc, sys: sys}
}
