package app

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"filippo.io/age"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"mesh-controller/app/alerthook"
	"mesh-controller/app/archive"
	"mesh-controller/app/daemon"
	"mesh-controller/app/logger"
	"mesh-controller/app/metrics"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/health"
	"mesh-controller/contexts/identity"
	"mesh-controller/contexts/inventory"
	"mesh-controller/contexts/licences"
	"mesh-controller/embedded/broker"
)

// ServeOptions shape the daemon.
type ServeOptions struct {
	// Listen is the embedded broker's address (host:port; port 0 picks one).
	Listen string
	// Ready is called once the daemon serves, with where its broker is.
	Ready func(Ready)
	// Standing is called when this controller stands by (with --broker
	// only), naming the live lease it waits for.
	Standing func(identity.Lease)
	// Aside is called when this controller stands aside (with --broker
	// only): the stores are newer than it knows, and it never takes the
	// lease; why says so in one line.
	Aside func(why string)
	// Migrated is called when serve migrated stores it found behind its
	// schema (an upgrade in place), before it takes the lease.
	Migrated func([]Migrated)
	// Log receives the daemon's log (log/slog records), as LogFormat says
	// ("text", the default, or "json"), from LogLevel up ("debug", "info"
	// (the default), "warn", "error").
	Log       io.Writer
	LogFormat string
	LogLevel  string
	// Version is the binary's, said in the log's start line.
	Version string
	// LeaseTTL, FlushEvery, CatchUpEvery, CheckEvery: zero means the
	// daemon's defaults (daemon.Default…).
	LeaseTTL, FlushEvery, CatchUpEvery, CheckEvery time.Duration
	// SweepEvery is how often the archives are swept and the builds
	// record pruned; zero means once a day.
	SweepEvery time.Duration
	// Counters, if set, counts what the daemon absorbed and dropped.
	Counters *Counters
	// Bounds are the self-check's; nil means the defaults.
	Bounds *Bounds
	// BoundsFromDurations sets heartbeat bounds from measured intervals.
	BoundsFromDurations bool
	// Healers are when the brake engages; zero means the defaults.
	Healers HealerLimits
	// MemoryLimit is the Go runtime's soft memory limit (see daemon.Options).
	MemoryLimit int64
	// BackupEvery, if set, is how often the daemon backs every store up into
	// BackupDir (made 0700), keeping the newest BackupKeep (0: DefaultBackupKeep).
	BackupEvery time.Duration
	BackupDir   string
	BackupKeep  int
	// Metrics, if set, is where /metrics, /healthz and /readyz are
	// answered (serve --metrics); Serve closes it when it returns.
	Metrics net.Listener
	// AlertWebhook, if set, is a URL each raising and clearing is posted to
	// (alerthook), bounded by AlertHook (zero: its defaults).
	AlertWebhook string
	AlertHook    alerthook.Options
	// HostCredentials is how long a host's broker user lasts (given at
	// join, renewed by its host before it ends); zero means
	// DefaultHostCredentials.
	HostCredentials time.Duration
}

// DefaultHostCredentials is how long a host's broker user lasts unless
// serve is told otherwise: its host renews it when a third is left, so a
// host away for up to ten days comes back on its own credential, and a
// credential stolen from a host's disk stops working within a month.
const DefaultHostCredentials = 30 * 24 * time.Hour

// Counters count what a serving controller absorbed and dropped.
type Counters = daemon.Counters

// Ready says where a serving controller can be reached.
type Ready = daemon.Ready

