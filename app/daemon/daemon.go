// Package daemon is the serving controller: it takes the lease, runs (or
// dials) the broker, absorbs what hosts report, answers their requests, and
// schedules the catch-up, the self-check and the healers. It is the only
// stateful, concurrent code of the controller, and its state is owned by one
// goroutine, the loop: message handlers verify what arrives and hand it over
// as events; nothing else touches the state. The use cases it schedules
// (joining, declaring, judging) are the application's, given as UseCases.
package daemon

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"mesh-controller/app/archive"
	"mesh-controller/app/metrics"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/health"
	"mesh-controller/contexts/identity"
	"mesh-controller/contexts/inventory"
	"mesh-controller/embedded/broker"
	"mesh-controller/embedded/sqlite"
)

// The daemon's intervals and timeouts, named once.
const (
	// DefaultLeaseTTL is how long the lease lasts unrenewed; it is renewed
	// at a third of it. A standby takes over within it (and its poll) of
	// the serving controller's death: the bound is 15 s.
	DefaultLeaseTTL = 10 * time.Second
	// standbyPoll is how often a standby reads the lease, at most.
	standbyPoll = 500 * time.Millisecond
	// DefaultFlushEvery is how often absorbed heartbeats are written.
	DefaultFlushEvery = time.Second
	// DefaultCatchUpEvery is how often nodes behind their plan are declared.
	DefaultCatchUpEvery = 5 * time.Second
	// thoroughEvery is how often the catch-up reads the whole mesh even when
	// no node's plan moved.
	thoroughEvery = time.Minute
	// DefaultCheckEvery is how often the self-check runs.
	DefaultCheckEvery = 30 * time.Second
	// DefaultSweepEvery is how often the archives are swept: once a day.
	DefaultSweepEvery = 24 * time.Hour
	// aggregateEvery is how often heartbeat intervals are added to the
	// hourly aggregates (each write reads and merges a row per node).
	aggregateEvery = time.Minute
	// settle is how long a burst of events that matter may settle before the
	// self-check judges it.
	settle = 100 * time.Millisecond
	// drainTimeout bounds how long a stopping daemon waits for handlers to
	// finish what was delivered.
	drainTimeout = 5 * time.Second
	// brokerTimeout bounds a round trip to the broker (a flush, an answer).
	brokerTimeout = protocol.AnswerTimeout
	// inProcessTimeout bounds one try of the daemon's connection to its
	// embedded broker, and inProcessTries how many are made (a second
	// more between each), while hosts crowd in.
	inProcessTimeout = 10 * time.Second
	inProcessTries   = 6
	// eventQueue is how many events may wait for the loop; past it an event
	// is dropped and counted rather than blocking a message handler. The
	// queue holds pointers: a queue of events themselves (about 250 bytes
	// each) kept 16 MiB whether or not any waited.
	eventQueue = 1 << 16
	// absorbBatch is how many waiting events the loop absorbs in one turn
	// before it looks at its timers again.
	absorbBatch = 4096
)

// Options shape the daemon.
type Options struct {
	// Listen is the embedded broker's address (host:port; port 0 picks one).
	Listen string
	// Broker is an external NATS: its servers' URLs, separated by commas
	// (a cluster's every server); empty starts the embedded broker.
	Broker string
	// BrokerStore is where the embedded broker keeps JetStream's files (the
	// archives bucket); empty leaves JetStream off.
	BrokerStore string
	// DataDir is said in the ready line.
	DataDir string
	// Ready is called once the daemon serves, with where its broker is.
	Ready func(Ready)
	// Standing is called when this controller stands by (only with an
	// external Broker: an embedded one cannot be shared), naming the live
	// lease it waits for, and again whenever its holder changes.
	Standing func(identity.Lease)
	// Newer, if set, says why this controller must never take the lease
	// ("" if it may): a store's schema is newer than it knows, a newer
	// controller having migrated them. A standby asks it before each take,
	// and while it waits; so told, it stands aside (never takes the lease,
	// never writes but its standing aside) and says why, through Aside.
	Newer func(ctx context.Context) (string, error)
	// Aside is called when this controller stands aside, with why.
	Aside func(why string)
	// RaiseFences raises every store's fence to a new lease generation
	// (the identity store's is raised with the lease itself) before this
	// controller serves, so that a deposed one's writes are refused.
	RaiseFences func(ctx context.Context, generation int64) error
	// Log receives the daemon's log (log/slog records); nil discards it.
	Log *slog.Logger
	// Version and Stores are said in the line the daemon logs as it begins
	// serving: the binary's version and where each store is (shown with any
	// password redacted). The version is recorded with the lease, and with
	// this controller standing by, so that others name it.
	Version string
	Stores  []StoreShown
	// LeaseTTL, FlushEvery, CatchUpEvery, CheckEvery: zero means the default.
	LeaseTTL, FlushEvery, CatchUpEvery, CheckEvery time.Duration
	// SweepEvery is how often the sweep runs (zero: DefaultSweepEvery);
	// the first runs a minute after the daemon serves, or sooner if the
	// interval is shorter.
	SweepEvery time.Duration
	// Counters, if set, counts what the daemon absorbed and dropped.
	Counters *Counters
	// Metrics, if set, are moved as things happen (serve --metrics).
	Metrics *metrics.Metrics
	// Healers are when the brake engages; zero means the defaults.
	Healers HealerLimits
	// MemoryLimit is the Go runtime's soft memory limit (0 leaves the
	// runtime's own, or GOMEMLIMIT's): it keeps the garbage collector from
	// letting garbage pile up to twice what is kept. Most of what a large
	// mesh keeps is the broker's, per connection (its client, each user's
	// permissions, two goroutines: about 41 KB a host, measured by app's
	// BenchmarkBrokerConnection); under a limit below what is kept the
	// collector runs without pause.
	MemoryLimit int64
	// Prepare, if set, is called once the lease is held, before serving: the
	// jobs it returns (a backup schedule, say) are run by the loop whenever
	// they are due. It runs under the lease so that a second serve started
	// by mistake touches nothing the holder owns. The jobs log through
	// log, as the daemon does.
	Prepare func(ctx context.Context, log *slog.Logger) ([]Job, error)
}

