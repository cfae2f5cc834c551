package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"mesh-controller/app/protocol"
	"mesh-controller/app/service"
)

// Runner is a joined host at work.
type Runner struct {
	State *State
	// Root is where declarations are applied: a data set's path /var/lib/x
	// becomes <Root>/var/lib/x.
	Root string
	// Heartbeat is the interval between beats.
	Heartbeat time.Duration
	// DataEvery is the interval between data reports (besides after each apply).
	DataEvery time.Duration
	// FactsEvery is how often the host looks at its machine again and
	// reports its facts if they changed (besides on connecting): a
	// listener started or gone is heard within it.
	FactsEvery time.Duration
	// Log receives the host's log (nil discards it); each line carries the
	// node's name.
	Log *slog.Logger
	// Metrics, if set, is where /metrics, /healthz and /readyz are
	// answered (mesh-host run --metrics) until Run returns; Run closes it.
	Metrics net.Listener
	// ModuleUsers runs each module as its own system user, mesh-<module>,
	// when the host runs as root.
	ModuleUsers bool
	// Supervisor, if set, is the one to use (a test shortens its back-off);
	// else one is made with the defaults.
	Supervisor *Supervisor
	// FilterConfirm is how long the host waits to hear the controller
	// after applying a packet filter before it rolls it back
	// (DefaultFilterConfirm if zero).
	FilterConfirm time.Duration
	// NoOverlayInterface has the host write the overlay's configuration
	// and bring no interface up, even where it could: wg-quick or systemd
	// brings mesh0 up from the file on that machine (or a test's hosts
	// share one network namespace, which holds one mesh0).
	NoOverlayInterface bool
	// BeforeTimeout bounds a backup's before hook (DefaultBeforeTimeout
	// if zero).
	BeforeTimeout time.Duration
	// SelfUpgrade lets the host upgrade itself to the host release a
	// declaration names (selfupgrade.go): it replaces its own executable
	// and re-executes it. Only mesh-host run sets it: a host run inside
	// another program refuses such a declaration.
	SelfUpgrade bool

	mu   sync.Mutex
	last applied
	// failed is the newest declaration the host was given that did not
	// apply (0: none since the last that did), under mu: /readyz says so.
	failed int64
	sup    *Supervisor
	// log is Log with the node's name.
	log *slog.Logger
	// nc is the connection to the broker once made: /readyz asks it.
	nc atomic.Pointer[nats.Conn]
	// metrics are moved as things happen; nil without Metrics.
	metrics *hostMetrics
	// beatAgain asks for a beat soon.
	beatAgain func()
	// factsMu guards factsSent, the facts last reported, less what moves
	// all the time (factsCompared).
	factsMu   sync.Mutex
	factsSent []byte
	// ctx is Run's: what the host does beside its loop ends with it.
	ctx context.Context
	// filter is the mesh's packet filter here; confirming ends the
	// confirmation of one waiting to be kept.
	filter     filterState
	confirming context.CancelFunc
	// ov is the overlay here: its interface and what the facts say of it.
	ov overlayState
	// bk is the backups and restores running.
	bk backupWork
	// applies is the declarations' worker's: what waits, what it applies.
	applies applyWork
	// exe is the host's executable; trial the upgrade it is on trial for
	// (its first declaration not yet applied), reverted the one it gave up.
	exe      string
	trial    *upgradeRecord
	reverted *upgradeRecord
	// ups is what the host remembers of its upgrades (prepare.go); the
	// declarations' worker alone reads and writes it once Run began.
	ups upgradesState
}

// DefaultFactsEvery is how often a host looks at its machine again for
// changed facts.
const DefaultFactsEvery = time.Minute

// beatSoon is how soon after a module's state changes the host beats, so
// that several changes at once make one beat.
const beatSoon = 200 * time.Millisecond

