package app

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"mesh-controller/app/plan"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/inventory"
	"mesh-controller/embedded/broker"
)

// sendBenchHosts names the file that makes this test binary the hosts'
// process of BenchmarkDeclareSend10000 (TestSendBenchHosts).
const sendBenchHosts = "MESH_SEND_BENCH_HOSTS"

// sendBenchConfig is what the hosts' process is told: where the broker
// listens, its keys, and how many hosts (n0, n1, …) to connect.
type sendBenchConfig struct {
	Addr                      string
	Operator, Account, System []byte
	Hosts                     int
}

// BenchmarkDeclareSend10000 is a change to every node of a mesh of 10,000
// as the controller sends it: every plan made, signed and kept in one
// push (declarer.declare), then published through the embedded broker (as
// serve starts it: operator mode, each host its own user and permissions)
// to 10,000 connected hosts, until each has received its own. The hosts
// are another process (this binary again, TestSendBenchHosts): a process
// may hold 20,000 descriptors here, and broker and hosts need 10,000 each.
// The hosts speak the NATS protocol on bare sockets and only count what
// arrives, so what is measured is the controller's and the broker's.
//
// Beside it, "floor" signs the same 10,000 bodies (in parallel, as declare
// does) and publishes them from one connection to the same hosts, with no
// plan and no store: what sending such a change cannot go below here.
//
// all-ms is from the start of sending until every host had its own.
//
//	go test -run '^$' -bench DeclareSend10000 -benchtime 3x ./app/
func BenchmarkDeclareSend10000(b *testing.B) {
	const hosts = 10000
	c := plannedMesh(b, hosts, 1, 40)
	ctx := context.Background()
	st, err := c.stores(ctx)
	if err != nil {
		b.Fatal(err)
	}
	key, err := st.Identity.SigningKey(ctx)
	if err != nil {
		b.Fatal(err)
	}
	bb := startBenchBroker(b, "")
	srv, keys := bb.srv, bb.keys
	got := startSendBenchHosts(b, sendBenchConfig{Addr: strings.TrimPrefix(srv.ClientURL(), "nats://"), Operator: bb.op, Account: bb.acc, System: bb.sys, Hosts: hosts})
	userJWT, seed, err := keys.NewUser("controller-command", controllerPermissions())
	if err != nil {
		b.Fatal(err)
	}
	nc, err := nats.Connect(srv.ClientURL(), nats.UserJWTAndSeed(userJWT, string(seed)), nats.NoReconnect())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	received := int64(0)
	// allIn waits until every host has one more message.
	allIn := func() {
		received += hosts
		for n := range got {
			if n >= received {
				return
			}
		}
		b.Fatal("the hosts' process ended before every host received its declaration")
	}
	ms := func(d time.Duration, n int) float64 { return d.Seconds() * 1000 / float64(n) }

	b.Run("declare", func(b *testing.B) {
		d := &declarer{inv: st.Inventory, sec: st.Secrets, lic: st.Licences, ids: st.Identity, key: key, now: time.Now, nc: nc}
		var sum DeclareTimes
		var snapT, all time.Duration
		for b.Loop() {
			start := time.Now()
			snap, err := st.Inventory.Snapshot(ctx)
			if err != nil {
				b.Fatal(err)
			}
			snapT += time.Since(start)
			for _, p := range d.declare(ctx, snap, snap.NodeNames) {
				if p.Problem != "" || !p.Sent {
					b.Fatal(p.Problem, p.NotSent)
				}
			}
			sendStart := time.Now().Add(-d.took.Send)
			allIn()
			all += time.Since(sendStart)
			sum.Plan += d.took.Plan
			sum.Sign += d.took.Sign
			sum.Store += d.took.Store
			sum.Send += d.took.Send
		}
		b.ReportMetric(ms(snapT, b.N), "snapshot-ms")
		b.ReportMetric(ms(sum.Plan, b.N), "plan-ms")
		b.ReportMetric(ms(sum.Sign, b.N), "sign-ms")
		b.ReportMetric(ms(sum.Store, b.N), "store-ms")
		b.ReportMetric(ms(sum.Send, b.N), "send-ms")
		b.ReportMetric(ms(all, b.N), "all-ms")
	})

	b.Run("floor", func(b *testing.B) {
		snap, err := st.Inventory.Snapshot(ctx)
		if err != nil {
			b.Fatal(err)
		}
		pl := plan.New(snap, nil)
		bodies := make([]protocol.Declaration, 0, hosts)
		for _, n := range snap.NodeNames {
			p, err := pl.Plan(n)
			if err != nil {
				b.Fatal(err)
			}
			bodies = append(bodies, p.Body)
		}
		envs := make([]protocol.Envelope, hosts)
		var sign, send, all time.Duration
		serial := int64(1 << 40)
		for b.Loop() {
			start := time.Now()
			issued := start.UTC().Truncate(time.Second)
			serial++
			var wg sync.WaitGroup
			for w := range 2 {
				wg.Go(func() {
					for i := w; i < hosts; i += 2 {
						body := bodies[i]
						body.Serial, body.IssuedAt = serial, issued
						envs[i], _ = protocol.Seal(body, key.Sign, key.Fingerprint())
					}
				})
			}
			wg.Wait()
			sign += time.Since(start)
			start = time.Now()
			for i, env := range envs {
				bs, _ := json.Marshal(env)
				if err := nc.Publish(protocol.DeclarationInbox(bodies[i].Node), bs); err != nil {
					b.Fatal(err)
				}
			}
			if err := nc.FlushTimeout(time.Minute); err != nil {
				b.Fatal(err)
			}
			send += time.Since(start)
			allIn()
			all += time.Since(start)
		}
		b.ReportMetric(ms(sign, b.N), "sign-ms")
		b.ReportMetric(ms(send, b.N), "send-ms")
		b.ReportMetric(ms(all, b.N), "all-ms")
	})
}

