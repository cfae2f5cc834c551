package app

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"mesh-controller/app/protocol"
	"mesh-controller/contexts/health"
	"mesh-controller/contexts/identity"
	"mesh-controller/contexts/inventory"
	"mesh-controller/contexts/secrets"
	"mesh-controller/embedded/broker"
)

// ServeOptions shape the daemon.
type ServeOptions struct {
	// Listen is the embedded broker's address (host:port; port 0 picks one).
	Listen string
	// Ready is called once the daemon serves, with where its broker is.
	Ready func(Ready)
	// Log receives the daemon's log lines.
	Log io.Writer
	// LeaseTTL is how long the lease lasts unrenewed; renewed at a third of it.
	LeaseTTL time.Duration
	// FlushEvery is how often absorbed heartbeats are written.
	FlushEvery time.Duration
	// Counters, if set, counts what the daemon absorbed and dropped.
	Counters *Counters
	// CatchUpEvery is how often nodes whose declaration is behind their plan
	// are sent a new one (besides at start).
	CatchUpEvery time.Duration
	// CheckEvery is how often the self-check runs (besides after events that matter).
	CheckEvery time.Duration
	// Bounds are the self-check's; nil means the defaults.
	Bounds *Bounds
	// BoundsFromDurations sets heartbeat bounds from measured intervals.
	BoundsFromDurations bool
	// Healers are when the brake engages; zero means the defaults.
	Healers HealerLimits
	// MemoryLimit is the Go runtime's soft memory limit (0 leaves the
	// runtime's own, or GOMEMLIMIT's). Most of a large mesh's memory is the
	// broker's per-connection buffers, freed and reused: a soft limit keeps
	// the garbage collector from letting them pile up.
	MemoryLimit int64
	// BackupEvery, if set, is how often the daemon backs every store up into
	// BackupDir (made 0700), keeping the newest BackupKeep (0: DefaultBackupKeep).
	BackupEvery time.Duration
	BackupDir   string
	BackupKeep  int
}

// Counters count what a serving controller absorbed and dropped.
type Counters struct {
	// Beats counts heartbeats verified and absorbed; Dropped, messages refused.
	Beats, Dropped atomic.Int64
}

// Ready says where a serving controller can be reached.
type Ready struct {
	BrokerURL string
	DataDir   string
}