// Run beats, reports facts and data, receives, verifies and applies
// declarations (asking for the latest whenever it connects; applied one at
// a time by a worker beside the beats, applying.go), and reports each
// outcome. It reconnects by itself and returns when ctx ends.
func (r *Runner) Run(ctx context.Context) error {
	if r.Heartbeat <= 0 {
		r.Heartbeat = protocol.DefaultHeartbeat
	}
	if r.DataEvery <= 0 {
		r.DataEvery = 5 * time.Minute
	}
	if r.FactsEvery <= 0 {
		r.FactsEvery = DefaultFactsEvery
	}
	r.log = r.logger().With("node", r.State.Node)
	if r.Metrics != nil {
		defer r.Metrics.Close()
	}
	if r.FilterConfirm <= 0 {
		r.FilterConfirm = DefaultFilterConfirm
	}
	r.ctx = ctx
	var handed []HandedModule
	if r.SelfUpgrade {
		var err error
		if r.exe, err = os.Executable(); err != nil {
			return fmt.Errorf("find the host's own executable: %w", err)
		}
		// On a new release not yet heard to work, a start is counted, and
		// one too many goes back to the previous binary (it does not return).
		r.resumeUpgrade()
		handed = takeHandover(r.State.Dir)
	}
	if err := os.MkdirAll(r.Root, 0o755); err != nil {
		return err
	}
	var err error
	if r.last, err = loadApplied(r.State.Dir); err != nil {
		return fmt.Errorf("read %s: %w", fileApplied, err)
	}
	if r.filter, err = loadFilter(r.State.Dir); err != nil {
		return fmt.Errorf("read %s: %w", fileFilter, err)
	}
	// A host joined before the overlay gets its WireGuard key now: its
	// public half is in the first facts it reports.
	if err := r.State.EnsureWireGuardKey(); err != nil {
		return err
	}
	// changed asks for a beat soon: a module's state changed, or the
	// controller answered an ask after a (re)connection.
	changed := make(chan struct{}, 1)
	beatAgain := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	r.sup = r.Supervisor
	if r.sup == nil {
		r.sup = &Supervisor{}
	}
	r.sup.StateDir = r.State.Dir
	r.sup.LogDir = filepath.Join(r.Root, "var", "log", "mesh")
	r.sup.Users = r.ModuleUsers && os.Geteuid() == 0
	r.sup.Logf = r.logf
	r.sup.OnChange = beatAgain
	r.beatAgain = beatAgain
	if r.Metrics != nil {
		// Answered from here on: the modules' states are the supervisor's.
		r.metrics = r.serveMetrics(ctx, r.Metrics)
	}
	// What the host's previous program handed over, re-executing itself,
	// runs on; what a previous life left running otherwise is ended, then
	// what was last declared runs again, before the controller is heard.
	for _, line := range r.sup.Adopt(handed) {
		r.logf("%s", line)
	}
	if r.trial != nil {
		fault("host-upgrade-after-exec")
	}
	for _, line := range r.sup.Sweep() {
		r.logf("left from the last run: %s", line)
	}
	if err := r.loadUpgrades(); err != nil {
		return err
	}
	r.sup.Apply(specs(r.State, r.Root, r.last.Runs))
	// Stopping the host stops its modules: none outlives it.
	defer r.sup.StopAll()
	// The overlay last declared comes up again too: its interface lives
	// in this process, and goes with it.
	r.mu.Lock()
	if err := r.setOverlay(r.last.Overlay, r.last.Serial); err != nil {
		r.warnf("overlay: %v", err)
	}
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.stopOverlay()
		r.mu.Unlock()
	}()
	opts, err := r.State.ConnectOptions()
	if err != nil {
		return err
	}
	started := time.Now()
	envelopes := make(chan delivery, 16)
	connected := make(chan struct{}, 1)
	onConnect := func(*nats.Conn) {
		select {
		case connected <- struct{}{}:
		default:
		}
	}
	nc, err := nats.Connect(strings.Join(r.State.BrokerURLs, ","), append(append(opts, reconnecting()...),
		nats.ConnectHandler(onConnect), nats.ReconnectHandler(onConnect),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				r.warnf("disconnected: %v; reconnecting", err)
				service.Notifier{}.Status(fmt.Sprintf("running as %s, applying under %s; disconnected (%v), reconnecting", r.State.Node, r.Root, err))
			}
		}))...)
	if err != nil {
		return fmt.Errorf("connect to %v: %w", r.State.BrokerURLs, err)
	}
	defer nc.Close()
	r.nc.Store(nc)
	// A filter still waiting to be confirmed when the host last stopped
	// is given a whole window again from now.
	r.mu.Lock()
	if r.filter.State == protocol.FilterWaiting {
		r.startConfirm(nc, r.filter.Serial, time.Now().Add(r.FilterConfirm))
	}
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.endConfirm()
		r.mu.Unlock()
	}()
	if _, err := nc.Subscribe(protocol.DeclarationInbox(r.State.Node), func(m *nats.Msg) {
		var env protocol.Envelope
		if err := json.Unmarshal(m.Data, &env); err != nil {
			r.warnf("a declaration that is not JSON: %v", err)
			return
		}
		// Never blocks past Run: a handler left waiting would leak.
		select {
		case envelopes <- delivery{env: env}:
		case <-ctx.Done():
		}
	}); err != nil {
		return err
	}
	if _, err := nc.Subscribe(protocol.NodeSubject(r.State.Node, protocol.LogsInbox), func(m *nats.Msg) {
		go r.answerLogs(ctx, nc, m)
	}); err != nil {
		return err
	}
	if _, err := nc.Subscribe(protocol.NodeSubject(r.State.Node, protocol.LookInbox), func(m *nats.Msg) {
		go r.answerLook(m)
	}); err != nil {
		return err
	}
	// A rotation of the controller's key is announced here (keys.go).
	if _, err := nc.Subscribe(protocol.NodeSubject(r.State.Node, protocol.KeyInbox), func(m *nats.Msg) {
		go r.onKeyNotice(ctx, nc, m)
	}); err != nil {
		return err
	}
	// The host's broker credential is renewed before it expires (creds.go).
	var renewing sync.WaitGroup
	defer renewing.Wait()
	renewing.Go(func() { r.renewLoop(ctx, nc) })
	// Backups and restores end (their restic stopped with ctx) before
	// the connection they report on closes.
	defer r.waitBackups()
	if err := r.subscribeBackups(nc); err != nil {
		return err
	}

	// Declarations are applied beside this loop, which keeps beating; the
	// worker ends, its apply with it, before what it uses is stopped.
	r.applies.wake = make(chan struct{}, 1)
	var worker sync.WaitGroup
	worker.Go(func() { r.applyLoop(ctx, nc) })
	defer worker.Wait()

	soon := time.NewTimer(time.Hour)
	soon.Stop()
	beat := time.NewTicker(r.Heartbeat)
	defer beat.Stop()
	data := time.NewTicker(r.DataEvery)
	defer data.Stop()
	facts := time.NewTicker(r.FactsEvery)
	defer facts.Stop()
	var asks asking
	defer asks.end()
	// Under systemd (Type=notify): READY=1 once what was last declared
	// runs again and the host listens for declarations, connected or not
	// (a broker away must not fail the start: the modules run on); STATUS=
	// says whether it is connected; the watchdog is pinged from this loop,
	// so a loop that stops turning is restarted.
	var sd service.Notifier
	sd.Ready(fmt.Sprintf("running as %s, applying under %s; connecting to %s", r.State.Node, r.Root, strings.Join(r.State.BrokerURLs, ",")))
	defer sd.Stopping()
	var watchdog <-chan time.Time
	if every := sd.WatchdogEvery(); every > 0 {
		t := time.NewTicker(every)
		defer t.Stop()
		watchdog = t.C
		sd.Alive()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-watchdog:
			sd.Alive()
		case <-connected:
			r.logf("connected to %s", nc.ConnectedUrl())
			sd.Status(fmt.Sprintf("running as %s, applying under %s; connected to %s", r.State.Node, r.Root, nc.ConnectedUrl()))
			r.reportFacts(nc, true)
			// Heard at once, not a heartbeat interval later.
			soon.Reset(beatSoon)
			asks.start(ctx, func(ctx context.Context) { r.askLatest(ctx, nc, envelopes, beatAgain) })
		case dl := <-envelopes:
			r.offer(dl)
		case <-changed:
			soon.Reset(beatSoon)
		case <-soon.C:
			r.beat(nc, started)
		case <-beat.C:
			r.beat(nc, started)
		case <-facts.C:
			r.reportFacts(nc, false)
		case <-data.C:
			r.mu.Lock()
			last := r.last
			r.mu.Unlock()
			r.publish(nc, protocol.DataReport, dataReport(r.Root, last))
		}
	}
}