// Job is work the loop runs when it is due.
type Job struct {
	Name string
	// Due fires when the job is due next; Run sets when that is.
	Due func() <-chan time.Time
	Run func(ctx context.Context)
	// Stop releases the job's timer when the daemon stops.
	Stop func()
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

// Stores are the stores the daemon itself reads and writes.
type Stores struct {
	Inventory *inventory.Store
	Identity  *identity.Store
	Health    *health.Store
}

// Declared is what became of one node's declaration in a catch-up.
type Declared struct {
	Node    string
	Serial  int64
	Sent    bool
	NotSent string
	Problem string
}

// UseCases are the application's acts the daemon schedules, by the part
// of serving each is for: each part is an interface the application
// implements with only the stores it needs. A nil Builds, Backups,
// Archives or DueActs is not served.
type UseCases struct {
	// Now is the clock.
	Now func() time.Time
	// Credentials sign the daemon's own broker users and say what the
	// broker trusts.
	Credentials Credentials
	// Hosts admit hosts and keep them declared and judged.
	Hosts Hosts
	// Builds take builders' outcomes in and dispatch the queue.
	Builds Builds
	// Backups answer the backup seat's holders and the data's hosts.
	Backups Backups
	// Archives serve and sweep the archives hosts run.
	Archives Archives
	// DueActs are the timed healers' acts.
	DueActs DueActs
}

// CatchUpAsk is what a catch-up is asked to do.
type CatchUpAsk struct {
	// Start: the daemon has just taken the lease.
	Start bool
	// Thorough: the whole mesh is read, not only asked whether a plan moved.
	Thorough bool
	// Finish: also finish what an act killed after its commit point left
	// in the other stores (at start and once every thoroughEvery, never
	// for each joining node: it reads every host and licence holder).
	Finish bool
}

// Credentials sign the daemon's broker users and say what the broker trusts.
type Credentials interface {
	// ControllerUser signs a fresh broker user for the daemon's connection
	// to the mesh account.
	ControllerUser(ctx context.Context) (userJWT string, seed []byte, err error)
	// Admitter signs a fresh broker user for the daemon's connection that
	// answers joins, in the admit account.
	Admitter(ctx context.Context) (userJWT string, seed []byte, err error)
	// SystemUser signs a fresh user of the system account for the
	// daemon's connection that pushes account JWTs to an external
	// broker's resolver (asked only with an external broker).
	SystemUser(ctx context.Context) (userJWT string, seed []byte, err error)
	// Trust is what the embedded broker holds, revoked users included.
	Trust(ctx context.Context) (broker.Trust, error)
}

// Hosts admit hosts, keep them declared, and judge the mesh.
type Hosts interface {
	// Join admits hosts presenting tokens, each judged alone; urls are
	// where hosts dial. Each result is what admitting one made, a *Refusal
	// saying why it refused, or another error when it could not decide;
	// out[i] is rs[i]'s.
	Join(ctx context.Context, rs []protocol.JoinRequest, urls []string) (out []JoinResult)
	// CatchUp makes the secrets the mesh makes that can be made now (made
	// counts the nodes they were made for), declares every node whose plan
	// moved past its declaration and, at start, sends nodes the latest
	// declaration they have not applied. It is also what makes the secrets a
	// node joining with something assigned waited for: sealed to it, they
	// could not be made before it joined. Unless thorough, it first asks
	// the store whether any node's plan moved past its declaration, and
	// stops there when none did.
	CatchUp(ctx context.Context, nc *nats.Conn, ask CatchUpAsk) (out []Declared, made int, err error)
	// SelfCheck judges the mesh, logging its raisings and clearings to
	// log. It returns the conditions it left open.
	SelfCheck(ctx context.Context, nc *nats.Conn, holder string, log *slog.Logger) (open []health.Condition, err error)
	// Renew signs node's host a broker user for the nkey it made, expiring
	// as host credentials do: the user JWT as the JWT half of a .creds
	// document. Refused (a *Refusal) for an nkey used before or a node
	// with no host. revoked counts the node's users it revoked (one from
	// before credentials expired): the daemon has the broker told.
	Renew(ctx context.Context, node, nkey string) (creds string, revoked int, err error)
	// RenewGrant is Renew answered as a join grant sealed to the node's
	// age recipient: a renewal asked through the join path.
	RenewGrant(ctx context.Context, node, nkey string, urls []string) (reply protocol.JoinReply, revoked int, err error)
}

// Builds take builders' outcomes in and dispatch the build queue.
type Builds interface {
	// TakeIn records the outcome builder (the node the broker says sent
	// it) reported, and registers what it built; the line says what came
	// of it.
	TakeIn(ctx context.Context, outcome []byte, builder string) (line string, err error)
	// BuildAsked returns nil if build id is in flight on builder node: the
	// builder may hand over its archive (app/archive's Server).
	BuildAsked(ctx context.Context, node, id string) error
	// DispatchBuilds offers waiting asks to builders and expires the late.
	DispatchBuilds(ctx context.Context, nc *nats.Conn) (lines []string, err error)
	// ReAsk asks a dead build again under a new id (the re-ask healer).
	ReAsk(ctx context.Context, id string) error
}

// Backups answer the backup seat's holders and the data's hosts.
type Backups interface {
	// BackupDue asks the data's host to back up a line the holder on
	// holder says is due.
	BackupDue(ctx context.Context, nc *nats.Conn, holder string, due protocol.BackupDue) error
	// BackupAccess keeps a node's access the holder sealed.
	BackupAccess(ctx context.Context, holder string, a protocol.BackupAccessIssued) error
	// BackupDrilled records the holder's restore drill.
	BackupDrilled(ctx context.Context, holder string, o protocol.DrillOutcome) error
	// BackedUp records a host's outcome of a backup or restore.
	BackedUp(ctx context.Context, node string, o protocol.BackupOutcome) error
}

// Archives serve and sweep the archives hosts run.
type Archives interface {
	// ArchiveDeclared says whether node's latest declaration names the
	// archive: the host may read it.
	ArchiveDeclared(ctx context.Context, node, digest string) (bool, error)
	// Connected is told the daemon's connection once it is made (the
	// archives bucket is made there), and how many copies the broker can
	// keep of what it stores: 3 on a JetStream cluster of three servers or
	// more, else 1.
	Connected(ctx context.Context, nc *nats.Conn, replicas int) error
	// Sweep lets go the archives nobody needs and prunes the builds
	// record, every SweepEvery, off the loop; the line says what went.
	Sweep(ctx context.Context, nc *nats.Conn) (line string, err error)
}

// DueActs are the timed healers' acts.
type DueActs interface {
	// Due are the acts due now (a licence to refresh), each done once
	// under the brake, after the self-check.
	Due(ctx context.Context, nc *nats.Conn) ([]Due, error)
}

// BuildKickSubject is where a person's command says an ask is waiting.
const BuildKickSubject = "mesh.control.build"

// DispatchEvery is how often the build queue is looked at without a kick.
const DispatchEvery = 5 * time.Second

// Admitted is what admitting a host made.
type Admitted struct {
	// Reply is the answer: the grant, sealed to the host.
	Reply protocol.JoinReply
	// HostKey is the key the host signs its reports with.
	HostKey ed25519.PublicKey
	// Revoked counts the node's earlier host users the join revoked: the
	// daemon closes their connections.
	Revoked int
	// Again means the host had joined with this request already, and asked
	// again because its answer did not reach it: it is answered again.
	Again bool
}

// JoinResult is what became of one join: what admitting it made, or Err:
// a *Refusal, or another error when it could not be decided.
type JoinResult struct {
	Admitted
	Err error
}

// Refusal is why a join was refused. Reason is a short phrase that stays the
// same for the same cause (it is counted by reason); the asker is told only
// protocol.JoinRefused, whatever the reason, so that no answer tells which
// tokens or node names exist.
type Refusal struct {
	Reason string
	Err    error
}

func (r *Refusal) Error() string { return r.Reason + ": " + r.Err.Error() }

func (r *Refusal) Unwrap() error { return r.Err }

// eventKind says what an event carries.
type eventKind int

const (
	evBeat eventKind = iota
	evDuration
	evDrop
	evKick
	// evJoined is a node that joined with something assigned.
	evJoined
	evRefused
	// evModules is the module states of an apply report.
	evModules
)

// event is what a handler hands the loop.
type event struct {
	kind     eventKind
	node     string
	at       time.Time
	beat     protocol.HeartbeatBody
	duration health.Duration
	reason   string
	// source is where a refused join came from.
	source string
	// modules are the module states an apply report carries.
	modules []protocol.ModuleState
	// hostAt is when, on the host's clock, the states of a beat or an
	// apply report were read (zero: the host did not say).
	hostAt time.Time
}

// daemon is one serving controller, for one term of the lease.
type daemon struct {
	*logger
	st Stores
	u  UseCases
	o  Options
	// bg is the background context of the handlers' writes: it carries the
	// lease generation, so that the stores' fences refuse them once this
	// controller is deposed.
	bg context.Context
	// lost hears, from any write, that the fence refused it.
	lost chan error

	nc *nats.Conn // hosts' reports and requests
	jc *nats.Conn // joins, in the admit account: a flood of them cannot close nc
	// sc is the system account's, which pushes account JWTs to an external
	// broker's resolver; nil with the embedded broker.
	sc *nats.Conn
	// url is where the broker is, as nats.go dials it (a cluster's servers
	// separated by commas), and urls each server's: what hosts are given.
	url  string
	urls []string
	srv  *broker.Server // nil with an external broker
	// archives serves archives to hosts and takes them from builders.
	archives *archive.Server
	// backupSlots bound the backup holder's requests handled at once.
	backupSlots chan struct{}

	keys   hostKeys
	events chan *event
	// buildKick asks the dispatcher for a round.
	buildKick chan struct{}
	joins     chan queued
	// asks are hosts' asks for their latest declaration, waiting for the
	// ask workers.
	asks chan queued
	// thoroughAt is when the catch-up last read the whole mesh.
	thoroughAt time.Time
	// applied are hosts' verified apply reports, waiting for the outcome
	// writer to keep them, many to a transaction.
	applied chan applied
	// facts are hosts' verified facts reports, waiting for the facts
	// writer to keep them, many to a transaction.
	facts chan inventory.FactsReport
	// data are hosts' verified data reports, waiting for the data writer
	// to keep them, many to a transaction.
	data chan dataReport
	// refusalLog is the join worker's.
	refusalLog refusalLog
	// limits are each node's report budgets, used by the handlers.
	limits limiter

	// The loop's own state: never touched by another goroutine.
	beats    map[string]inventory.Beat
	lastBeat map[string]time.Time
	// peers are each node's overlay peers as its heartbeats report them;
	// peerFlips, those turning silent or heard, waiting for the flush.
	peers     map[string]map[string]*peerState
	peerFlips []inventory.PeerFlip
	// peerBeat numbers the heartbeats absorbPeers judged.
	peerBeat  uint64
	intervals map[health.HourKey]health.Histogram
	durations []health.Duration
	drops     map[[2]string]int64
	refusals  map[[2]string]int64 // source, reason
	problems  map[string]string
	// moduleStates is what was last written of each node's module states
	// (a digest), so a heartbeat that says nothing new writes nothing;
	// modulesDue are the nodes' states to write at the next flush.
	moduleStates map[string]string
	// statesAt is, per node, when on its host's clock the module states
	// last absorbed were read: apply reports are kept by a writer of
	// their own, and one handed over after a later beat is older news.
	statesAt   map[string]time.Time
	modulesDue map[string][]health.ModuleState
	// readyFor is, per node/module, the serial whose start was measured,
	// and lastState the state last heard.
	readyFor  map[string]int64
	lastState map[string]string
	// ks is the signing key and what hosts said of it.
	ks keyState
}

// Run serves until ctx ends, then stops the broker and gives the lease back.
// With an external broker a controller that finds the lease held stands
// by instead of failing, and takes over when the lease lapses; one that
// loses the lease (paused past it, say) stops writing, says why, and
// stands by again.
func Run(ctx context.Context, st Stores, u UseCases, o Options) (err error) {
	defer func() {
		// Stopped while starting: a clean stop, not a failure.
		if err != nil && ctx.Err() != nil && !errors.Is(err, identity.ErrLeaseHeld) {
			err = nil
		}
	}()
	if o.LeaseTTL == 0 {
		o.LeaseTTL = DefaultLeaseTTL
	}
	if o.FlushEvery == 0 {
		o.FlushEvery = DefaultFlushEvery
	}
	if o.CatchUpEvery == 0 {
		o.CatchUpEvery = DefaultCatchUpEvery
	}
	if o.SweepEvery == 0 {
		o.SweepEvery = DefaultSweepEvery
	}
	if o.CheckEvery == 0 {
		o.CheckEvery = DefaultCheckEvery
	}
	if o.Healers == (HealerLimits{}) {
		o.Healers = DefaultHealerLimits()
	}
	if o.MemoryLimit > 0 && os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(o.MemoryLimit)
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Counters == nil {
		o.Counters = &Counters{}
	}
	lg := &logger{log: o.Log}
	for {
		// Each term of the lease has its own holder id.
		holder := randomID()
		if o.Broker != "" {
			if err := standBy(ctx, st.Identity, u.Now, o, holder, lg); err != nil {
				return err
			}
		}
		err := serve(ctx, st, u, o, holder, lg)
		if o.Broker == "" || ctx.Err() != nil {
			o.Metrics.NotServing("stopping")
			return err
		}
		switch {
		case errors.Is(err, identity.ErrLeaseHeld):
			// Taken by another in the moment since the lease was read.
		case errors.Is(err, identity.ErrLeaseLost):
			o.Metrics.NotServing("deposed: another controller took the lease; standing by")
			lg.log.Warn("deposed: this controller stopped writing and stands by", "err", err)
		default:
			o.Metrics.NotServing("stopped: " + err.Error())
			return err
		}
	}
}

// ShownVersion is a build version as a controller says it: "development
// build" for one stamped with none.
func ShownVersion(v string) string {
	if v == "" {
		return "development build"
	}
	return v
}

// StandBy waits, as a controller standing by does, until no live lease is
// held: what a controller does before it may migrate stores an older one
// serves. It returns nil when the lease may be taken, ctx's error when ctx
// ends first.
func StandBy(ctx context.Context, ids *identity.Store, now func() time.Time, o Options) error {
	if o.LeaseTTL == 0 {
		o.LeaseTTL = DefaultLeaseTTL
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return standBy(ctx, ids, now, o, randomID(), &logger{log: o.Log})
}

// standBy waits until no live lease is held, reading it every standbyPoll;
// meanwhile it keeps this controller recorded as standing by. It returns
// nil when the lease may be taken, ctx's error when ctx ends first. While
// the stores are newer than this controller knows (o.Newer) it never
// returns nil: it stands aside, and says why.
func standBy(ctx context.Context, ids *identity.Store, now func() time.Time, o Options, holder string, lg *logger) error {
	hostname, _ := os.Hostname()
	since := now()
	var waited identity.Lease
	var heard time.Time
	aside := ""
	// newer asks o.Newer, saying when this controller begins (or ends)
	// standing aside.
	newer := func() string {
		if o.Newer == nil {
			return ""
		}
		why, err := o.Newer(ctx)
		if err != nil {
			if ctx.Err() == nil {
				lg.log.Error("standby: compare the stores' schemas with this binary's", "err", err)
			}
			// Not known: not taken, until it is.
			return "the stores' schemas could not be read: " + err.Error()
		}
		if why != aside {
			if why != "" {
				lg.log.Warn("standing aside: "+why, "version", ShownVersion(o.Version))
				if o.Aside != nil {
					o.Aside(why)
				}
			} else {
				lg.log.Info("standing by again: the stores' schemas are this binary's")
			}
			aside = why
		}
		return why
	}
	defer func() {
		if err := ids.LeaveStandby(context.Background(), holder, now()); err != nil {
			lg.log.Error("standby: forget this controller as standing by", "err", err)
		}
	}()
	poll := time.NewTicker(min(standbyPoll, o.LeaseTTL/4))
	defer poll.Stop()
	for {
		t := now()
		l, err := ids.Lease(ctx)
		if err != nil && ctx.Err() == nil {
			lg.log.Error("standby: read the lease", "err", err)
		}
		if err == nil {
			free := l == nil || !l.ExpiresAt.After(t)
			if free && newer() == "" {
				return nil
			}
			// Said before the Standing line, so that /readyz says so by then.
			switch {
			case aside != "":
				o.Metrics.NotServing("standing aside: " + aside)
			case !free:
				o.Metrics.NotServing(fmt.Sprintf("standing by: another controller serves (lease generation %d) until %s; this one takes over when that lease lapses",
					l.Generation, l.ExpiresAt.UTC().Format(time.RFC3339)))
			}
			if l != nil && l.Holder != waited.Holder && !free {
				waited = *l
				lg.log.Info("standing by", "serving_pid", l.PID, "serving_host", l.Host, "serving_version", l.Shown(), "generation", l.Generation, "until", l.ExpiresAt.UTC().Format(time.RFC3339))
				if o.Standing != nil {
					o.Standing(*l)
				}
			}
			if t.Sub(heard) >= o.LeaseTTL/3 {
				sb := identity.Standby{Holder: holder, PID: os.Getpid(), Host: hostname, Since: since, ExpiresAt: t.Add(o.LeaseTTL),
					Version: ShownVersion(o.Version), Aside: newer()}
				if err := ids.StandBy(ctx, sb); err != nil && ctx.Err() == nil {
					lg.log.Error("standby: record this controller as standing by", "err", err)
				} else {
					heard = t
				}
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-poll.C:
		}
	}
}

// serve is one term of the lease: it takes the lease (a new generation),
// raises every store's fence to it, and serves until ctx ends or the lease
// is lost.
func serve(ctx context.Context, st Stores, u UseCases, o Options, holder string, lg *logger) (err error) {
	hostname, _ := os.Hostname()
	now := u.Now()
	lease, err := st.Identity.TakeLease(ctx, identity.Lease{Holder: holder, PID: os.Getpid(), Host: hostname, ExpiresAt: now.Add(o.LeaseTTL),
		Version: ShownVersion(o.Version)}, now)
	if err != nil {
		return err
	}
	defer func() {
		// Given back on exit, so the next controller starts at once.
		if rerr := st.Identity.ReleaseLease(context.Background(), holder); rerr != nil && err == nil {
			err = fmt.Errorf("give the lease back: %w", rerr)
		}
	}()
	if o.RaiseFences != nil {
		if err := o.RaiseFences(ctx, lease.Generation); err != nil {
			return fmt.Errorf("raise the stores' fences to generation %d: %w", lease.Generation, err)
		}
	}
	// From here every write the daemon makes carries its generation; the
	// term ends, its workers with it, when ctx ends or the lease is lost.
	ctx, end := context.WithCancel(sqlite.WithFence(ctx, lease.Generation))
	defer end()
	d := &daemon{logger: lg, st: st, u: u, o: o, bg: sqlite.WithFence(context.Background(), lease.Generation), lost: make(chan error, 1),
		keys: hostKeys{m: map[string]ed25519.PublicKey{}, protocols: map[string]string{}}, events: make(chan *event, eventQueue), joins: make(chan queued, joinQueue),
		asks:      make(chan queued, askQueue),
		applied:   make(chan applied, appliedQueue),
		facts:     make(chan inventory.FactsReport, factsQueue),
		data:      make(chan dataReport, dataQueue),
		buildKick: make(chan struct{}, 1),
		limits:    limiter{buckets: map[[2]string]*bucket{}},
		beats:     map[string]inventory.Beat{}, lastBeat: map[string]time.Time{}, peers: map[string]map[string]*peerState{}, intervals: map[health.HourKey]health.Histogram{},
		drops: map[[2]string]int64{}, refusals: map[[2]string]int64{}, problems: map[string]string{},
		moduleStates: map[string]string{}, statesAt: map[string]time.Time{}, modulesDue: map[string][]health.ModuleState{}, readyFor: map[string]int64{}, lastState: map[string]string{}}

	var jobs []Job
	if o.Prepare != nil {
		if jobs, err = o.Prepare(ctx, d.log); err != nil {
			return err
		}
		defer func() {
			for _, j := range jobs {
				j.Stop()
			}
		}()
	}
	stop, err := d.connect(ctx)
	if err != nil {
		return err
	}
	defer stop()

	if err := d.loadHostKeys(ctx); err != nil {
		return err
	}
	if err := d.loadSilentPeers(ctx); err != nil {
		return err
	}
	if err := d.loadKeys(ctx); err != nil {
		return err
	}
	if err := d.subscribe(ctx); err != nil {
		return err
	}
	if err := st.Identity.RenewLease(ctx, holder, u.Now().Add(o.LeaseTTL), d.url); err != nil {
		return fmt.Errorf("renew the lease: %w", err)
	}
	// The join worker and the ask workers answer until ctx ends; the loop
	// waits for them as it stops.
	joinsDone := make(chan struct{})
	var workers sync.WaitGroup
	workers.Go(func() { d.joinWorker(ctx) })
	for range askWorkers {
		workers.Go(func() { d.askWorker(ctx) })
	}
	workers.Go(func() { d.outcomeWriter(ctx) })
	workers.Go(func() { d.factsWriter(ctx) })
	workers.Go(func() { d.dataWriter(ctx) })
	go func() {
		workers.Wait()
		close(joinsDone)
	}()
	if u.Builds != nil {
		dctx, stopDispatch := context.WithCancel(ctx)
		dispatched := make(chan struct{})
		go func() {
			defer close(dispatched)
			d.dispatcher(dctx)
		}()
		defer func() { stopDispatch(); <-dispatched }()
	}
	d.catchUp(ctx, true, "")
	d.logServing(lease.Generation)
	o.Metrics.Serving()
	if o.Ready != nil {
		o.Ready(Ready{BrokerURL: d.url, DataDir: o.DataDir})
	}
	return d.loop(ctx, end, holder, joinsDone, jobs)
}

// connect starts the embedded broker (or dials the external one) and makes
// the daemon's two connections; stop undoes it.
func (d *daemon) connect(ctx context.Context) (stop func(), err error) {
	var undo []func()
	stop = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	var inProcess nats.Option
	if d.o.Broker == "" {
		trust, err := d.u.Credentials.Trust(ctx)
		if err != nil {
			return stop, err
		}
		srv, err := broker.StartWith(broker.Config{Listen: d.o.Listen, Trust: trust, StoreDir: d.o.BrokerStore})
		if err != nil {
			return stop, err
		}
		undo = append(undo, srv.Shutdown)
		d.srv, d.url, d.urls = srv, srv.ClientURL(), []string{srv.ClientURL()}
		d.o.Metrics.BrokerClients(srv.NumClients)
		inProcess = srv.InProcess()
	} else {
		d.urls = SplitURLs(d.o.Broker)
		d.url = strings.Join(d.urls, ",")
	}
	dial := func(name string, user func(context.Context) (string, []byte, error)) (*nats.Conn, error) {
		userJWT, seed, err := user(ctx)
		if err != nil {
			return nil, err
		}
		opts := []nats.Option{nats.UserJWTAndSeed(userJWT, string(seed)), nats.Name(name), nats.MaxReconnects(-1),
			nats.DrainTimeout(drainTimeout),
			nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
				subject := ""
				if sub != nil {
					subject = sub.Subject
				}
				d.log.Warn("broker: asynchronous error", "connection", name, "subject", subject, "err", err)
			}),
			// Said, so that a broker server lost (one of a cluster's) shows
			// in the log with where the connection went on.
			nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
				if err != nil { // nil: closed by the daemon as it stops
					d.log.Warn("broker: connection lost", "connection", name, "err", err)
				}
			}),
			nats.ReconnectHandler(func(nc *nats.Conn) {
				d.log.Info("broker: connected again", "connection", name, "url", nc.ConnectedUrlRedacted())
			})}
		if inProcess == nil {
			// nats.go dials the servers of a list in turn until one
			// answers, and fails over to the others when it is lost.
			nc, err := nats.Connect(d.url, opts...)
			if err != nil {
				return nil, fmt.Errorf("%w at %s: %v", ErrBrokerUnreachable, d.url, err)
			}
			return nc, nil
		}
		// The embedded broker is up, but ten thousand hosts coming back
		// the moment it listens can keep it from taking this connection
		// within its handshake's time: it is tried again, patiently.
		opts = append(opts, inProcess, nats.Timeout(inProcessTimeout))
		for attempt := 1; ; attempt++ {
			nc, err := nats.Connect(d.url, opts...)
			if err == nil {
				return nc, nil
			}
			if attempt == inProcessTries || ctx.Err() != nil {
				return nil, fmt.Errorf("%w at %s: %v", ErrBrokerUnreachable, d.url, err)
			}
			d.log.Warn("connect to the embedded broker: trying again", "connection", name, "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(attempt) * time.Second):
			}
		}
	}
	if d.nc, err = dial("mesh-controller", d.u.Credentials.ControllerUser); err != nil {
		return stop, err
	}
	undo = append(undo, d.nc.Close)
	if d.jc, err = dial("mesh-controller joins", d.u.Credentials.Admitter); err != nil {
		return stop, err
	}
	undo = append(undo, d.jc.Close)
	replicas, jetStream := 1, d.srv != nil
	if d.srv == nil {
		if d.sc, err = dial("mesh-controller system", d.u.Credentials.SystemUser); err != nil {
			return stop, err
		}
		undo = append(undo, d.sc.Close)
		// Revocations recorded while no controller served reach the
		// broker now.
		d.pushAccount("serve started")
		n, err := broker.JetStreamClusterSize(d.sc, brokerTimeout)
		if err != nil {
			d.log.Warn("ask the broker's servers about JetStream", "err", err)
		}
		if n >= 3 {
			replicas = 3
		}
		jetStream = n > 0
	}
	if d.u.Archives != nil {
		if err := d.u.Archives.Connected(ctx, d.nc, replicas); err != nil {
			if d.o.Broker == "" {
				return stop, err
			}
			// An external broker may have no JetStream: builds cannot
			// store archives there, and the rest of the mesh serves.
			d.log.Warn("the broker's JetStream", "err", err)
			if jetStream {
				// A cluster choosing its leader, or one server of three
				// away (three copies need three servers): tried again
				// until it can be done.
				go d.connectedLater(ctx, replicas)
			}
		} else if d.srv == nil && jetStream && replicas < 3 {
			// A cluster that answered as fewer than three servers (one
			// whose meta group was still settling, asked under load, or
			// one grown since): its bucket gets three copies once it
			// says it has three servers.
			go d.copiesLater(ctx)
		}
	}
	return stop, nil
}