// Serve is the daemon (app/daemon) on this controller's stores, scheduling
// this controller's use cases. It returns when ctx ends, having stopped the
// broker and given the lease back.
func (c *Server) Serve(ctx context.Context, o ServeOptions) error {
	if o.Metrics != nil {
		defer o.Metrics.Close()
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	log, err := logger.New(o.Log, o.LogFormat, o.LogLevel)
	if err != nil {
		return err
	}
	if o.Version == "" {
		o.Version = c.Version
	}
	// The metrics listener answers from the start; the stores are read
	// once they are open (after any migration, below).
	var m *metrics.Metrics
	var stores *atomic.Pointer[Stores]
	if o.Metrics != nil {
		m, stores = startMetrics(ctx, o.Metrics, o.Version, log)
	}
	if done, err := c.migrateBehind(ctx, o, m, log); err != nil {
		if ctx.Err() != nil {
			return nil // stopped while standing by to migrate: a clean stop
		}
		return err
	} else if done != nil && o.Migrated != nil {
		o.Migrated(done)
	}
	sv, err := c.serving(ctx)
	if err != nil {
		return err
	}
	st := sv.st
	if o.HostCredentials > 0 {
		sv.hostTTL = o.HostCredentials
	}
	if m != nil {
		readStores(m, st)
		stores.Store(st)
		c.metrics = m
		defer func() {
			c.metrics = nil
			for _, name := range fencedContexts {
				st.DB(name).Observe = nil
			}
		}()
	}
	// The alert webhook is started under the lease (in Prepare, logging as
	// the daemon does) and stopped once the daemon has.
	var hook *alerthook.Hook
	var hookDone <-chan struct{}
	var notify func([]byte) // nil: nothing marshalled for a hook
	if o.AlertWebhook != "" {
		if hook, err = alerthook.New(o.AlertWebhook, o.AlertHook); err != nil {
			return fmt.Errorf("--alert-webhook: %w", err)
		}
		notify = hook.Post
	}
	hookCtx, stopHook := context.WithCancel(ctx)
	defer func() {
		stopHook()
		if hookDone != nil {
			<-hookDone
		}
	}()
	u := daemon.UseCases{
		Now:         c.Now,
		Credentials: &serveCredentials{keys: sv.keys, ids: st.Identity, external: c.Broker != ""},
		Hosts:       &serveHosts{sv: sv, health: c.health, check: CheckOptions{Bounds: o.Bounds, FromDurations: o.BoundsFromDurations, Notify: notify}},
		Builds:      serveBuilds{c.builds},
		Backups:     c.seats,
		Archives:    &serveArchives{builds: c.builds, modules: c.modules, lic: st.Licences},
		DueActs:     serveDueActs{c: c.licences, st: st},
	}
	return daemon.Run(ctx, daemon.Stores{Inventory: st.Inventory, Identity: st.Identity, Health: st.Health}, u, daemon.Options{
		Listen: o.Listen, Broker: c.Broker, DataDir: c.DataDir, Ready: o.Ready, Standing: o.Standing, Log: log, BrokerStore: filepath.Join(c.DataDir, "broker"),
		Newer: c.newerStores, Aside: o.Aside,
		LeaseTTL: o.LeaseTTL, FlushEvery: o.FlushEvery, CatchUpEvery: o.CatchUpEvery, CheckEvery: o.CheckEvery, SweepEvery: o.SweepEvery,
		Counters: o.Counters, Metrics: m, Healers: o.Healers, MemoryLimit: o.MemoryLimit, RaiseFences: st.raiseFences,
		Version: o.Version, Stores: st.shown(),
		Prepare: func(ctx context.Context, log *slog.Logger) ([]daemon.Job, error) {
			if hook != nil && hookDone == nil {
				hookDone = hook.Start(hookCtx, log)
				log.Info("alert webhook: posting each raising and clearing", "url", hook.Shown())
			}
			backups, err := scheduleBackups(ctx, o, st, c.Now, log)
			if err != nil {
				return nil, err
			}
			// Roll-outs are driven by the controller holding the lease only:
			// one left unfinished by a controller before it is resumed here.
			jobs := []daemon.Job{c.modules.rollOutJob(ctx, log)}
			if backups != nil {
				jobs = append(jobs, daemon.Job{Name: "backup", Due: backups.due, Run: backups.run, Stop: backups.stop})
			}
			return jobs, nil
		},
	})
}

// shown is each open store as the log's start line says it: its context
// and location, a PostgreSQL URL without its password.
func (st *Stores) shown() []daemon.StoreShown {
	var out []daemon.StoreShown
	for _, name := range Contexts {
		if db := st.dbs[name]; db != nil {
			out = append(out, daemon.StoreShown{Context: name, Location: db.Location.Shown()})
		}
	}
	return out
}

// fencedContexts are the contexts whose stores keep a fence: every one.
var fencedContexts = []string{"inventory", "identity", "secrets", "licences", "builds", "health"}

// raiseFences raises every store's fence to a new lease generation: from
// then on each refuses a write carrying an older one.
func (st *Stores) raiseFences(ctx context.Context, generation int64) error {
	for _, name := range fencedContexts {
		if err := st.DB(name).RaiseFence(ctx, generation); err != nil {
			return fmt.Errorf("%s store: %w", name, err)
		}
	}
	return nil
}

// serving is what a serving controller reads once when it starts: its
// broker keys do not change while it serves, and each of thousands of joins
// arriving at once signs with them. (The signing key may be rotated while
// it serves: each batch of joins reads the current one.)
type serving struct {
	c    uses
	st   *Stores
	keys broker.Keys
	// hostTTL is how long a host's broker user lasts.
	hostTTL time.Duration
}

func (c uses) serving(ctx context.Context) (*serving, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return nil, err
	}
	keys, err := brokerKeys(ctx, st.Identity)
	if err != nil {
		return nil, err
	}
	if _, err := st.Identity.SigningKey(ctx); err != nil {
		return nil, err
	}
	return &serving{c: c, st: st, keys: keys, hostTTL: DefaultHostCredentials}, nil
}