// Serve is the daemon: it takes the lease, starts (or dials) the broker,
// answers joins, absorbs what hosts report, answers their requests for
// declarations, and sends nodes that are behind their latest. It returns
// when ctx ends, having stopped the broker and given the lease back.
func (c *Controller) Serve(ctx context.Context, o ServeOptions) (err error) {
	defer func() {
		// Stopped while starting: a clean stop, not a failure.
		if err != nil && ctx.Err() != nil && !errors.Is(err, identity.ErrLeaseHeld) {
			err = nil
		}
	}()
	if o.LeaseTTL == 0 {
		o.LeaseTTL = 15 * time.Second
	}
	if o.FlushEvery == 0 {
		o.FlushEvery = time.Second
	}
	if o.CatchUpEvery == 0 {
		o.CatchUpEvery = 5 * time.Second
	}
	if o.CheckEvery == 0 {
		o.CheckEvery = 30 * time.Second
	}
	if o.Healers == (HealerLimits{}) {
		o.Healers = DefaultHealerLimits()
	}
	if o.MemoryLimit > 0 && os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(o.MemoryLimit)
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	dbs, closeAll, err := c.stores(ctx, Contexts...)
	if err != nil {
		return err
	}
	defer closeAll()
	if o.Counters == nil {
		o.Counters = &Counters{}
	}
	d := &daemon{
		c: c, log: o.Log, counters: o.Counters,
		inv: inventory.NewStore(dbs[0]), ids: identity.NewStore(dbs[1]), sec: secrets.NewStore(dbs[2]), health: health.NewStore(dbs[5]),
		beats: map[string]inventory.Beat{}, drops: map[dropKey]int64{}, hostKeys: map[string]ed25519.PublicKey{},
		problems: map[string]string{}, lastBeat: map[string]time.Time{}, kick: make(chan struct{}, 1),
	}

	holder := randomID()
	hostname, _ := os.Hostname()
	if err := d.ids.TakeLease(ctx, identity.Lease{Holder: holder, PID: os.Getpid(), Host: hostname,
		ExpiresAt: c.Now().Add(o.LeaseTTL)}, c.Now()); err != nil {
		return err
	}
	defer func() {
		// Given back on exit, so the next controller starts at once.
		if rerr := d.ids.ReleaseLease(context.Background(), holder); rerr != nil && err == nil {
			err = fmt.Errorf("give the lease back: %w", rerr)
		}
	}()
	// Under the lease: a second serve on the same stores must not touch the
	// holder's backup directory.
	backups, err := scheduleBackups(ctx, o, namedStores(Contexts, dbs), c.Now, d.logf)
	if err != nil {
		return err
	}
	defer backups.stop()

	if d.signer, err = d.ids.SigningKey(ctx); err != nil {
		return err
	}
	if d.keys, err = brokerKeys(ctx, d.ids); err != nil {
		return err
	}
	userJWT, seed, err := d.keys.NewUser("controller", controllerPermissions())
	if err != nil {
		return err
	}
	opts := []nats.Option{nats.UserJWTAndSeed(userJWT, string(seed)), nats.Name("mesh-controller"), nats.MaxReconnects(-1),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			d.logf("broker: %s: %v", subject, err)
		})}
	if c.Broker == "" {
		trust, err := trustOf(ctx, d.ids, d.keys)
		if err != nil {
			return err
		}
		srv, err := broker.Start(o.Listen, trust)
		if err != nil {
			return err
		}
		defer srv.Shutdown()
		d.srv = srv
		d.url = srv.ClientURL()
		opts = append(opts, srv.InProcess())
	} else {
		d.url = c.Broker
	}
	if d.nc, err = nats.Connect(d.url, opts...); err != nil {
		return fmt.Errorf("%w at %s: %v", ErrBrokerUnreachable, d.url, err)
	}
	defer d.nc.Close()

	if err := d.loadHostKeys(ctx); err != nil {
		return err
	}
	if err := d.subscribe(); err != nil {
		return err
	}
	if err := d.ids.RenewLease(ctx, holder, c.Now().Add(o.LeaseTTL), d.url); err != nil {
		return err
	}
	d.catchUp(ctx, true)
	if o.Ready != nil {
		o.Ready(Ready{BrokerURL: d.url, DataDir: c.DataDir})
	}

	flush := time.NewTicker(o.FlushEvery)
	defer flush.Stop()
	renew := time.NewTicker(o.LeaseTTL / 3)
	defer renew.Stop()
	catchUp := time.NewTicker(o.CatchUpEvery)
	defer catchUp.Stop()
	check := time.NewTicker(o.CheckEvery)
	defer check.Stop()
	selfCheck := func() {
		_, err := c.SelfCheck(ctx, CheckOptions{Bounds: o.Bounds, FromDurations: o.BoundsFromDurations, Holder: holder, NC: d.nc,
			Log: func(line string) { d.logf("%s", line) }})
		if err != nil && ctx.Err() == nil {
			d.logf("self-check: %v", err)
		}
		d.heal(ctx, o.Healers)
	}
	selfCheck()
	for {
		select {
		case <-ctx.Done():
			// Stop taking messages and let the handlers finish what was
			// already delivered (Drain returns at once), then write it all.
			d.nc.Drain()
			for deadline := time.Now().Add(5 * time.Second); d.nc.IsDraining() && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
			}
			d.flush(context.Background())
			d.logf("stopped: lease given back")
			return nil
		case <-flush.C:
			d.flush(ctx)
		case <-catchUp.C:
			d.catchUp(ctx, false)
		case <-check.C:
			selfCheck()
		case <-backups.due():
			backups.run(ctx)
		case <-d.kick:
			// An event that matters: let the burst settle, write what it
			// brought, then judge.
			time.Sleep(100 * time.Millisecond)
			d.flush(ctx)
			selfCheck()
		case <-renew.C:
			if err := d.ids.RenewLease(ctx, holder, c.Now().Add(o.LeaseTTL), d.url); err != nil {
				if ctx.Err() != nil {
					continue
				}
				return fmt.Errorf("renew the lease: %w", err)
			}
		}
	}
}