// states are the supervisor's states of the modules, each with when the
// declaration that started it was issued.
func (r *Runner) states() []protocol.ModuleState {
	r.mu.Lock()
	declared := make(map[string]time.Time, len(r.last.Runs))
	for _, run := range r.last.Runs {
		declared[run.Module] = run.DeclaredAt
	}
	r.mu.Unlock()
	ms := r.sup.States()
	for i := range ms {
		ms[i].DeclaredAt = declared[ms[i].Module]
	}
	return ms
}

// userIDs makes each module's own user when modules run as their own
// users (root, and ModuleUsers), else nil.
func (r *Runner) userIDs() userIDs {
	if !r.sup.Users {
		return nil
	}
	root := r.Root
	return func(module string) (int, int, error) {
		return moduleUser("mesh-"+module, filepath.Join(root, filepath.FromSlash(path.Join(protocol.ModulesDir, module))))
	}
}

// beat sends a heartbeat with the modules' states, the overlay's peers'
// last handshakes and the apply under way.
func (r *Runner) beat(nc *nats.Conn, started time.Time) {
	r.mu.Lock()
	serial := r.last.Serial
	peers := r.peerHandshakes()
	r.mu.Unlock()
	modules, applying := r.states(), r.applies.applying()
	r.publish(nc, protocol.Heartbeat, protocol.HeartbeatBody{At: time.Now().UTC(), IntervalS: r.Heartbeat.Seconds(), HostVersion: Version,
		SerialApplied: serial, UptimeS: int64(time.Since(started).Seconds()), Modules: modules, Peers: peers, Applying: applying,
		ControllerKey: r.State.KeyID()})
	if r.logger().Enabled(r.ctx, slog.LevelDebug) {
		r.logger().Debug("beat sent", "serial_applied", serial, "modules", len(modules), "applying", applying != nil)
	}
}

