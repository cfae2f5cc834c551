package loadbench

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/big"
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

	"github.com/google/pprof/profile"
	"github.com/nats-io/nats.go"

	"mesh-controller/app"
	"mesh-controller/app/protocol"
	"mesh-controller/embedded/broker"
)

// The floor: what the same load costs with nothing of ours, measured in the
// same run as the controller beside it. A bare nats-server of the version
// in go.mod, in operator mode as the embedded broker is (and, as it, with
// no sublist cache), holds as many connections, each a user with a host's
// permissions and a host's three subscriptions, beating the same signed
// bytes as often into one connection that hears them all as the
// controller's does; the signatures' cost is timed on its own (cryptoFloor).

// beforePermissions are a host user's permissions as issue 32 left them
// (four entries), measured beside today's for what the fewer entries save.
func beforePermissions(node string) broker.Permissions {
	return broker.Permissions{
		Publish:    []string{"mesh.node." + node + ".>", "_INBOX.*.*"},
		Subscribe:  []string{"mesh.node." + node + ".inbox.>", protocol.HostInboxPrefix(node) + ".>"},
		MaxPayload: 1 << 20,
	}
}

// entries is how many subjects a user's permissions name.
func entries(p broker.Permissions) int { return len(p.Publish) + len(p.Subscribe) }

// natsServer builds nats-server at the version go.mod requires.
func natsServer(t *testing.T, dir string) string {
	return build(t, dir, "github.com/nats-io/nats-server/v2", "nats-server")
}

// floorBroker is a bare nats-server and the connections it holds.
type floorBroker struct {
	t     *testing.T
	cmd   *exec.Cmd
	url   string
	keys  broker.Keys
	ctl   *nats.Conn
	hosts []*nats.Conn
	names []string
	// beats counts the beats heard; delivered the declarations hosts got.
	beats, delivered atomic.Int64
	stopBeats        context.CancelFunc
}

func startFloor(t *testing.T, bin string) *floorBroker {
	op, acc, sys, err := broker.NewSeeds()
	if err != nil {
		t.Fatal(err)
	}
	keys, err := broker.KeysFromSeeds(op, acc, sys)
	if err != nil {
		t.Fatal(err)
	}
	trust, err := keys.Trust(broker.JoinUser{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	q := strconv.Quote
	var b strings.Builder
	fmt.Fprintf(&b, "listen: %s\nno_sublist_cache: true\nauthorization: { timeout: %g }\n", q(addr), broker.AuthTimeout.Seconds())
	fmt.Fprintf(&b, "operator: %s\nsystem_account: %s\nresolver: MEMORY\nresolver_preload: {\n", q(trust.OperatorJWT), q(trust.SystemPub))
	for pub, j := range trust.Preload() {
		fmt.Fprintf(&b, "  %s: %s\n", pub, q(j))
	}
	b.WriteString("}\n")
	conf := filepath.Join(t.TempDir(), "floor.conf")
	if err := os.WriteFile(conf, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	f := &floorBroker{t: t, url: "nats://" + addr, keys: keys}
	f.cmd = exec.Command(bin, "-c", conf)
	var out bytes.Buffer
	f.cmd.Stdout, f.cmd.Stderr = &out, &out
	if err := f.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.stop)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("bare nats-server not listening on %s: %s", addr, out.String())
		}
	}
	f.ctl = f.dial("controller", app.ControllerPermissions(), "")
	if _, err := f.ctl.QueueSubscribe(protocol.NodeWildcard(protocol.Heartbeat), "controller", func(*nats.Msg) { f.beats.Add(1) }); err != nil {
		t.Fatal(err)
	}
	f.ctl.Flush()
	return f
}

func (f *floorBroker) dial(name string, p broker.Permissions, inbox string) *nats.Conn {
	userJWT, seed, err := f.keys.NewUser(name, p)
	if err != nil {
		f.t.Fatal(err)
	}
	opts := []nats.Option{nats.UserJWTAndSeed(userJWT, string(seed)), nats.MaxReconnects(-1)}
	if inbox != "" {
		opts = append(opts, nats.CustomInboxPrefix(inbox))
	}
	nc, err := nats.Connect(f.url, opts...)
	if err != nil {
		f.t.Fatalf("floor: %s: %v", name, err)
	}
	return nc
}

// connect opens one connection per host as a simulated host holds it: its
// user with perms, its declarations' and keys' inboxes, and the inbox of
// its own requests (nats.go's one subscription for them all).
func (f *floorBroker) connect(hosts int, perms func(node string) broker.Permissions) {
	f.hosts, f.names = make([]*nats.Conn, hosts), make([]string, hosts)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for i := range hosts {
		node := fmt.Sprintf("f%d", i+1)
		f.names[i] = node
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			nc := f.dial("host of "+node, perms(node), protocol.HostInboxPrefix(node))
			for _, s := range []string{protocol.DeclarationInbox(node), protocol.NodeSubject(node, protocol.KeyInbox), nc.NewInbox() + ".*"} {
				if _, err := nc.Subscribe(s, func(*nats.Msg) { f.delivered.Add(1) }); err != nil {
					f.t.Errorf("floor: subscribe %s: %v", s, err)
				}
			}
			nc.Flush()
			f.hosts[i] = nc
		}()
	}
	wg.Wait()
}