func randomID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

type dropKey struct{ node, reason string }

// daemon is one serving controller's state.
type daemon struct {
	c      *Controller
	log    io.Writer
	inv    *inventory.Store
	ids    *identity.Store
	sec    *secrets.Store
	health *health.Store
	signer identity.SigningKey
	keys   broker.Keys
	nc     *nats.Conn
	url    string
	// srv is the embedded broker; nil with an external one.
	srv *broker.Server

	mu       sync.Mutex
	hostKeys map[string]ed25519.PublicKey
	beats    map[string]inventory.Beat
	drops    map[dropKey]int64
	counters *Counters
	// problems are the plan problems last logged per node, so the catch-up
	// says each once rather than every few seconds.
	problems map[string]string
	// lastBeat is when each node last beat, to measure its intervals.
	lastBeat map[string]time.Time
	// durations wait to be written with the next flush.
	durations []health.Duration
	// kick asks for a self-check soon: something that matters happened.
	kick chan struct{}
}

// kickCheck asks for a self-check soon, without blocking.
func (d *daemon) kickCheck() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

func (d *daemon) logf(format string, args ...any) {
	fmt.Fprintf(d.log, "%s %s\n", time.Now().UTC().Format(time.RFC3339), fmt.Sprintf(format, args...))
}

func (d *daemon) loadHostKeys(ctx context.Context) error {
	hosts, err := d.ids.Hosts(ctx)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, h := range hosts {
		d.hostKeys[h.Node] = h.HostKey
	}
	return nil
}

func (d *daemon) subscribe() error {
	subs := map[string]nats.MsgHandler{
		protocol.JoinSubject:                           d.onJoin,
		protocol.NodeWildcard(protocol.Heartbeat):      d.onHeartbeat,
		protocol.NodeWildcard(protocol.FactsReport):    d.onFacts,
		protocol.NodeWildcard(protocol.Applied):        d.onApplied,
		protocol.NodeWildcard(protocol.DataReport):     d.onData,
		protocol.NodeWildcard(protocol.DeclarationAsk): d.onDeclarationAsk,
		protocol.NodeWildcard(protocol.BackupReport):   d.onBackup,
		RevokedSubject: d.onRevoked,
	}
	for subject, h := range subs {
		if _, err := d.nc.QueueSubscribe(subject, "controller", h); err != nil {
			return fmt.Errorf("subscribe %s: %w", subject, err)
		}
	}
	return d.nc.Flush()
}

// verify checks a host message against the key its node presented at join;
// one that does not verify is dropped and counted.
func (d *daemon) verify(m *nats.Msg, v any) (string, bool) {
	node := protocol.NodeOfSubject(m.Subject)
	d.mu.Lock()
	key := d.hostKeys[node]
	d.mu.Unlock()
	reason := ""
	if key == nil {
		reason = "unknown sender"
	} else if err := protocol.Open(m.Data, key, v); err != nil {
		reason = "bad signature"
		if !errors.Is(err, protocol.ErrBadSignature) {
			reason = "malformed"
		}
	}
	if reason == "" {
		return node, true
	}
	d.counters.Dropped.Add(1)
	d.mu.Lock()
	d.drops[dropKey{node, reason}]++
	d.mu.Unlock()
	d.logf("dropped %s from %s: %s", m.Subject, node, reason)
	d.kickCheck()
	return node, false
}

func (d *daemon) respond(m *nats.Msg, v any) {
	if m.Reply == "" {
		return
	}
	b, err := json.Marshal(v)
	if err == nil {
		err = m.Respond(b)
	}
	if err != nil {
		d.logf("answer %s: %v", m.Subject, err)
	}
}