// startSendBenchHosts starts the hosts' process and waits until every host
// is connected; what it returns says how many messages the hosts have
// received in all, each time that passes a multiple of the hosts.
func startSendBenchHosts(b *testing.B, cfg sendBenchConfig) <-chan int64 {
	file := filepath.Join(b.TempDir(), "hosts.json")
	js, _ := json.Marshal(cfg)
	if err := os.WriteFile(file, js, 0o600); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSendBenchHosts$", "-test.count=1")
	cmd.Env = append(os.Environ(), sendBenchHosts+"="+file)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	got := make(chan int64, 16)
	ready := make(chan error, 1)
	go func() {
		defer close(got)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "hosts: ready":
				ready <- nil
			case strings.HasPrefix(line, "hosts: got "):
				n, _ := strconv.ParseInt(strings.TrimPrefix(line, "hosts: got "), 10, 64)
				got <- n
			case strings.HasPrefix(line, "hosts: failed: "):
				ready <- fmt.Errorf("%s", strings.TrimPrefix(line, "hosts: failed: "))
			}
		}
		ready <- fmt.Errorf("the hosts' process ended")
	}()
	select {
	case err := <-ready:
		if err != nil {
			b.Fatal(err)
		}
	case <-time.After(3 * time.Minute):
		b.Fatal("the hosts did not connect within 3 minutes")
	}
	return got
}

// TestSendBenchHosts is the hosts' process of BenchmarkDeclareSend10000,
// run only when the benchmark starts it: each host connects as its own
// user, subscribes to its inboxes, and counts the messages it is sent;
// "hosts: got N" is said each time the count passes a multiple of the hosts.
func TestSendBenchHosts(t *testing.T) {
	file := os.Getenv(sendBenchHosts)
	if file == "" {
		t.Skip("the hosts' process of BenchmarkDeclareSend10000, started by it")
	}
	js, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var cfg sendBenchConfig
	if err := json.Unmarshal(js, &cfg); err != nil {
		t.Fatal(err)
	}
	keys, err := broker.KeysFromSeeds(cfg.Operator, cfg.Account, cfg.System)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf("hosts: "+format+"\n", args...)
	}
	var total atomic.Int64
	count := func(c net.Conn, r *bufio.Reader) {
		for {
			line, err := r.ReadSlice('\n')
			if err != nil {
				return
			}
			switch {
			case bytes.HasPrefix(line, []byte("MSG ")):
				f := bytes.Fields(line)
				size, _ := strconv.Atoi(string(f[len(f)-1]))
				if _, err := r.Discard(size + 2); err != nil {
					return
				}
				if n := total.Add(1); n%int64(cfg.Hosts) == 0 {
					say("got %d", n)
				}
			case bytes.HasPrefix(line, []byte("PING")):
				c.Write([]byte("PONG\r\n"))
			}
		}
	}
	var wg sync.WaitGroup
	var failed atomic.Value
	next := atomic.Int64{}
	for range 8 {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(cfg.Hosts); i = next.Add(1) - 1 {
				node := fmt.Sprintf("n%d", i)
				kp, _ := nkeys.CreateUser()
				pub, _ := kp.PublicKey()
				userJWT, err := keys.IssueUser("host "+node, pub, hostPermissions(node), false)
				if err != nil {
					failed.Store(err.Error())
					return
				}
				c, r, err := hostConnect(cfg.Addr, node, userJWT, kp)
				if err != nil {
					failed.Store(err.Error())
					return
				}
				go count(c, r)
			}
		})
	}
	wg.Wait()
	if f := failed.Load(); f != nil {
		say("failed: %s", f)
		return
	}
	say("ready")
	// Until the benchmark kills it: the hosts count on.
	select {}
}