// beat has every host publish beat every interval, each at its own point
// of it, as simulated hosts do, until stopped.
func (f *floorBroker) beat(interval time.Duration, beat []byte) {
	ctx, cancel := context.WithCancel(context.Background())
	f.stopBeats = cancel
	for i, nc := range f.hosts {
		subject := protocol.NodeSubject(f.names[i], protocol.Heartbeat)
		n, _ := rand.Int(rand.Reader, big.NewInt(int64(interval)))
		go func() {
			tm := time.NewTimer(time.Duration(n.Int64()))
			defer tm.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tm.C:
					nc.Publish(subject, beat)
					tm.Reset(interval)
				}
			}
		}()
	}
}

// ticks is a count of clock ticks (/proc's, 100 a second) as a duration.
func ticks(n int64) time.Duration { return time.Duration(n) * 10 * time.Millisecond }

// machineCPU is the CPU time the machine spent on an act, by process: the
// controller's serve (with its broker), the simulated hosts, the command.
type machineCPU struct {
	serve, hosts, command time.Duration
}

// total is every process's CPU for the act.
func (m machineCPU) total() time.Duration { return m.serve + m.hosts + m.command }

// wall is the least wall time the act could take on cores, all of them
// busy with it and nothing else.
func (m machineCPU) wall(cores int) time.Duration { return m.total() / time.Duration(max(cores, 1)) }

// String says the total, then each process's part.
func (m machineCPU) String() string {
	r := func(d time.Duration) string { return d.Round(10 * time.Millisecond).String() }
	return fmt.Sprintf("%s (serve %s, hosts %s, command %s)", r(m.total()), r(m.serve), r(m.hosts), r(m.command))
}

// window is process pid's resident memory at the end of d and its share
// of one core over it: the controller's and the floor's steady state alike.
func window(pid int, d time.Duration) (rss int64, cpu float64) {
	t0, w0 := procTicks(pid), time.Now()
	time.Sleep(d)
	return procRSS(pid), ticks(procTicks(pid)-t0).Seconds() / time.Since(w0).Seconds()
}

// fanOut signs decl for every host as the controller signs a declaration
// (canonical form, ed25519) and publishes each into its host's inbox from
// one connection: how long the signing took, the publishing (until the
// server has them all), and until every host had its own.
func (f *floorBroker) fanOut(decl protocol.Declaration) (sign, send, all time.Duration) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	keyID := protocol.KeyID(pub)
	envs := make([]protocol.Envelope, len(f.names))
	start := time.Now()
	for i, node := range f.names {
		d := decl
		d.Node, d.Serial = node, int64(i+1)
		env, err := protocol.Seal(d, func(b []byte) []byte { return ed25519.Sign(priv, b) }, keyID)
		if err != nil {
			f.t.Fatal(err)
		}
		envs[i] = env
	}
	sign = time.Since(start)
	base := f.delivered.Load()
	start = time.Now()
	for i, env := range envs {
		b, _ := json.Marshal(env)
		f.ctl.Publish(protocol.DeclarationInbox(f.names[i]), b)
	}
	if err := f.ctl.FlushTimeout(time.Minute); err != nil {
		f.t.Fatal(err)
	}
	send = time.Since(start)
	for deadline := time.Now().Add(time.Minute); f.delivered.Load()-base < int64(len(envs)) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	return sign, send, time.Since(start)
}

func (f *floorBroker) stop() {
	if f.stopBeats != nil {
		f.stopBeats()
	}
	for _, nc := range f.hosts {
		if nc != nil {
			nc.Close()
		}
	}
	if f.ctl != nil {
		f.ctl.Close()
	}
	if f.cmd.ProcessState == nil {
		f.cmd.Process.Kill()
		f.cmd.Wait()
	}
}

// signedBeat is a heartbeat as a simulated host signs it in the steady
// state (nothing applied yet), and the key it verifies with.
func signedBeat(t *testing.T, interval time.Duration) ([]byte, ed25519.PublicKey) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	b, err := protocol.Sign(priv, protocol.HeartbeatBody{At: time.Now().UTC(), IntervalS: interval.Seconds(), UptimeS: 1234,
		ControllerKey: protocol.KeyID(pub)})
	if err != nil {
		t.Fatal(err)
	}
	return b, pub
}

// cryptoFloor is how long one core takes to verify n heartbeats'
// signatures, and nothing else of them.
func cryptoFloor(t *testing.T, n int, beat []byte, pub ed25519.PublicKey) time.Duration {
	var s protocol.Signed
	if err := json.Unmarshal(beat, &s); err != nil {
		t.Fatal(err)
	}
	sig, _ := base64.StdEncoding.DecodeString(s.Signature)
	start := time.Now()
	for range n {
		if !ed25519.Verify(pub, s.Body, sig) {
			t.Fatal("the beat does not verify")
		}
	}
	return time.Since(start)
}

// heapSplit divides a heap profile's bytes in use between the embedded
// broker (allocated under nats-server's package) and the rest, the
// controller's own.
func heapSplit(file string) (brokers, own int64, err error) {
	f, err := os.Open(file)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	p, err := profile.Parse(f)
	if err != nil {
		return 0, 0, err
	}
	at := -1
	for i, st := range p.SampleType {
		if st.Type == "inuse_space" {
			at = i
		}
	}
	if at < 0 {
		return 0, 0, fmt.Errorf("%s: no inuse_space", file)
	}
	for _, s := range p.Sample {
		inBroker := false
		for _, loc := range s.Location {
			for _, l := range loc.Line {
				if l.Function != nil && strings.Contains(l.Function.Name, "nats-server/v2/server.") {
					inBroker = true
				}
			}
		}
		if inBroker {
			brokers += s.Value[at]
		} else {
			own += s.Value[at]
		}
	}
	return brokers, own, nil
}