func (d *daemon) onJoin(m *nats.Msg) {
	var r protocol.JoinRequest
	if err := json.Unmarshal(m.Data, &r); err != nil {
		d.respond(m, protocol.JoinReply{Error: "the join request is not JSON"})
		return
	}
	reply, err := d.join(context.Background(), r)
	if err != nil {
		d.logf("join of %q refused: %v", r.Node, err)
		if errors.Is(err, identity.ErrTokenUsed) {
			d.kickCheck()
		}
		d.respond(m, protocol.JoinReply{Error: err.Error()})
		return
	}
	d.logf("%s joined (host %s)", r.Node, r.HostVersion)
	d.respond(m, reply)
	d.afterJoin(context.Background(), r.Node)
}

// afterJoin makes the secrets the mesh makes for what the node was assigned
// before it joined (its age recipient was unknown until now), and sends it
// its plan.
func (d *daemon) afterJoin(ctx context.Context, node string) {
	// Most nodes join with nothing assigned yet: nothing to make, and no
	// need to read the whole mesh for each of thousands of joins.
	if n, err := d.inv.CountAssignments(ctx, node); err != nil || n == 0 {
		return
	}
	snap, err := d.inv.Snapshot(ctx)
	if err != nil {
		d.logf("after %s joined: %v", node, err)
		return
	}
	made, err := makeMeshSecrets(ctx, snap, d.ids, d.sec, node, d.c.Now())
	if err != nil {
		d.logf("make %s's secrets: %v", node, err)
	}
	if made == 0 {
		return
	}
	d.logf("%s: %d secrets made and sealed", node, made)
	if err := d.inv.BumpPlans(ctx, []string{node}); err != nil {
		d.logf("%v", err)
		return
	}
	d.catchUp(ctx, false)
}

func (d *daemon) join(ctx context.Context, r protocol.JoinRequest) (protocol.JoinReply, error) {
	if err := CheckName(r.Node); err != nil {
		return protocol.JoinReply{}, err
	}
	hostKey, err := base64.StdEncoding.DecodeString(r.HostKey)
	if err != nil || len(hostKey) != ed25519.PublicKeySize {
		return protocol.JoinReply{}, errors.New("host_key is not an ed25519 public key in base64")
	}
	if _, err := d.inv.Node(ctx, r.Node); err != nil {
		return protocol.JoinReply{}, err
	}
	userJWT, err := d.keys.IssueUser("host "+r.Node, r.NKey, hostPermissions(r.Node), false)
	if err != nil {
		return protocol.JoinReply{}, fmt.Errorf("nkey: %w", err)
	}
	now := d.c.Now()
	if err := d.ids.Join(ctx, r.Token, identity.Host{Node: r.Node, HostKey: hostKey, AgeRecipient: r.AgeRecipient,
		NKey: r.NKey, HostVersion: r.HostVersion}, now); err != nil {
		return protocol.JoinReply{}, err
	}
	if err := d.inv.MarkJoined(ctx, r.Node, now); err != nil {
		return protocol.JoinReply{}, err
	}
	d.mu.Lock()
	d.hostKeys[r.Node] = hostKey
	d.mu.Unlock()
	return protocol.JoinReply{OK: true, Creds: broker.JWTBlock(userJWT), ControllerKey: d.signer.PublicBase64(),
		BrokerURLs: []string{d.url}}, nil
}

func (d *daemon) onHeartbeat(m *nats.Msg) {
	var hb protocol.HeartbeatBody
	node, ok := d.verify(m, &hb)
	if !ok {
		return
	}
	d.counters.Beats.Add(1)
	now := d.c.Now()
	d.mu.Lock()
	d.beats[node] = inventory.Beat{Node: node, HeardAt: now, IntervalS: hb.IntervalS, SerialApplied: hb.SerialApplied, UptimeS: hb.UptimeS}
	if last, ok := d.lastBeat[node]; ok {
		d.durations = append(d.durations, health.Duration{Kind: "heartbeat", Subject: node, MS: float64(now.Sub(last).Microseconds()) / 1000, At: now})
	}
	d.lastBeat[node] = now
	d.mu.Unlock()
}