// copiesEvery is how often an external broker whose archives bucket has
// fewer than three copies is asked how many JetStream servers it has.
const copiesEvery = 10 * time.Second

// copiesLater asks the broker's servers every copiesEvery how many there
// are and, once three or more, gives the archives bucket three copies; it
// returns then or when ctx ends.
func (d *daemon) copiesLater(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(copiesEvery):
		}
		if n, err := broker.JetStreamClusterSize(d.sc, brokerTimeout); err != nil || n < 3 {
			continue
		}
		if err := d.u.Archives.Connected(ctx, d.nc, 3); err == nil {
			d.logf("the broker has three JetStream servers: the archives bucket keeps three copies")
			return
		} else if ctx.Err() == nil {
			d.log.Warn("give the archives bucket three copies", "err", err)
		}
	}
}

// connectedRetry is how often Connected is tried again on an external
// broker's JetStream until it succeeds.
const connectedRetry = 2 * time.Second

// connectedLater tries Connected again until it succeeds or ctx ends.
func (d *daemon) connectedLater(ctx context.Context, replicas int) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(connectedRetry):
		}
		if err := d.u.Archives.Connected(ctx, d.nc, replicas); err == nil {
			d.logf("the broker's JetStream answers: the archives bucket is ready")
			return
		} else if ctx.Err() != nil {
			return
		}
	}
}