// join admits a host presenting a one-time token for its node: the token is
// marked used, the host's keys kept, its broker user signed (and the node's
// earlier host users revoked), and what it is given sealed to its age
// recipient. Everything the asker got wrong is a
// *daemon.Refusal. The token is looked up before anything that depends on
// the node, so an unknown node and an unknown token are refused alike, and
// by the same read.
func (sv *serving) join(ctx context.Context, r protocol.JoinRequest, urls []string) (daemon.Admitted, error) {
	out := sv.joinMany(ctx, []protocol.JoinRequest{r}, urls)
	return out[0].Admitted, out[0].Err
}

// joinMany admits many hosts, each exactly as join admits one: a rack
// powered on at once is kept in one write per store, and its grants are
// signed and sealed on every core. out[i] is rs[i]'s.
func (sv *serving) joinMany(ctx context.Context, rs []protocol.JoinRequest, urls []string) []daemon.JoinResult {
	out := make([]daemon.JoinResult, len(rs))
	refuse := func(i int, reason string, err error) {
		out[i].Err = &daemon.Refusal{Reason: reason, Err: err}
	}
	hostKeys := make([]ed25519.PublicKey, len(rs))
	now := sv.c.Now()
	expires := now.Add(sv.hostTTL)
	// A host of protocol 1.0 (before credentials expired) cannot renew
	// one: it is given one that does not expire, as it always was, rather
	// than one that shuts it out in a month.
	expiresFor := func(r protocol.JoinRequest) time.Time {
		if protocol.Of(r.Protocol) == protocol.Unversioned {
			return time.Time{}
		}
		return expires
	}
	var asks []identity.HostJoin
	var asked []int
	for i, r := range rs {
		if err := CheckNodeName(r.Node); err != nil {
			refuse(i, "bad node name", err)
			continue
		}
		hostKey, err := base64.StdEncoding.DecodeString(r.HostKey)
		if err != nil || len(hostKey) != ed25519.PublicKeySize {
			refuse(i, "malformed request", errors.New("host_key is not an ed25519 public key in base64"))
			continue
		}
		if _, err := age.ParseX25519Recipient(r.AgeRecipient); err != nil {
			refuse(i, "malformed request", fmt.Errorf("age_recipient: %w", err))
			continue
		}
		if !nkeys.IsValidPublicUserKey(r.NKey) {
			refuse(i, "malformed request", errors.New("nkey is not a user's public nkey"))
			continue
		}
		hostKeys[i] = hostKey
		asks = append(asks, identity.HostJoin{Token: r.Token, Host: identity.Host{Node: r.Node, HostKey: hostKey,
			AgeRecipient: r.AgeRecipient, NKey: r.NKey, HostVersion: r.HostVersion, Protocol: protocol.Of(r.Protocol)}, Expires: expiresFor(r)})
		asked = append(asked, i)
	}
	if len(asks) == 0 {
		return out
	}
	st := sv.st
	var joined []int
	var nodes []inventory.Join
	again := make([]bool, len(rs))
	for k, j := range st.Identity.JoinMany(ctx, asks, now) {
		i := asked[k]
		if j.Err != nil {
			out[i].Err = j.Err
			for sentinel, reason := range tokenRefusals {
				if errors.Is(j.Err, sentinel) {
					refuse(i, reason, j.Err)
				}
			}
			continue
		}
		out[i].Revoked, again[i] = j.Revoked, j.Again
		joined = append(joined, i)
		if j.Again {
			continue // recorded when it first asked: only its answer is made again
		}
		nodes = append(nodes, inventory.Join{Node: rs[i].Node, HostVersion: hostVersionOf(rs[i].HostVersion)})
	}
	if len(joined) == 0 {
		return out
	}
	if len(nodes) > 0 {
		if err := st.Inventory.RecordJoins(ctx, nodes, now); err != nil {
			for _, i := range joined {
				out[i].Err = err
			}
			return out
		}
	}
	// The key a host is given is the current one: rotated, it changes.
	signer, err := st.Identity.SigningKey(ctx)
	if err != nil {
		for _, i := range joined {
			out[i].Err = err
		}
		return out
	}
	// Signing a broker user and sealing with age cost most of a join:
	// each grant is made on its own, on every core.
	work := make(chan int)
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(joined)) {
		wg.Go(func() {
			for i := range work {
				out[i].Admitted, out[i].Err = sv.grant(rs[i], hostKeys[i], out[i].Revoked, urls, signer, expiresFor(rs[i]))
				out[i].Again = again[i]
			}
		})
	}
	for _, i := range joined {
		work <- i
	}
	close(work)
	wg.Wait()
	return out
}