// BenchmarkActs10000 is each act that changes one module on every node of
// a mesh of 10,000, as far as the controller goes before the hosts: an
// assign --nodes of a new module, a roll-out's move of every node to the
// module's other version (as serve's driver moves a batch), and a
// mesh-wide settings set; no broker answers, so the declarations are made,
// signed and kept, not sent (BenchmarkDeclareSend10000 measures sending).
//
//	go test -run '^$' -bench Acts10000 -benchtime 3x ./app/
func BenchmarkActs10000(b *testing.B) {
	const hosts = 10000
	c := plannedMesh(b, hosts, 1, 40)
	ctx := context.Background()
	st, err := c.stores(ctx)
	if err != nil {
		b.Fatal(err)
	}
	add := func(module, version string) {
		m, ps := inventory.ParseManifest([]byte(`{"module": "` + module + `", "version": "` + version + `",
			"data": [{"name": "d", "path": "/srv/` + module + `", "precious": "rebuildable"}], "settings": {"schema": {"type": "object"}, "defaults": {}}}`))
		if len(ps) > 0 {
			b.Fatal(ps)
		}
		canon, _ := protocol.Canonical(m)
		if _, err := st.Inventory.AddModule(ctx, m, canon, "", time.Now()); err != nil {
			b.Fatal(err)
		}
	}
	snap, err := st.Inventory.Snapshot(ctx)
	if err != nil {
		b.Fatal(err)
	}
	nodes := snap.NodeNames
	assign := func(b *testing.B, module string) {
		r, err := c.AssignMany(ctx, ManyRequest{Nodes: nodes, Modules: []string{module}})
		if err != nil || len(r.Pushed) != hosts {
			b.Fatal(err, len(r.Pushed))
		}
	}
	add("fan", "1.0.0")
	b.Run("assign", func(b *testing.B) {
		// Each assign of fan is undone before the next, unmeasured.
		for i := 0; i < b.N; i++ {
			assign(b, "fan")
			b.StopTimer()
			if _, err := c.UnassignMany(ctx, ManyRequest{Nodes: nodes, Modules: []string{"fan"}}); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})
	add("fan0", "1.0.0")
	assign(b, "fan0")
	b.Run("roll-out-move", func(b *testing.B) {
		// The module rolled out is the first assigned, between its versions.
		add("fan0", "2.0.0")
		key, err := st.Identity.SigningKey(ctx)
		if err != nil {
			b.Fatal(err)
		}
		m := &rollMover{c: c.uses, st: st, d: &declarer{inv: st.Inventory, sec: st.Secrets, lic: st.Licences, ids: st.Identity, hs: st.Health,
			key: key, now: c.Now, notSent: "benchmark"}}
		from, to := "1.0.0", "2.0.0"
		for b.Loop() {
			v := UpgradeView{Module: "fan0", Current: to}
			steps := make([]int, hosts)
			for i, n := range nodes {
				v.Steps = append(v.Steps, UpgradeStep{Node: n, From: from, To: to})
				steps[i] = i
			}
			// Not sent (no broker): the move is committed all the same.
			if committed, _ := m.move(ctx, &v, steps); !committed {
				b.Fatal("the move was not committed")
			}
			from, to = to, from
		}
	})
	b.Run("settings", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			r, err := c.SettingsSet(ctx, SettingsRequest{Module: "fan0", Body: fmt.Appendf(nil, `{"workers": %d}`, i), From: "benchmark"})
			if err != nil || len(r.Pushed) != hosts {
				b.Fatal(err, len(r.Pushed))
			}
		}
	})
}