// SplitURLs is each URL of a comma-separated list, spaces trimmed and
// empty ones dropped.
func SplitURLs(list string) []string {
	var urls []string
	for u := range strings.SplitSeq(list, ",") {
		if u = strings.TrimSpace(u); u != "" {
			urls = append(urls, u)
		}
	}
	return urls
}

// ErrBrokerUnreachable means no broker answered.
var ErrBrokerUnreachable = errors.New("the broker cannot be reached")

// loop owns the daemon's state until ctx ends or the lease is lost; end
// ends the term's context, so that a deposed controller's workers stop.
func (d *daemon) loop(ctx context.Context, end context.CancelFunc, holder string, joinsDone <-chan struct{}, jobs []Job) error {
	o := d.o
	flush := time.NewTicker(o.FlushEvery)
	defer flush.Stop()
	aggregate := time.NewTicker(aggregateEvery)
	defer aggregate.Stop()
	// The lease is renewed beside the loop, not by it: a loop busy for
	// seconds (a catch-up or a self-check at 10,000 nodes) must not let the
	// lease lapse under a controller that serves, nor let a standby take
	// over from it.
	renewCtx, stopRenew := context.WithCancel(ctx)
	defer stopRenew()
	renewFailed := make(chan error, 1)
	go d.renew(renewCtx, holder, renewFailed)
	catchUp := time.NewTicker(o.CatchUpEvery)
	defer catchUp.Stop()
	check := time.NewTicker(o.CheckEvery)
	defer check.Stop()
	// A kick starts the settle timer; it fires once the burst has settled.
	settled := time.NewTimer(settle)
	settled.Stop()
	settling := false
	// Each job's due time is forwarded to the loop, which runs the job.
	due := make(chan int, len(jobs))
	for i, j := range jobs {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-j.Due():
					select {
					case due <- i:
					case <-ctx.Done():
						return
					}
				}
			}
		}()
	}

	d.selfCheck(ctx, holder)
	for {
		select {
		case <-ctx.Done():
			d.stop(joinsDone, false)
			return nil
		case err := <-d.lost:
			end()
			d.stop(joinsDone, true)
			return err
		case ev := <-d.events:
			if d.absorbWaiting(ctx, ev) && !settling {
				settling = true
				settled.Reset(settle)
			}
		case <-settled.C:
			settling = false
			// Flushed on the handlers' context, not the loop's: a stop
			// arriving mid-write would cancel it and lose the batch
			// taken (logged as "context canceled" at each stop under load).
			d.flush(d.bg)
			d.selfCheck(ctx, holder)
		case <-flush.C:
			d.flush(d.bg)
		case <-aggregate.C:
			d.aggregate(d.bg)
		case <-catchUp.C:
			d.catchUp(ctx, false, "")
		case <-check.C:
			// The check judges the heartbeats absorbed so far, not those of
			// the last flush.
			d.flush(d.bg)
			d.selfCheck(ctx, holder)
		case i := <-due:
			jobs[i].Run(ctx)
		case err := <-renewFailed:
			return err
		}
	}
}