// grant signs a joined host's broker user and seals what it is given to
// its age recipient.
func (sv *serving) grant(r protocol.JoinRequest, hostKey ed25519.PublicKey, revoked int, urls []string, signer identity.SigningKey, expires time.Time) (daemon.Admitted, error) {
	userJWT, err := sv.keys.IssueUserUntil("host "+r.Node, r.NKey, hostPermissions(r.Node), expires)
	if err != nil {
		return daemon.Admitted{}, fmt.Errorf("sign the host's broker user: %w", err)
	}
	sealed, err := protocol.SealJoinGrant(protocol.JoinGrant{Node: r.Node, Creds: broker.JWTBlock(userJWT),
		ControllerKey: signer.PublicBase64(), BrokerURLs: urls}, r.AgeRecipient)
	if err != nil {
		return daemon.Admitted{}, err
	}
	return daemon.Admitted{Reply: protocol.JoinReply{OK: true, Sealed: sealed}, HostKey: hostKey, Revoked: revoked}, nil
}

// renew signs node's host a broker user for the nkey it made, expiring
// hostTTL from now, and records it as the node's current user (the one it
// replaces lasts until it expires): the user JWT and the host as kept.
func (sv *serving) renew(ctx context.Context, node, nkey string) (string, identity.Host, int, error) {
	if !nkeys.IsValidPublicUserKey(nkey) {
		return "", identity.Host{}, 0, &daemon.Refusal{Reason: "malformed request", Err: errors.New("nkey is not a user's public nkey")}
	}
	now := sv.c.Now()
	expires := now.Add(sv.hostTTL)
	h, revoked, err := sv.st.Identity.RenewHost(ctx, node, nkey, expires, now)
	switch {
	case errors.Is(err, identity.ErrNKeyUsed):
		return "", identity.Host{}, 0, &daemon.Refusal{Reason: "nkey used before", Err: err}
	case errors.Is(err, identity.ErrHostUnknown):
		return "", identity.Host{}, 0, &daemon.Refusal{Reason: "renewal for an unknown host", Err: err}
	case err != nil:
		return "", identity.Host{}, 0, err
	}
	userJWT, err := sv.keys.IssueUserUntil("host "+node, nkey, hostPermissions(node), expires)
	if err != nil {
		return "", identity.Host{}, 0, fmt.Errorf("sign the host's broker user: %w", err)
	}
	return userJWT, h, revoked, nil
}

// tokenRefusals are the reasons a token is refused, as kept and counted.
var tokenRefusals = map[error]string{
	identity.ErrTokenUnknown:   "unknown token",
	identity.ErrTokenOtherNode: "token of another node",
	identity.ErrTokenUsed:      "used token",
	identity.ErrTokenRevoked:   "replaced token",
	identity.ErrTokenExpired:   "expired token",
	identity.ErrNKeyUsed:       "nkey used before",
}

// catchUp sends a new declaration to every node whose declaration is
// behind its plan (changed while no broker was reachable); at start it also
// resends their latest to nodes that have not applied it. made counts the
// nodes it made secrets for.
func (c uses) catchUp(ctx context.Context, nc *nats.Conn, ask daemon.CatchUpAsk) (out []daemon.Declared, made int, err error) {
	if !ask.Thorough {
		st, err := c.stores(ctx)
		if err != nil {
			return nil, 0, err
		}
		if ahead, err := st.Inventory.AnyAhead(ctx); err != nil || !ahead {
			return nil, 0, err
		}
	}
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return nil, 0, err
	}
	if ask.Finish {
		if err := c.finishActs(ctx, st, snap); err != nil {
			return nil, 0, err
		}
	}
	return c.catchUpFrom(ctx, nc, st, snap, ask.Start)
}