// flush writes the absorbed heartbeats in one transaction, and the drop counts.
func (d *daemon) flush(ctx context.Context) {
	d.mu.Lock()
	beats, drops, durations := d.beats, d.drops, d.durations
	d.beats, d.drops, d.durations = make(map[string]inventory.Beat, len(beats)), map[dropKey]int64{}, nil
	d.mu.Unlock()
	batch := make([]inventory.Beat, 0, len(beats))
	for _, b := range beats {
		batch = append(batch, b)
	}
	if err := d.inv.RecordBeats(ctx, batch); err != nil {
		d.logf("%v", err)
	}
	if err := d.health.RecordDurations(ctx, durations); err != nil {
		d.logf("record durations: %v", err)
	}
	for k, n := range drops {
		if err := d.health.CountDrops(ctx, k.node, k.reason, n, d.c.Now()); err != nil {
			d.logf("%v", err)
		}
	}
}

func (d *daemon) onFacts(m *nats.Msg) {
	var f protocol.FactsBody
	node, ok := d.verify(m, &f)
	if !ok {
		return
	}
	facts := make([]inventory.Fact, 0, len(f.Facts))
	for _, x := range f.Facts {
		facts = append(facts, inventory.Fact(x))
	}
	found := make([]inventory.Found, 0, len(f.Found))
	for _, x := range f.Found {
		found = append(found, inventory.Found(x))
	}
	if err := d.inv.RecordFacts(context.Background(), node, facts, found, d.c.Now()); err != nil {
		d.logf("%v", err)
	}
}

func (d *daemon) onApplied(m *nats.Msg) {
	var a protocol.AppliedBody
	node, ok := d.verify(m, &a)
	if !ok {
		return
	}
	err := d.inv.RecordOutcome(context.Background(), node, inventory.Outcome{Serial: a.Serial, OK: a.OK, Error: a.Error, TotalMS: a.TotalMS, At: d.c.Now()})
	if err != nil {
		d.logf("%v", err)
		d.respond(m, protocol.OKReply{Error: "not recorded"})
		return
	}
	now := d.c.Now()
	d.mu.Lock()
	d.durations = append(d.durations, health.Duration{Kind: "apply", Subject: node, MS: a.TotalMS, At: now})
	for _, t := range a.Tiers {
		d.durations = append(d.durations, health.Duration{Kind: "tier", Subject: node, Name: t.Tier, MS: t.MS, At: now})
	}
	d.mu.Unlock()
	if a.OK {
		d.logf("%s applied declaration %d in %.1f ms", node, a.Serial, a.TotalMS)
	} else {
		d.logf("%s refused or failed declaration %d: %s", node, a.Serial, a.Error)
		d.kickCheck()
	}
	d.respond(m, protocol.OKReply{OK: true})
}

func (d *daemon) onData(m *nats.Msg) {
	var b protocol.DataBody
	node, ok := d.verify(m, &b)
	if !ok {
		return
	}
	sets := make([]inventory.DataSet, 0, len(b.Sets))
	for _, s := range b.Sets {
		sets = append(sets, inventory.DataSet{Module: s.Module, Name: s.Name, Path: s.Path, Bytes: s.Bytes, Precious: s.Precious, LastBackup: s.LastBackup})
	}
	if err := d.inv.RecordDataSets(context.Background(), node, sets, d.c.Now()); err != nil {
		d.logf("%v", err)
	}
	if len(b.Deleted) > 0 {
		var done []inventory.Deletion
		for _, del := range b.Deleted {
			done = append(done, inventory.Deletion{Module: del.Module, Kind: del.Kind, Target: del.Target})
		}
		if err := d.inv.DeletionsDone(context.Background(), node, done, d.c.Now()); err != nil {
			d.logf("record deletions on %s: %v", node, err)
		}
		d.kickCheck()
	}
}