// absorbWaiting absorbs ev and then the events already waiting behind it,
// up to absorbBatch, and says whether any of them matters. One event a turn
// would let work that is always due starve the queue: a self-check slower
// than its period (a large mesh, a slow disk) is picked as often as the
// events, and heartbeats wait behind it until their nodes look silent.
func (d *daemon) absorbWaiting(ctx context.Context, ev *event) bool {
	matters := d.absorb(ctx, *ev)
	for range absorbBatch - 1 {
		select {
		case ev := <-d.events:
			matters = d.absorb(ctx, *ev) || matters
		default:
			return matters
		}
	}
	return matters
}

// renew renews the lease every third of its length until ctx ends; a lease
// taken over deposes this controller (d.lost), any other failure is sent on
// failed, which ends serve.
func (d *daemon) renew(ctx context.Context, holder string, failed chan<- error) {
	every := d.o.LeaseTTL / 3
	// held is until when the lease is ours for sure: renewed at start.
	held := d.u.Now().Add(d.o.LeaseTTL)
	t := time.NewTimer(every)
	defer t.Stop()
	said := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := d.u.Now()
		err := d.st.Identity.RenewLease(ctx, holder, now.Add(d.o.LeaseTTL), d.url)
		switch {
		case err == nil:
			held, said = now.Add(d.o.LeaseTTL), false
			t.Reset(every)
			continue
		case ctx.Err() != nil:
			return
		}
		err = fmt.Errorf("renew the lease: %w", err)
		if d.deposed(err) {
			return
		}
		// A store that cannot answer for a moment (PostgreSQL starting
		// again) does not end the term: tried again while the lease still
		// holds, which no other controller can take before it expires.
		if retry := every / 5; now.Add(2 * retry).Before(held) {
			if !said {
				d.log.Warn("renew the lease: tried again while it holds", "err", err, "held_until", held)
				said = true
			}
			t.Reset(retry)
			continue
		}
		failed <- err
		return
	}
}