// actUnderWayFor bounds how long an act's command is taken to be declaring
// (an act to 10,000 nodes declares in seconds): past it, or once its process
// is gone from this machine, the catch-up completes what it left.
const actUnderWayFor = 2 * time.Minute

// actUnderWay says whether a person's act is under way: recorded, its time
// not run out, and its process not known to be gone.
func (c uses) actUnderWay(ctx context.Context, st *Stores) (bool, error) {
	acts, err := st.Inventory.ActsUnderWay(ctx, c.Now())
	if err != nil {
		return false, err
	}
	host, _ := os.Hostname()
	for _, a := range acts {
		if !a.Gone(host) {
			return true, nil
		}
	}
	return false, nil
}

// catchUpFrom is catchUp from a snapshot already read: an act may have
// declared since.
func (c uses) catchUpFrom(ctx context.Context, nc *nats.Conn, st *Stores, snap *inventory.Snapshot, start bool) (out []daemon.Declared, made int, err error) {
	if !start {
		// A person's act is making its users and secrets and declaring its
		// nodes: doing it beside it would make them twice (revoking the
		// act's) and declare every node a second time. Its nodes are
		// caught up once it ends, or once its command is gone.
		if busy, err := c.actUnderWay(ctx, st); err != nil || busy {
			return nil, 0, err
		}
	}
	// What an act stopped between stores left undone, and what a node that
	// joined waited for: the secrets the mesh makes for what is assigned
	// (moving those nodes' plans), then the nodes behind their plan are
	// declared.
	madeFor, err := c.ensureMade(ctx, st, snap, nil)
	if err != nil {
		return nil, 0, err
	}
	if made = len(madeFor); made > 0 {
		if snap, err = st.Inventory.Snapshot(ctx); err != nil {
			return nil, made, err
		}
	}
	var ahead []string
	for _, name := range snap.NodeNames {
		n := snap.Nodes[name]
		switch {
		case n.PlanVersion > n.DeclaredPlanVersion, n.SerialApplied > n.SerialDeclared:
			// A host that applied a serial this store never made (restored
			// from a backup) is declared again, numbered above it.
			ahead = append(ahead, name)
		case start && n.SerialApplied < n.SerialDeclared:
			// Only a send that failed is said: a node whose latest could not
			// be read asks for it, or the healers resend it.
			if serial, err := daemon.SendLatest(ctx, st.Inventory, nc, name); err != nil && serial != 0 {
				out = append(out, daemon.Declared{Node: name, Serial: serial, NotSent: err.Error()})
			} else if err == nil && serial != 0 {
				c.metrics.Declared(1)
			}
		}
	}
	if len(ahead) == 0 {
		return out, made, nil
	}
	key, err := st.Identity.SigningKey(ctx)
	if err != nil {
		return out, made, err
	}
	// An act may be declaring these very nodes now (it moved their plans
	// before this snapshot, and keeps its declarations after): only those
	// still behind when the serials are read are declared here.
	dec := &declarer{inv: st.Inventory, sec: st.Secrets, lic: st.Licences, ids: st.Identity, key: key, nc: nc, now: c.Now, ifBehind: true}
	defer func() { observeDeclare(c.metrics, dec.took) }()
	for _, p := range dec.declare(ctx, snap, ahead) {
		if p.Declared {
			continue
		}
		out = append(out, daemon.Declared{Node: p.Node, Serial: p.Serial, Sent: p.Sent, NotSent: p.NotSent, Problem: p.Problem})
	}
	return out, made, nil
}

// serveCredentials sign the daemon's own broker users with the broker's
// keys, and read what the broker trusts from the identity store.
type serveCredentials struct {
	keys     broker.Keys
	ids      *identity.Store
	external bool
}

// ControllerUser is the daemon's user in the mesh account.
func (s *serveCredentials) ControllerUser(context.Context) (string, []byte, error) {
	return s.keys.NewUser("controller", controllerPermissions())
}

// Admitter is the daemon's user that answers joins in the admit account.
func (s *serveCredentials) Admitter(context.Context) (string, []byte, error) {
	return s.keys.NewAdmitter("controller joins", admitPermissions())
}

// SystemUser is the controller's user of the system account, whose key is
// kept with the operator's: it pushes account JWTs to an external broker's
// resolver.
func (s *serveCredentials) SystemUser(context.Context) (string, []byte, error) {
	return s.keys.NewSystemUser("controller system")
}

// Trust is what the broker holds, revoked users included.
func (s *serveCredentials) Trust(ctx context.Context) (broker.Trust, error) {
	return trustOf(ctx, s.ids, s.keys, s.external)
}