// onBackup records a backup line done, said by a host whose node holds the
// backup seat.
func (d *daemon) onBackup(m *nats.Msg) {
	var b protocol.BackupBody
	node, ok := d.verify(m, &b)
	if !ok {
		return
	}
	ctx := context.Background()
	snap, err := d.inv.Snapshot(ctx)
	if err != nil {
		d.logf("%v", err)
		return
	}
	holds := false
	for _, h := range snap.Seats.Holders[snap.Seats.SeatName("backup")] {
		holds = holds || h.Node == node
	}
	if !holds {
		d.logf("backup of %s/%s/%s reported by %s, which does not hold the backup seat: ignored", b.Node, b.Module, b.Data, node)
		d.respond(m, protocol.OKReply{Error: node + " does not hold the backup seat"})
		return
	}
	if err := d.inv.RecordBackup(ctx, b.Node, b.Module, b.Data, b.At); err != nil {
		d.logf("%v", err)
		d.respond(m, protocol.OKReply{Error: "not recorded"})
		return
	}
	d.logf("backup of %s/%s/%s done at %s (reported by %s)", b.Node, b.Module, b.Data, b.At.UTC().Format(time.RFC3339), node)
	d.respond(m, protocol.OKReply{OK: true})
	d.kickCheck()
}

func (d *daemon) onDeclarationAsk(m *nats.Msg) {
	var ask protocol.DeclarationAskBody
	node, ok := d.verify(m, &ask)
	if !ok {
		return
	}
	decl, err := d.inv.LatestDeclaration(context.Background(), node)
	if err != nil {
		d.logf("%v", err)
		return
	}
	if decl == nil {
		d.respond(m, protocol.None{None: true})
		return
	}
	d.respond(m, envelopeOf(*decl))
}

// catchUp sends a new declaration to every node whose declaration is
// behind its plan (changed while no broker was reachable); at start it also
// resends their latest to nodes that have not applied it.
func (d *daemon) catchUp(ctx context.Context, start bool) {
	snap, err := d.inv.Snapshot(ctx)
	if err != nil {
		d.logf("catch up: %v", err)
		return
	}
	var ahead []string
	for _, name := range snap.NodeNames {
		n := snap.Nodes[name]
		switch {
		case n.PlanVersion > n.DeclaredPlanVersion:
			ahead = append(ahead, name)
		case start && n.SerialApplied < n.SerialDeclared:
			if decl, err := d.inv.LatestDeclaration(ctx, name); err == nil && decl != nil {
				if err := publishDeclaration(d.nc, *decl); err != nil {
					d.logf("send %s its declaration: %v", name, err)
				}
			}
		}
	}
	if len(ahead) == 0 {
		return
	}
	dec := &declarer{inv: d.inv, sec: d.sec, key: d.signer, nc: d.nc, now: d.c.Now}
	for _, p := range dec.declare(ctx, snap, ahead) {
		switch {
		case p.Problem != "":
			if d.problems[p.Node] != p.Problem {
				d.problems[p.Node] = p.Problem
				d.logf("%s: %s", p.Node, p.Problem)
			}
		case p.Sent:
			d.logf("%s was behind its plan: sent declaration %d", p.Node, p.Serial)
		default:
			d.logf("%s: declaration %d not sent: %s", p.Node, p.Serial, p.NotSent)
		}
	}
}

// onRevoked gives the embedded broker an account JWT revoking every revoked
// user, which disconnects them.
func (d *daemon) onRevoked(m *nats.Msg) {
	if d.srv == nil {
		d.logf("users were revoked: reload the external broker's account JWT ('mesh-controller broker show --broker URL')")
		return
	}
	trust, err := trustOf(context.Background(), d.ids, d.keys)
	if err == nil {
		err = d.srv.UpdateAccount(trust)
	}
	if err != nil {
		d.logf("revoke users: %v", err)
		return
	}
	d.logf("revoked users disconnected")
}

func envelopeOf(d inventory.Declaration) protocol.Envelope {
	return protocol.Envelope{Declaration: d.Body, Signature: d.Signature, Key: d.Key}
}

func publishDeclaration(nc *nats.Conn, d inventory.Declaration) error {
	b, err := json.Marshal(envelopeOf(d))
	if err != nil {
		return err
	}
	return nc.Publish(protocol.DeclarationInbox(d.Node), b)
}