// stop lets the handlers finish what was already delivered (the clients'
// drain, bounded by drainTimeout), absorbs what they handed over, and
// writes it all; a deposed controller writes nothing, the fences would
// refuse it.
func (d *daemon) stop(joinsDone <-chan struct{}, deposed bool) {
	ctx := d.bg
	for _, nc := range []*nats.Conn{d.jc, d.nc} {
		closed := make(chan struct{})
		nc.SetClosedHandler(func(*nats.Conn) { close(closed) })
		if err := nc.Drain(); err != nil {
			nc.Close()
		}
		select {
		case <-closed:
		case <-time.After(drainTimeout + time.Second):
			d.logf("stopping: the broker connection did not drain within %s", drainTimeout)
		}
	}
	<-joinsDone
	for {
		select {
		case ev := <-d.events:
			d.absorb(ctx, *ev)
			continue
		default:
		}
		break
	}
	if deposed {
		d.logf("stopped serving: deposed")
		return
	}
	// The data reports the writer had not taken, and those the handlers
	// queued as the connections drained.
	for len(d.data) > 0 {
		batch := make([]dataReport, 0, min(len(d.data), dataBatch))
		for len(batch) < cap(batch) {
			batch = append(batch, <-d.data)
		}
		d.keepData(ctx, batch)
	}
	d.flush(ctx)
	d.aggregate(ctx)
	d.logf("stopped: lease given back")
}

