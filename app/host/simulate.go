package host

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"mesh-controller/app/protocol"
)

// SimOptions shape a simulation of many hosts from one process.
type SimOptions struct {
	Broker     string
	TokensFile string
	Heartbeat  time.Duration
	// ApplyDelay is how long each simulated apply takes.
	ApplyDelay time.Duration
	// Fails, if set, says which declared modules a simulated host reports
	// failed rather than ready (a roll-out's failure, measured).
	Fails func(node, module, version string) bool
	// Report is how often a progress line is printed.
	Report time.Duration
	// Joins bounds how many joins are in flight at once (DefaultSimJoins
	// if 0; negative: no bound, every host dials at once).
	Joins int
	// For, if set, is how long the hosts run once every one has joined or
	// failed to: a rack's joins are not cut short by it, and a join still
	// under way is not counted failed because the time was up.
	For time.Duration
	Out io.Writer

	// facts are what every simulated host reports on connecting: this
	// machine's, read once.
	facts protocol.FactsBody
}

// DefaultSimJoins is how many simulated hosts join at once: as many as the
// controller's broker lets connect without credentials at a time (its cap,
// 1,024), so a rack joins as fast as the controller admits it, each host
// independent of the others. More would be turned away by the broker and
// ask again a moment later, each time a handshake of the broker's and a
// connection of the simulator's on the same machine; fewer make the
// simulator, not the controller, set the pace (at 32 the join time of
// 10,000 was the simulator's round trips).
const DefaultSimJoins = 1024

// SimStats count what the simulated hosts did.
type SimStats struct {
	Hosts        int   `json:"hosts"`
	Joined       int64 `json:"joined"`
	JoinFailed   int64 `json:"join_failed"`
	Beating      int64 `json:"beating"`
	BeatsSent    int64 `json:"beats_sent"`
	Declarations int64 `json:"declarations"`
	Applied      int64 `json:"applied"`
	Refused      int64 `json:"refused"`
	// Reconnects counts the connections made again after one was lost;
	// AsksUnanswered, the asks for the latest declaration asked again.
	Reconnects     int64 `json:"reconnects"`
	AsksUnanswered int64 `json:"asks_unanswered"`
	// GaveUp counts the hosts whose connection closed for good before the
	// simulation ended: none should.
	GaveUp int64 `json:"gave_up"`
	// KeysFollowed counts the controller keys the hosts took on (a host
	// that followed two rotations at once counts one).
	KeysFollowed int64 `json:"keys_followed"`
	// Serials is the latest serial each host applied, for a fan-out measure.
	Serials map[string]int64 `json:"-"`
}

// ReadTokens reads "name token" lines.
func ReadTokens(file string) ([][2]string, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out [][2]string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 2 {
			return nil, fmt.Errorf("%s: %q is not 'name token'", file, sc.Text())
		}
		out = append(out, [2]string{fields[0], fields[1]})
	}
	return out, sc.Err()
}