// logf logs a line of what the host did, at info.
func (r *Runner) logf(format string, args ...any) {
	r.logger().Info(fmt.Sprintf(format, args...))
}

// warnf logs a line of what went wrong, at warn.
func (r *Runner) warnf(format string, args ...any) {
	r.logger().Warn(fmt.Sprintf(format, args...))
}

// discard is the log of a runner given none.
var discard = slog.New(slog.DiscardHandler)

// logger is the host's log: Log with the node's name once Run began, Log
// itself for what is done before (a test's runner), else nowhere.
func (r *Runner) logger() *slog.Logger {
	switch {
	case r.log != nil:
		return r.log
	case r.Log != nil:
		return r.Log
	}
	return discard
}

func (r *Runner) publish(nc *nats.Conn, what string, body any) {
	b, err := protocol.Sign(r.State.HostKey, body)
	if err == nil {
		err = nc.Publish(protocol.NodeSubject(r.State.Node, what), b)
	}
	if err != nil {
		r.warnf("send %s: %v", what, err)
	}
}

// askLatest asks the controller for this node's latest declaration, as a
// host does whenever it (re)connects, until it is answered: what was
// declared while it was away arrives now. answered is told when it is:
// the host beats again then, as the beat it sent on connecting may have
// been lost (the controller's own connection coming back too, after a
// broker server of a cluster was lost).
func (r *Runner) askLatest(ctx context.Context, nc *nats.Conn, envelopes chan<- delivery, answered func()) {
	r.mu.Lock()
	serial := r.last.Serial
	r.mu.Unlock()
	first := true
	env, err := askLatest(ctx, nc, r.State, serial, func(err error) {
		if first {
			r.warnf("ask for the latest declaration: %v; asking again", err)
			first = false
		}
	})
	if err != nil {
		if ctx.Err() == nil {
			r.warnf("ask for the latest declaration: %v", err)
		}
		return
	}
	answered()
	if env == nil {
		return
	}
	select {
	case envelopes <- delivery{env: *env, asked: true}:
	case <-ctx.Done():
	}
}

// delivery is one declaration to apply, and whether this host asked for it
// (on connecting) rather than had it pushed.
type delivery struct {
	env   protocol.Envelope
	asked bool
	// serial is what it verifies as (0 if it does not), once offered.
	serial int64
}

// stale says why a declaration is not applied, or "" if it is to be
// applied (or refused by apply). The answer to the ask made on connecting
// can cross a push of the same declaration, or be overtaken by a newer
// one, while in flight: it then says "nothing newer". A pushed declaration
// can be the one applied already, exactly as signed: a healer re-sending
// it while the report of its apply was on its way. Neither is a replay to
// refuse and report — a failed report would hide the good apply on the
// controller. Anything else goes to apply, which refuses a serial not above
// the last applied and reports it.
func stale(st *State, last applied, dl delivery) string {
	d, err := st.Verify(dl.env)
	if err != nil || d.Node != st.Node || d.Serial > last.Serial {
		return ""
	}
	if d.Serial == last.Serial && last.Signature != "" && dl.env.Signature == last.Signature {
		return fmt.Sprintf("declaration %d again, exactly as applied: nothing to do", d.Serial)
	}
	if !dl.asked {
		return ""
	}
	return fmt.Sprintf("the latest declaration, asked for, is %d; %d is applied already", d.Serial, last.Serial)
}

// BackupDone tells the controller that a backup line was done: what the
// backup module on this host calls when it has copied a data set. The
// controller records it only if this node holds the backup seat.
func BackupDone(ctx context.Context, st *State, line protocol.BackupBody) error {
	opts, err := st.ConnectOptions()
	if err != nil {
		return err
	}
	nc, err := nats.Connect(strings.Join(st.BrokerURLs, ","), append(opts, nats.Timeout(protocol.AnswerTimeout), nats.NoReconnect())...)
	if err != nil {
		return fmt.Errorf("reach the broker: %w", err)
	}
	defer nc.Close()
	b, err := protocol.Sign(st.HostKey, line)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, protocol.AnswerTimeout)
	defer cancel()
	m, err := nc.RequestWithContext(ctx, protocol.NodeSubject(st.Node, protocol.BackupReport), b)
	if err != nil {
		return fmt.Errorf("report the backup: %w (is a controller serving?)", err)
	}
	var reply protocol.OKReply
	if err := json.Unmarshal(m.Data, &reply); err != nil || !reply.OK {
		return fmt.Errorf("%w: %s", ErrBackupRefused, reply.Error)
	}
	return nil
}

// ErrBackupRefused means the controller did not record a backup line.
var ErrBackupRefused = errors.New("the controller did not record the backup")