// absorb takes one event into the loop's state; it says whether the event
// matters enough for a self-check soon.
func (d *daemon) absorb(ctx context.Context, ev event) bool {
	switch ev.kind {
	case evBeat:
		if d.log.Enabled(ctx, slog.LevelDebug) {
			d.log.Debug("heartbeat absorbed", "node", ev.node, "serial_applied", ev.beat.SerialApplied, "modules", len(ev.beat.Modules), "applying", ev.beat.Applying != nil)
		}
		d.beats[ev.node] = inventory.Beat{Node: ev.node, HeardAt: ev.at, IntervalS: ev.beat.IntervalS, SerialApplied: ev.beat.SerialApplied, UptimeS: ev.beat.UptimeS,
			Applying: applying(ev.beat.Applying), HostVersion: hostVersion(ev.beat.HostVersion)}
		if last, ok := d.lastBeat[ev.node]; ok {
			k := health.HourKey{Node: ev.node, Hour: ev.at.UTC().Truncate(time.Hour)}
			h := d.intervals[k]
			h.Add(float64(ev.at.Sub(last).Microseconds()) / 1000)
			d.intervals[k] = h
		}
		d.lastBeat[ev.node] = ev.at
		d.absorbKey(ev.node, ev.beat.ControllerKey, ev.at)
		d.absorbPeers(ev.node, ev.at, ev.beat.Peers)
		return d.absorbModules(ctx, ev.node, ev.at, ev.beat.At, false, ev.beat.Modules)
	case evModules:
		return d.absorbModules(ctx, ev.node, ev.at, ev.hostAt, true, ev.modules)
	case evDuration:
		d.durations = append(d.durations, ev.duration)
	case evDrop:
		d.drops[[2]string{ev.node, ev.reason}]++
		return true
	case evKick:
		return true
	case evRefused:
		// Counted, not judged at once: a flood of refusals must not make the
		// loop run the self-check back to back. The next periodic check
		// raises join.refused.
		d.refusals[[2]string{ev.source, ev.reason}]++
	case evJoined:
		d.catchUp(ctx, false, ev.node)
	}
	return false
}

// applying is what a beat says of the apply under way, its phase bounded
// as every text a host reports.
func applying(a *protocol.Applying) *inventory.Applying {
	if a == nil {
		return nil
	}
	return &inventory.Applying{Serial: a.Serial, Since: a.Since, Phase: clip(a.Phase)}
}

// hostVersion is the version a beat says its host runs, "" (the one
// recorded stands) when it says none or none a host version can be.
func hostVersion(v string) string {
	if !protocol.ValidHostVersion(v) {
		return ""
	}
	return v
}

// handOver gives the loop an event without ever blocking a handler: past the
// queue's bound the event is dropped and counted.
func (d *daemon) handOver(ev event) {
	select {
	case d.events <- &ev:
	default:
		d.o.Counters.Dropped.Add(1)
		d.o.Metrics.Drop("events queue full")
	}
}

// kick asks for a self-check soon.
func (d *daemon) kick() { d.handOver(event{kind: evKick}) }

// logger writes the daemon's log through log/slog: a record a line, its
// subject (node, module, condition key…) as attributes.
type logger struct {
	log *slog.Logger
}

// logf logs a line of prose at level info, for what has no subject to
// give as attributes.
func (l *logger) logf(format string, args ...any) { l.log.Info(fmt.Sprintf(format, args...)) }

// deposed tells the loop, if err is a store's fence refusing a write, that
// this controller lost the lease: it stops serving (and writing) at once.
// It says whether err was that.
func (d *daemon) deposed(err error) bool {
	if !errors.Is(err, identity.ErrLeaseLost) {
		return false
	}
	select {
	case d.lost <- err:
	default:
	}
	return true
}