// Simulate plays every host of a token file from one process: each joins
// with its own keys, keeps its own broker connection and user, signs every
// message, verifies every declaration it receives, applies it to memory
// and reports it applied. It runs until ctx ends and returns what happened.
func Simulate(ctx context.Context, o SimOptions) (SimStats, error) {
	tokens, err := ReadTokens(o.TokensFile)
	if err != nil {
		return SimStats{}, err
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = protocol.DefaultHeartbeat
	}
	if o.Report <= 0 {
		o.Report = 5 * time.Second
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	o.facts = Facts(os.TempDir())
	// What this machine has listening is its own, not each simulated
	// host's: reported by ten thousand, it would be ten thousand
	// unmanaged listeners raised at once, a cost of the simulation rather
	// than of the load measured.
	o.facts.Found = nil
	var st simCounters
	st.hosts = len(tokens)
	var wg sync.WaitGroup
	if o.Joins == 0 {
		o.Joins = DefaultSimJoins
	}
	var sem chan struct{} // nil: no bound
	if o.Joins > 0 {
		sem = make(chan struct{}, o.Joins)
	}
	var mu sync.Mutex
	serials := map[string]int64{}
	// The hosts run on until ctx ends or, with For, For after the joins.
	hostsCtx, stopHosts := context.WithCancel(ctx)
	defer stopHosts()
	var joining sync.WaitGroup
	for _, tk := range tokens {
		wg.Add(1)
		joining.Add(1)
		go func(name, token string) {
			defer wg.Done()
			if sem != nil {
				select {
				case sem <- struct{}{}:
				case <-ctx.Done():
					joining.Done()
					return
				}
			}
			s, err := joinMemory(ctx, o.Broker, name, token)
			if sem != nil {
				<-sem
			}
			joining.Done()
			if err != nil {
				st.joinFailed.Add(1)
				fmt.Fprintf(o.Out, "%s: %v\n", name, err)
				return
			}
			st.joined.Add(1)
			simHost(hostsCtx, s, o, &st, func(serial int64) {
				mu.Lock()
				serials[name] = serial
				mu.Unlock()
			})
		}(tk[0], tk[1])
	}
	if o.For > 0 {
		go func() {
			joining.Wait()
			select {
			case <-time.After(o.For):
				stopHosts()
			case <-hostsCtx.Done():
			}
		}()
	}
	tick := time.NewTicker(o.Report)
	defer tick.Stop()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for {
		select {
		case <-tick.C:
			fmt.Fprintln(o.Out, st.line())
		case <-done:
			stats := st.stats()
			stats.Serials = serials
			fmt.Fprintln(o.Out, "summary:", st.line())
			return stats, nil
		}
	}
}

type simCounters struct {
	hosts                                                              int
	joined, joinFailed, beating, beats, declarations, applied, refused atomic.Int64
	reconnects, asksUnanswered, gaveUp                                 atomic.Int64
	// rotations counts the controller keys the hosts took on.
	rotations atomic.Int64
}

func (c *simCounters) stats() SimStats {
	return SimStats{Hosts: c.hosts, Joined: c.joined.Load(), JoinFailed: c.joinFailed.Load(), Beating: c.beating.Load(), BeatsSent: c.beats.Load(),
		Declarations: c.declarations.Load(), Applied: c.applied.Load(), Refused: c.refused.Load(),
		Reconnects: c.reconnects.Load(), AsksUnanswered: c.asksUnanswered.Load(), GaveUp: c.gaveUp.Load(), KeysFollowed: c.rotations.Load()}
}

func (c *simCounters) line() string {
	s := c.stats()
	return fmt.Sprintf("%s hosts %d joined %d (failed %d) beating %d beats sent %d declarations %d applied %d refused %d reconnects %d asks unanswered %d gave up %d",
		time.Now().UTC().Format(time.RFC3339), s.Hosts, s.Joined, s.JoinFailed, s.Beating, s.BeatsSent, s.Declarations, s.Applied, s.Refused,
		s.Reconnects, s.AsksUnanswered, s.GaveUp)
}

// joinMemory joins like Join, keeping the state in memory only.
func joinMemory(ctx context.Context, broker, node, token string) (*State, error) {
	return join(ctx, JoinOptions{Broker: broker, Token: token, Node: node}, false)
}

// simHost is one simulated host at work until ctx ends. It comes back as
// a real host does when its broker or controller goes away: the same
// reconnection, and on each connection its facts, a beat and an ask for
// its latest declaration until it is answered.
func simHost(ctx context.Context, s *State, o SimOptions, st *simCounters, appliedSerial func(int64)) {
	opts, err := s.ConnectOptions()
	if err != nil {
		return
	}
	connected := make(chan struct{}, 1)
	onConnect := func(*nats.Conn) {
		select {
		case connected <- struct{}{}:
		default:
		}
	}
	nc, err := nats.Connect(strings.Join(s.BrokerURLs, ","), append(append(opts, reconnecting()...),
		nats.ConnectHandler(onConnect),
		nats.ReconnectHandler(func(*nats.Conn) { st.reconnects.Add(1); onConnect(nil) }),
		nats.ClosedHandler(func(*nats.Conn) {
			if ctx.Err() == nil {
				st.gaveUp.Add(1)
			}
		}))...)
	if err != nil {
		st.gaveUp.Add(1)
		return
	}
	defer nc.Close()
	var mu sync.Mutex
	var last int64
	// A simulated host runs nothing: each module that has a run section is
	// reported ready once its declaration is applied, so that a roll-out
	// measured against simulated hosts waits for what real ones report.
	var modules []protocol.ModuleState
	// beatSoon asks for a beat: the controller answered the ask made on
	// connecting (and may have lost the beat sent then), or the host took
	// on a new controller key, which its beat acknowledges.
	beatSoon := make(chan struct{}, 1)
	soon := func() {
		select {
		case beatSoon <- struct{}{}:
		default:
		}
	}
	apply := func(env protocol.Envelope) {
		st.declarations.Add(1)
		d, err := s.Verify(env)
		if _, ok := errors.AsType[*UnknownKeyError](err); ok {
			// As a real host: the chain first, then the declaration.
			if fs, cerr := askChain(ctx, nc, s); cerr == nil && len(fs) > 0 {
				soon()
				d, err = s.Verify(env)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		report := protocol.AppliedBody{Serial: d.Serial, OK: true}
		var data protocol.DataBody
		switch {
		case err != nil:
			report = protocol.AppliedBody{OK: false, Error: "refused: " + err.Error()}
		case d.Serial <= last:
			return // an answer to a reconnect for what is applied already
		default:
			if o.ApplyDelay > 0 {
				time.Sleep(o.ApplyDelay)
			}
			last = d.Serial
			modules = modules[:0]
			data.Sets = []protocol.DataSet{}
			for _, m := range d.Modules {
				if m.Run != nil {
					state, detail := protocol.StateReady, ""
					if o.Fails != nil && o.Fails(s.Node, m.Module, m.Version) {
						state, detail = protocol.StateFailed, "the simulation fails this version"
					}
					modules = append(modules, protocol.ModuleState{Module: m.Module, Version: m.Version, State: state, Detail: detail,
						Serial: d.Serial, DeclaredAt: d.IssuedAt, Since: time.Now().UTC()})
				}
				for _, ds := range m.Data {
					data.Sets = append(data.Sets, protocol.DataSet{Module: m.Module, Name: ds.Name, Path: ds.Path, Precious: ds.Precious})
				}
			}
			report.Modules = modules
		}
		b, err := protocol.Sign(s.HostKey, report)
		if err != nil {
			return
		}
		if _, err := nc.Request(protocol.NodeSubject(s.Node, protocol.Applied), b, 30*time.Second); err != nil {
			return
		}
		if !report.OK {
			st.refused.Add(1)
			return
		}
		st.applied.Add(1)
		appliedSerial(d.Serial)
		// As a real host does after each apply.
		if b, err := protocol.Sign(s.HostKey, data); err == nil {
			nc.Publish(protocol.NodeSubject(s.Node, protocol.DataReport), b)
		}
	}
	if _, err := nc.Subscribe(protocol.DeclarationInbox(s.Node), func(m *nats.Msg) {
		var env protocol.Envelope
		if json.Unmarshal(m.Data, &env) == nil {
			go apply(env)
		}
	}); err != nil {
		return
	}
	if _, err := nc.Subscribe(protocol.NodeSubject(s.Node, protocol.KeyInbox), func(m *nats.Msg) {
		var n protocol.KeyNotice
		if json.Unmarshal(m.Data, &n) != nil {
			return
		}
		go func() {
			fs, err := s.Adopt(n.Links, time.Now())
			if errors.Is(err, protocol.ErrNotFromKey) {
				fs, err = askChain(ctx, nc, s)
			}
			if err == nil && len(fs) > 0 {
				st.rotations.Add(1)
				soon()
			}
		}()
	}); err != nil {
		return
	}
	started := time.Now()
	first := true
	beat := func() {
		mu.Lock()
		serial, ms := last, slices.Clone(modules)
		mu.Unlock()
		b, err := protocol.Sign(s.HostKey, protocol.HeartbeatBody{At: time.Now().UTC(), IntervalS: o.Heartbeat.Seconds(), SerialApplied: serial,
			UptimeS: int64(time.Since(started).Seconds()), Modules: ms, ControllerKey: s.KeyID()})
		if err == nil && nc.Publish(protocol.NodeSubject(s.Node, protocol.Heartbeat), b) == nil {
			st.beats.Add(1)
			if first {
				st.beating.Add(1)
				first = false
			}
		}
	}
	// Beats go on at a random point of the interval, as real hosts' do.
	n, _ := rand.Int(rand.Reader, big.NewInt(int64(o.Heartbeat)))
	next := time.NewTimer(time.Duration(n.Int64()))
	defer next.Stop()
	var asks asking
	defer asks.end()
	for {
		select {
		case <-beatSoon:
			beat()
		case <-connected:
			if b, err := protocol.Sign(s.HostKey, o.facts); err == nil {
				nc.Publish(protocol.NodeSubject(s.Node, protocol.FactsReport), b)
			}
			beat()
			mu.Lock()
			serial := last
			mu.Unlock()
			asks.start(ctx, func(ctx context.Context) {
				env, err := askLatest(ctx, nc, s, serial, func(error) { st.asksUnanswered.Add(1) })
				if err == nil {
					soon()
				}
				if err == nil && env != nil {
					apply(*env)
				}
			})
		case <-next.C:
			beat()
			next.Reset(o.Heartbeat)
		case <-ctx.Done():
			nc.Flush()
			return
		}
	}
}