// serveHosts admit hosts, keep them declared and judge the mesh.
type serveHosts struct {
	sv     *serving
	health *Health
	// check is how the self-check judges (its bounds, the alert hook);
	// the holder, connection and logger are the daemon's.
	check CheckOptions
}

// Join admits hosts presenting tokens.
func (h *serveHosts) Join(ctx context.Context, rs []protocol.JoinRequest, urls []string) []daemon.JoinResult {
	return h.sv.joinMany(ctx, rs, urls)
}

// CatchUp declares the nodes behind their plans.
func (h *serveHosts) CatchUp(ctx context.Context, nc *nats.Conn, ask daemon.CatchUpAsk) ([]daemon.Declared, int, error) {
	return h.sv.c.catchUp(ctx, nc, ask)
}

// SelfCheck judges the mesh.
func (h *serveHosts) SelfCheck(ctx context.Context, nc *nats.Conn, holder string, log *slog.Logger) ([]health.Condition, error) {
	o := h.check
	o.Holder, o.NC, o.Logger = holder, nc, log
	r, err := h.health.SelfCheck(ctx, o)
	return r.Open, err
}

// Renew renews a host's credential before it expires.
func (h *serveHosts) Renew(ctx context.Context, node, nkey string) (string, int, error) {
	userJWT, _, revoked, err := h.sv.renew(ctx, node, nkey)
	if err != nil {
		return "", 0, err
	}
	return broker.JWTBlock(userJWT), revoked, nil
}

// RenewGrant renews an expired host credential, asked through the join
// path: the answer a grant sealed to the node's age recipient, as a join's.
func (h *serveHosts) RenewGrant(ctx context.Context, node, nkey string, urls []string) (protocol.JoinReply, int, error) {
	userJWT, host, revoked, err := h.sv.renew(ctx, node, nkey)
	if err != nil {
		return protocol.JoinReply{}, 0, err
	}
	signer, err := h.sv.st.Identity.SigningKey(ctx)
	if err != nil {
		return protocol.JoinReply{}, revoked, err
	}
	sealed, err := protocol.SealJoinGrant(protocol.JoinGrant{Node: node, Creds: broker.JWTBlock(userJWT),
		ControllerKey: signer.PublicBase64(), BrokerURLs: urls}, host.AgeRecipient)
	if err != nil {
		return protocol.JoinReply{}, revoked, err
	}
	return protocol.JoinReply{OK: true, Sealed: sealed}, revoked, nil
}

// serveBuilds are the controller's build acts; ReAsk asks a dead build
// again under a new id.
type serveBuilds struct{ *Builds }

// ReAsk asks a build again, not waiting for it.
func (b serveBuilds) ReAsk(ctx context.Context, id string) error {
	_, err := b.Rebuild(ctx, id, BuildRequest{NoWait: true})
	return err
}

// serveArchives serve the archives hosts run, and sweep what no one needs
// (with superseded licence versions past their grace period).
type serveArchives struct {
	builds  *Builds
	modules *Modules
	lic     *licences.Store
}

// ArchiveDeclared says whether node's latest declaration names the archive.
func (a *serveArchives) ArchiveDeclared(ctx context.Context, node, digest string) (bool, error) {
	return a.builds.ArchiveDeclared(ctx, node, digest)
}

// Connected makes the archives bucket on the daemon's connection.
func (a *serveArchives) Connected(ctx context.Context, nc *nats.Conn, replicas int) error {
	return archive.EnsureBucket(ctx, nc, replicas)
}

// Sweep lets go the archives nobody needs and, a bounded number each
// sweep whatever became of the archives, the superseded licence versions
// past their grace period.
func (a *serveArchives) Sweep(ctx context.Context, nc *nats.Conn) (string, error) {
	r, err := a.modules.Sweep(ctx, nc)
	n, derr := a.lic.Discard(ctx, a.modules.Now(), maxDiscards)
	line := r.String()
	if n > 0 {
		line += fmt.Sprintf("; %s discarded", Plural(n, "superseded licence version"))
	}
	return line, errors.Join(err, derr)
}

// serveDueActs are the timed healers' acts: licences due a refresh.
type serveDueActs struct {
	c  *Licences
	st *Stores
}

// Due are the licence refreshes due now.
func (d serveDueActs) Due(ctx context.Context, nc *nats.Conn) ([]daemon.Due, error) {
	return d.c.licencesDue(ctx, d.st, nc)
}