// flush writes the absorbed heartbeats in one transaction, and the
// durations and drop counts.
func (d *daemon) flush(ctx context.Context) {
	if len(d.beats) > 0 {
		batch := make([]inventory.Beat, 0, len(d.beats))
		for _, b := range d.beats {
			batch = append(batch, b)
		}
		d.beats = make(map[string]inventory.Beat, len(batch))
		if err := d.st.Inventory.RecordBeats(ctx, batch); err != nil {
			d.deposed(err)
			d.log.Error("record heartbeats", "count", len(batch), "err", err)
		}
	}
	d.flushPeers(ctx)
	d.flushKeys(ctx)
	if len(d.modulesDue) > 0 {
		if err := d.st.Health.RecordModuleStates(ctx, d.modulesDue); err != nil {
			d.deposed(err)
			d.log.Error("record module states", "nodes", len(d.modulesDue), "err", err)
			for node := range d.modulesDue {
				delete(d.moduleStates, node) // written again with the next report
			}
		}
		d.modulesDue = map[string][]health.ModuleState{}
	}
	if len(d.durations) > 0 {
		if err := d.st.Health.RecordDurations(ctx, d.durations); err != nil {
			d.deposed(err)
			d.log.Error("record durations", "count", len(d.durations), "err", err)
		}
		d.durations = nil
	}
	now := d.u.Now()
	for k, n := range d.drops {
		if err := d.st.Health.CountDrops(ctx, k[0], k[1], n, now); err != nil {
			d.deposed(err)
			d.log.Error("count messages dropped", "node", k[0], "err", err)
		}
	}
	clear(d.drops)
	for k, n := range d.refusals {
		if err := d.st.Health.CountJoinRefusals(ctx, k[0], k[1], n, now); err != nil {
			d.deposed(err)
			d.log.Error("count joins refused", "source", k[0], "err", err)
		}
	}
	clear(d.refusals)
}

// aggregate adds the heartbeat intervals measured since the last time to
// each node's hourly aggregate.
func (d *daemon) aggregate(ctx context.Context) {
	if len(d.intervals) == 0 {
		return
	}
	if err := d.st.Health.RecordHeartbeats(ctx, d.intervals); err != nil {
		d.deposed(err)
		d.log.Error("record heartbeat intervals", "count", len(d.intervals), "err", err)
		return
	}
	d.intervals = map[health.HourKey]health.Histogram{}
}

// catchUp declares nodes behind their plan, saying each plan problem once.
// joined is the node whose joining asked for it, if one did: the secrets
// made are said as made for it.
func (d *daemon) catchUp(ctx context.Context, start bool, joined string) {
	// Reading the whole mesh every few seconds to find nothing to do cost
	// an eighth of the controller's CPU at 10,000 nodes: a node's plan that
	// moved is found by one query, and the whole mesh is read at start, for
	// a node that joined, and once every thoroughEvery, for what an act
	// stopped between stores may have left unmade.
	periodic := time.Since(d.thoroughAt) >= thoroughEvery
	thorough := start || joined != "" || periodic
	if thorough {
		d.thoroughAt = time.Now()
	}
	out, made, err := d.u.Hosts.CatchUp(ctx, d.nc, CatchUpAsk{Start: start, Thorough: thorough, Finish: start || periodic})
	if joined != "" && made > 0 {
		d.log.Info("secrets made and sealed", "node", joined, "count", made)
	}
	if err != nil {
		d.deposed(err)
		if ctx.Err() == nil {
			d.log.Error("catch up", "err", err)
		}
		return
	}
	for _, p := range out {
		switch {
		case p.Problem != "":
			if d.problems[p.Node] != p.Problem {
				d.problems[p.Node] = p.Problem
				d.log.Warn("not declared: "+p.Problem, "node", p.Node)
			}
		case p.Sent:
			d.o.Metrics.Declared(1)
			delete(d.problems, p.Node)
			d.log.Info("behind its plan: declaration sent", "node", p.Node, "serial", p.Serial)
		default:
			d.log.Warn("declaration not sent", "node", p.Node, "serial", p.Serial, "why", p.NotSent)
		}
	}
}

// selfCheck judges the mesh, then lets the healers act on what it left open.
func (d *daemon) selfCheck(ctx context.Context, holder string) {
	open, err := d.u.Hosts.SelfCheck(ctx, d.nc, holder, d.log)
	if err != nil {
		d.deposed(err)
		if ctx.Err() == nil {
			d.log.Error("self-check", "err", err)
		}
		// A check that failed may not have read what is open: the healers
		// act on it all the same, read here.
		if open, err = d.st.Health.Conditions(ctx); err != nil {
			if ctx.Err() == nil {
				d.log.Error("healers: read the open conditions", "err", err)
			}
			return
		}
	}
	if err := d.heal(ctx, open); err != nil && ctx.Err() == nil && !d.deposed(err) {
		d.log.Error("healers", "err", err)
	}
}

func randomID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// hostKeys are the keys hosts joined with, read by every handler and written
// on join: the one piece of the daemon's state shared across goroutines,
// behind its own lock.
type hostKeys struct {
	mu sync.RWMutex
	m  map[string]ed25519.PublicKey
	// protocols are what each host was last recorded speaking.
	protocols map[string]string
}

// heard notes that node's host speaks spoken, and says whether that is
// news (to record).
func (k *hostKeys) heard(node, spoken string) bool {
	k.mu.RLock()
	same := k.protocols[node] == spoken
	k.mu.RUnlock()
	if same {
		return false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.protocols[node] == spoken {
		return false
	}
	k.protocols[node] = spoken
	return true
}

func (k *hostKeys) get(node string) ed25519.PublicKey {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.m[node]
}

// nodes are the nodes whose hosts joined.
func (k *hostKeys) nodes() []string {
	k.mu.RLock()
	defer k.mu.RUnlock()
	out := make([]string, 0, len(k.m))
	for node := range k.m {
		out = append(out, node)
	}
	return out
}

func (k *hostKeys) set(node string, key ed25519.PublicKey) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.m[node] = key
}

func (d *daemon) loadHostKeys(ctx context.Context) error {
	hosts, err := d.st.Identity.Hosts(ctx)
	if err != nil {
		return err
	}
	for _, h := range hosts {
		d.keys.set(h.Node, h.HostKey)
		d.keys.heard(h.Node, h.Protocol)
	}
	return nil
}

// respond answers a request, as JSON.
func (d *daemon) respond(m *nats.Msg, v any) {
	if m.Reply == "" {
		return
	}
	b, err := json.Marshal(protocol.Stamped(v))
	if err == nil {
		err = m.Respond(b)
	}
	if err != nil {
		d.log.Warn("answer", "subject", m.Subject, "err", err)
	}
}
