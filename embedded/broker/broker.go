// Package broker runs the embedded NATS server in operator mode (with
// JetStream when given a store directory), and signs the JWTs of the
// controller's operator, its account and every broker user.
package broker

import (
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// Keys are the broker's signing keys: the operator's, the mesh account's and
// the system account's, kept in the identity store, and the join and admit
// accounts', derived from the mesh account's.
type Keys struct {
	Operator nkeys.KeyPair
	Account  nkeys.KeyPair
	System   nkeys.KeyPair
	// Join signs the join account, where connections without credentials
	// land: nothing is there but the services it imports from the admit
	// account.
	Join nkeys.KeyPair
	// Admit signs the admit account, where the controller answers joins:
	// apart from the mesh account, so that revoking users there (which
	// rebuilds its exports, and forgets the way back of every request in
	// flight through them) never loses a join's answer.
	Admit nkeys.KeyPair
}

// KeysFromSeeds rebuilds Keys from their seeds.
func KeysFromSeeds(operator, account, system []byte) (Keys, error) {
	var k Keys
	var err error
	if k.Operator, err = nkeys.FromSeed(operator); err != nil {
		return Keys{}, fmt.Errorf("operator key: %w", err)
	}
	if k.Account, err = nkeys.FromSeed(account); err != nil {
		return Keys{}, fmt.Errorf("account key: %w", err)
	}
	if k.System, err = nkeys.FromSeed(system); err != nil {
		return Keys{}, fmt.Errorf("system account key: %w", err)
	}
	if k.Join, err = derivedAccount(account, "join"); err != nil {
		return Keys{}, fmt.Errorf("join account key: %w", err)
	}
	if k.Admit, err = derivedAccount(account, "admit"); err != nil {
		return Keys{}, fmt.Errorf("admit account key: %w", err)
	}
	return k, nil
}

// derivedAccount derives an account's key from the mesh account's seed
// (HMAC-SHA256 with a label of its own): it needs no store of its own, and
// stays the same across restarts, so an external broker is configured with
// it once.
func derivedAccount(accountSeed []byte, label string) (nkeys.KeyPair, error) {
	_, raw, err := nkeys.DecodeSeed(accountSeed)
	if err != nil {
		return nil, err
	}
	mac := hmac.New(sha256.New, raw)
	mac.Write([]byte("mesh-controller " + label + " account"))
	return nkeys.FromRawSeed(nkeys.PrefixByteAccount, mac.Sum(nil))
}

// NewSeeds makes the three seeds: operator, account, system account.
func NewSeeds() (operator, account, system []byte, err error) {
	op, err := nkeys.CreateOperator()
	if err != nil {
		return nil, nil, nil, err
	}
	acc, err := nkeys.CreateAccount()
	if err != nil {
		return nil, nil, nil, err
	}
	sys, err := nkeys.CreateAccount()
	if err != nil {
		return nil, nil, nil, err
	}
	operator, _ = op.Seed()
	account, _ = acc.Seed()
	system, _ = sys.Seed()
	return operator, account, system, nil
}

// Permissions are what a user may publish and subscribe to, and how much it
// may use of the broker.
//
// There is deliberately no response permission (NATS allow_responses): the
// server lets such a user publish to any reply subject it was handed, even
// one its deny list names (client.go pubAllowedFullCheck; broker_test.go
// shows it), so whoever can hand it a request can make it publish anywhere.
// A user that answers requests is allowed the inboxes it answers into
// instead, as plain publish subjects.
type Permissions struct {
	Publish   []string `json:"publish"`
	Subscribe []string `json:"subscribe"`
	// MaxPayload is the largest message the user may publish, in bytes
	// (0: the server's limit). The server closes a connection that sends more.
	MaxPayload int64 `json:"max_payload,omitempty"`
	// MaxSubs is how many subscriptions the user may hold at once (0: no limit).
	MaxSubs int64 `json:"max_subs,omitempty"`
}

// IssueUser signs a user JWT in the mesh account for the nkey userPub. A
// bearer user connects with the JWT alone.
func (k Keys) IssueUser(name, userPub string, p Permissions, bearer bool) (string, error) {
	return issueUser(k.Account, name, userPub, p, bearer, time.Time{})
}

// IssueUserUntil is IssueUser for a user that stops being admitted at
// expires: the server refuses it from then on, and closes its connections
// then. A host's user is, so that a stolen credential dies on its own.
func (k Keys) IssueUserUntil(name, userPub string, p Permissions, expires time.Time) (string, error) {
	return issueUser(k.Account, name, userPub, p, false, expires)
}

func issueUser(account nkeys.KeyPair, name, userPub string, p Permissions, bearer bool, expires time.Time) (string, error) {
	uc := jwt.NewUserClaims(userPub)
	uc.Name = name
	if !expires.IsZero() {
		uc.Expires = expires.Unix()
	}
	uc.BearerToken = bearer
	uc.Pub.Allow.Add(p.Publish...)
	uc.Sub.Allow.Add(p.Subscribe...)
	if len(p.Publish) == 0 {
		uc.Pub.Deny.Add(">")
	}
	if len(p.Subscribe) == 0 {
		uc.Sub.Deny.Add(">")
	}
	if p.MaxPayload > 0 {
		uc.Limits.Payload = p.MaxPayload
	}
	if p.MaxSubs > 0 {
		uc.Limits.Subs = p.MaxSubs
	}
	return uc.Encode(account)
}

// NewUser makes a fresh user nkey and its JWT in the mesh account: for the
// controller's own connections, which are made anew by each process, and
// for modules.
func (k Keys) NewUser(name string, p Permissions) (userJWT string, seed []byte, err error) {
	return newUser(k.Account, name, p)
}

// NewAdmitter makes a fresh user of the admit account: the controller's
// connection that answers joins.
func (k Keys) NewAdmitter(name string, p Permissions) (userJWT string, seed []byte, err error) {
	return newUser(k.Admit, name, p)
}

func newUser(account nkeys.KeyPair, name string, p Permissions) (userJWT string, seed []byte, err error) {
	u, err := nkeys.CreateUser()
	if err != nil {
		return "", nil, err
	}
	pub, _ := u.PublicKey()
	if userJWT, err = issueUser(account, name, pub, p, false, time.Time{}); err != nil {
		return "", nil, err
	}
	seed, _ = u.Seed()
	return userJWT, seed, nil
}

// PublicOfSeed is the public key of a user seed.
func PublicOfSeed(seed []byte) (string, error) {
	kp, err := nkeys.FromSeed(seed)
	if err != nil {
		return "", err
	}
	return kp.PublicKey()
}

// Creds formats a .creds document from a user JWT and its seed.
func Creds(userJWT string, seed []byte) (string, error) {
	b, err := jwt.FormatUserConfig(userJWT, seed)
	return string(b), err
}

// Trust is what a NATS server must hold to trust this controller: the
// operator, the mesh, join, admit and system accounts, and the default
// sentinel that admits a connection without credentials as the join user.
type Trust struct {
	Operator    *jwt.OperatorClaims
	OperatorJWT string
	AccountPub  string
	AccountJWT  string
	SystemPub   string
	SystemJWT   string
	// JoinPub and JoinJWT are the join account's, where the sentinel lands.
	JoinPub string
	JoinJWT string
	// AdmitPub and AdmitJWT are the admit account's, which answers joins.
	AdmitPub string
	AdmitJWT string
	// Sentinel is the bearer user JWT a connection without credentials gets.
	Sentinel string
}

// JoinUser is what a connection without credentials becomes: a bearer user
// of the join account. That account holds nothing but the services it
// imports from the admit account, where the controller answers them, so an
// anonymous connection cannot see or reach the mesh account's subjects and
// inboxes at all; a request reaches the controller with a reply subject the
// server made (_R_.…) and the asker's connection details in its
// Nats-Request-Info header (ClientInfoHdr), which the asker cannot forge;
// and the answer can only go back to the asker's reply subject in the join
// account.
type JoinUser struct {
	// Permissions are the join user's within the join account: its limits
	// (MaxPayload, MaxSubs) are the ones that matter most.
	Permissions Permissions
	// Services are the subjects the join account may ask of the admit account.
	Services []string
	// MaxConns caps the join account's connections at once (0: no limit):
	// past it the server refuses a connection without credentials.
	MaxConns int64
	// AnswerWithin is how long the server keeps the way back for an answer
	// to a request through a service (0: the server's default, 2 minutes):
	// a request that is never answered holds that much of the server's
	// memory for that long.
	AnswerWithin time.Duration
}

// ClientInfoHdr is the header the server puts on a request that came
// through a service import, with the asker's connection (its address among
// them); the server replaces any header of that name the asker sent.
const ClientInfoHdr = server.ClientInfoHdr

// Trust signs the operator and account JWTs and the sentinel join user;
// the mesh account's JWT revokes the revoked users. It is the embedded
// broker's: one server, keeping one copy of each stream.
func (k Keys) Trust(join JoinUser, revoked map[string]time.Time) (Trust, error) {
	return k.trust(join, revoked, jwt.JetStreamTieredLimits{})
}

// ClusterTrust is Trust for a broker of its own (serve --broker): its
// mesh account may keep streams of one copy and of three (a cluster's),
// each tier bounded as the embedded broker's one tier is, per server. A
// server not clustered counts both tiers together: its max_file_store
// must then be twice MaxStore, or its JetStream off.
func (k Keys) ClusterTrust(join JoinUser, revoked map[string]time.Time) (Trust, error) {
	return k.trust(join, revoked, jwt.JetStreamTieredLimits{"R1": meshJetStream, "R3": meshJetStream})
}

// trust is Trust, with the mesh account's JetStream limits given per tier
// when tiers has any; else for all tiers together (meshJetStream).
func (k Keys) trust(join JoinUser, revoked map[string]time.Time, tiers jwt.JetStreamTieredLimits) (Trust, error) {
	opPub, _ := k.Operator.PublicKey()
	accPub, _ := k.Account.PublicKey()
	sysPub, _ := k.System.PublicKey()
	joinAccPub, _ := k.Join.PublicKey()
	admitPub, _ := k.Admit.PublicKey()
	oc := jwt.NewOperatorClaims(opPub)
	oc.Name = "mesh-controller"
	oc.SystemAccount = sysPub
	opJWT, err := oc.Encode(k.Operator)
	if err != nil {
		return Trust{}, err
	}
	ac := jwt.NewAccountClaims(accPub)
	ac.Name = "mesh"
	if len(tiers) > 0 {
		ac.Limits.JetStreamTieredLimits = tiers
	} else {
		ac.Limits.JetStreamLimits = meshJetStream
	}
	for pub, at := range revoked {
		ac.RevokeAt(pub, at)
	}
	jc := jwt.NewAccountClaims(joinAccPub)
	jc.Name = "join"
	adc := jwt.NewAccountClaims(admitPub)
	adc.Name = "admit"
	for _, subject := range join.Services {
		adc.Exports.Add(&jwt.Export{Name: subject, Subject: jwt.Subject(subject), Type: jwt.Service,
			ResponseType: jwt.ResponseTypeSingleton, ResponseThreshold: join.AnswerWithin})
		jc.Imports.Add(&jwt.Import{Name: subject, Account: admitPub, Subject: jwt.Subject(subject), Type: jwt.Service, Share: true})
	}
	if join.MaxConns > 0 {
		jc.Limits.Conn = join.MaxConns
		if join.Permissions.MaxSubs > 0 {
			jc.Limits.Subs = join.MaxConns * join.Permissions.MaxSubs
		}
	}
	if join.Permissions.MaxPayload > 0 {
		jc.Limits.Payload = join.Permissions.MaxPayload
	}
	accJWT, err := ac.Encode(k.Operator)
	if err != nil {
		return Trust{}, err
	}
	joinJWT, err := jc.Encode(k.Operator)
	if err != nil {
		return Trust{}, err
	}
	admitJWT, err := adc.Encode(k.Operator)
	if err != nil {
		return Trust{}, err
	}
	sc := jwt.NewAccountClaims(sysPub)
	sc.Name = "system"
	sysJWT, err := sc.Encode(k.Operator)
	if err != nil {
		return Trust{}, err
	}
	user, err := nkeys.CreateUser()
	if err != nil {
		return Trust{}, err
	}
	userPub, _ := user.PublicKey()
	sentinelJWT, err := issueUser(k.Join, "join", userPub, join.Permissions, true, time.Time{})
	if err != nil {
		return Trust{}, err
	}
	decoded, err := jwt.DecodeOperatorClaims(opJWT)
	if err != nil {
		return Trust{}, err
	}
	return Trust{Operator: decoded, OperatorJWT: opJWT, AccountPub: accPub, AccountJWT: accJWT,
		SystemPub: sysPub, SystemJWT: sysJWT, JoinPub: joinAccPub, JoinJWT: joinJWT, AdmitPub: admitPub, AdmitJWT: admitJWT,
		Sentinel: sentinelJWT}, nil
}

// The mesh account's JetStream (the only account that has it): where the
// archives bucket lives, on the embedded broker or an external one.
const (
	// MaxStore bounds the bytes the mesh account keeps in JetStream's files
	// (20 GiB), every stream together: each stream must name its own
	// MaxBytes, and together they fit under this; a put past a stream's
	// bound is refused. The embedded server's own bound is the same
	// (Config.StoreDir) rather than its default, three quarters of the
	// disk's free space, under which the account would not be enabled at
	// all on a smaller disk: the data dir's disk must have it to spare.
	// A cluster server's max_file_store must be at least this (ClusterTrust).
	MaxStore int64 = 20 << 30
	// maxStreams bounds the account's streams: the archives bucket, and
	// room for a few more the controller may add.
	maxStreams = 8
	// maxConsumers bounds the consumers of one stream: each fetch of an
	// archive holds one (an ordered consumer, deleted when the fetch ends),
	// so this is how many hosts may fetch at once; past it a fetch is
	// refused and the host tries again.
	maxConsumers = 1024
)

// meshJetStream are the mesh account's JetStream limits: files only (no
// memory streams), bounded. On a cluster they are given per tier
// (ClusterTrust): a bound for all tiers counts every copy of a stream, and
// a 16 GiB bucket kept three times would pass it.
var meshJetStream = jwt.JetStreamLimits{DiskStorage: MaxStore, MemoryStorage: 0, Streams: maxStreams,
	Consumer: maxConsumers, MaxBytesRequired: true}

// Preload is every account JWT a server's resolver must hold, by account.
func (t Trust) Preload() map[string]string {
	return map[string]string{t.AccountPub: t.AccountJWT, t.SystemPub: t.SystemJWT, t.JoinPub: t.JoinJWT, t.AdmitPub: t.AdmitJWT}
}

// Server is the embedded NATS server.
type Server struct {
	srv      *server.Server
	resolver *server.MemAccResolver
	// store is the store directory's lock file, held while the server runs.
	store *storeLock
}

// Config shapes the embedded server.
type Config struct {
	// Listen is host:port; port 0 picks a free one.
	Listen string
	// Trust is the operator and the accounts the server trusts.
	Trust Trust
	// StoreDir, if set, turns JetStream on, its files under this directory
	// (serve gives <data dir>/broker), bounded by MaxStore; it is where the
	// mesh account's archives bucket lives. Empty leaves JetStream off.
	StoreDir string
}

// Start starts the embedded server on listen (host:port; port 0 picks a free
// one) in operator mode, without JetStream, and waits until it takes
// connections.
func Start(listen string, t Trust) (*Server, error) {
	return StartWith(Config{Listen: listen, Trust: t})
}

// StartWith starts the embedded server as c says, in operator mode, and
// waits until it takes connections and, with a StoreDir, until the mesh
// account's JetStream answers.
func StartWith(c Config) (*Server, error) {
	listen, t := c.Listen, c.Trust
	host, portText, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("--listen %s: %w", listen, err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		return nil, fmt.Errorf("--listen %s: port is not a number", listen)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	} else {
		// Say a taken address at once; the server itself would only fail to become ready.
		ln, err := net.Listen("tcp", listen)
		if err != nil {
			return nil, fmt.Errorf("embedded broker: %w", err)
		}
		ln.Close()
	}
	resolver := &server.MemAccResolver{}
	for pub, accJWT := range t.Preload() {
		if err := resolver.Store(pub, accJWT); err != nil {
			return nil, err
		}
	}
	opts := &server.Options{
		ServerName:       "mesh-controller",
		Host:             host,
		Port:             port,
		TrustedOperators: []*jwt.OperatorClaims{t.Operator},
		AccountResolver:  resolver,
		SystemAccount:    t.SystemPub,
		DefaultSentinel:  t.Sentinel,
		NoLog:            true,
		NoSigs:           true,
		MaxPayload:       maxPayload,
		// Memory per connection (BenchmarkBrokerConnection in app/ measures
		// it; at 10,000 hosts it is most of the controller's): no cache of
		// subject lookups per account and per user's publish permissions,
		// each a map that grows with the subjects a connection sends on (a
		// host sends on a handful, each looked up in its own small cache
		// of results as well); and no record of closed connections, which
		// only the monitoring endpoint reads and this server has none of
		// (by default the last 10,000, about 8 MiB after 10,000 joins).
		NoSublistCache:   true,
		MaxClosedClients: 1,
		// Ten thousand hosts coming back at once are authenticated in
		// turn (a signature check each): one whose CONNECT waits past the
		// default 2 s is closed, and its retry adds to the crowd.
		AuthTimeout: AuthTimeout.Seconds(),
		// By default the server pings a client 2 s after its CONNECT
		// arrives. Ten thousand hosts coming back at once wait on the
		// server's lock for their CONNECT to be checked, seconds each;
		// the ping then goes out before the handshake's PONG, nats.go
		// takes it for a failed handshake ("expected 'PONG', got 'PING'")
		// and drops the connection, and its retry adds to the crowd:
		// after a restart under 10,000 hosts, 690 were heard again in a
		// minute. The first ping waits the ping interval instead.
		DisableShortFirstPing: true,
	}
	var store *storeLock
	if c.StoreDir != "" {
		if store, err = lockStore(c.StoreDir); err != nil {
			return nil, fmt.Errorf("embedded broker: %w", err)
		}
		opts.JetStream = true
		opts.StoreDir = c.StoreDir
		opts.JetStreamMaxStore = MaxStore
		// No account may keep streams in memory (the mesh account's bound
		// is 0); an ordered consumer keeps its own small state there,
		// uncounted.
		opts.JetStreamMaxMemory = maxMemory
		// Every write is on disk before it is acknowledged (lessons.md: by
		// default JetStream syncs every 2 minutes, and acknowledged writes
		// were lost): an archive a declaration names must survive a power
		// loss. Measured: a 20 MiB archive put in about 110 ms instead of 65.
		opts.SyncAlways = true
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		if store != nil {
			store.unlock()
		}
		return nil, fmt.Errorf("embedded broker: %w", err)
	}
	s := &Server{srv: srv, resolver: resolver, store: store}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, errors.New("embedded broker: not ready after 10s (is the address in use?)")
	}
	if c.StoreDir != "" {
		if err := s.waitJetStream(t.AccountPub, 10*time.Second); err != nil {
			s.Shutdown()
			return nil, fmt.Errorf("embedded broker: %w", err)
		}
	}
	return s, nil
}

// waitJetStream waits until the server's JetStream is healthy and the mesh
// account has it: ReadyForConnections does not mean JetStream is ready
// (lessons.md), and an account of the resolver is only loaded, its
// JetStream enabled, when first looked up.
func (s *Server) waitJetStream(account string, within time.Duration) error {
	deadline := time.Now().Add(within)
	var last error
	for {
		acc, err := s.srv.LookupAccount(account)
		switch {
		case err != nil:
			last = fmt.Errorf("look up the mesh account: %w", err)
		case !acc.JetStreamEnabled():
			last = errors.New("jetstream is not enabled for the mesh account")
		default:
			h := s.srv.Healthz(&server.HealthzOptions{})
			if h.Status == "ok" {
				return nil
			}
			last = fmt.Errorf("jetstream is not healthy: %s %s", h.Status, h.Error)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %s: %w", within, last)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// UpdateAccount gives the running server the mesh account's JWT of t: users
// it revokes are disconnected at once (a revoked user is not disconnected by
// itself otherwise). The server rebuilds the account's exports, forgetting
// the way back of requests in flight through them: the mesh account exports
// nothing (joins are answered in the admit account).
func (s *Server) UpdateAccount(t Trust) error {
	ac, err := jwt.DecodeAccountClaims(t.AccountJWT)
	if err != nil {
		return err
	}
	if err := s.resolver.Store(t.AccountPub, t.AccountJWT); err != nil {
		return err
	}
	acc, err := s.srv.LookupAccount(t.AccountPub)
	if err != nil {
		return err
	}
	s.srv.UpdateAccountClaims(acc, ac)
	return nil
}

// ClientURL is the URL clients dial.
func (s *Server) ClientURL() string { return s.srv.ClientURL() }

// InProcess is the nats.Option that connects in-process, without TCP.
func (s *Server) InProcess() nats.Option { return nats.InProcessServer(s.srv) }

// NumClients counts connected clients.
func (s *Server) NumClients() int { return s.srv.NumClients() }

// Shutdown stops the server and waits until it has stopped (lessons.md:
// without the wait, storage can be left corrupted).
func (s *Server) Shutdown() {
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
	if s.store != nil {
		s.store.unlock()
	}
}

// maxPayload is the largest message the broker takes (a user's own bound
// may be lower), and maxMemory what JetStream may keep in memory: no
// account may keep streams there, but an ordered consumer keeps its own
// small state there, uncounted.
const (
	maxPayload = 8 << 20
	maxMemory  = 64 << 20
)

// AuthTimeout is how long the broker waits for a new connection to
// present its credentials before closing it.
const AuthTimeout = 10 * time.Second

// ErrStoreInUse means another server (in this process or another) runs on
// the store directory: two would corrupt it, and nats-server itself does
// not refuse.
var ErrStoreInUse = errors.New("the broker's store directory is in use by another broker: stop it first")

// lockedStores are the store directories a server of this process holds:
// a record lock does not keep out the process that holds it.
var lockedStores = struct {
	sync.Mutex
	dirs map[string]bool
}{dirs: map[string]bool{}}

// storeLock is a held store directory: its lock file, and its name among
// lockedStores.
type storeLock struct {
	f   *os.File
	dir string
}

// lockStore makes dir (0700) and takes its lock: a record lock (fcntl) on
// dir/.lock against other processes, and lockedStores within this one.
// Not flock: a flock is held by every copy of its file descriptor, and a
// child this process forks holds one until it has exec'd, so a server
// stopped and started again in a busy process (a test's restart, a
// standby's new term) was refused while some module's fork was still
// starting. A record lock is not inherited by a fork, and is let go when
// the process ends however it ends.
func lockStore(dir string) (*storeLock, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("the store directory: %w", err)
	}
	abs, err := filepath.Abs(dir)
	if err == nil {
		abs, err = filepath.EvalSymlinks(abs)
	}
	if err != nil {
		return nil, fmt.Errorf("the store directory: %w", err)
	}
	lockedStores.Lock()
	defer lockedStores.Unlock()
	if lockedStores.dirs[abs] {
		return nil, fmt.Errorf("%s: %w", dir, ErrStoreInUse)
	}
	f, err := os.OpenFile(filepath.Join(abs, ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("the store directory: %w", err)
	}
	lk := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: io.SeekStart}
	if err := syscall.FcntlFlock(f.Fd(), syscall.F_SETLK, &lk); err != nil {
		f.Close()
		if errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EACCES) {
			return nil, fmt.Errorf("%s: %w", dir, ErrStoreInUse)
		}
		return nil, fmt.Errorf("lock the store directory %s: %w", dir, err)
	}
	lockedStores.dirs[abs] = true
	return &storeLock{f: f, dir: abs}, nil
}

// unlock lets the store directory go, once however often it is called:
// closing the file ends the record lock (no other descriptor of it is
// open in this process).
func (l *storeLock) unlock() {
	lockedStores.Lock()
	defer lockedStores.Unlock()
	if l.f == nil {
		return
	}
	l.f.Close()
	l.f = nil
	delete(lockedStores.dirs, l.dir)
}

// JWTBlock is the JWT half of a .creds document, for a party that holds the
// seed itself and joins the two.
func JWTBlock(userJWT string) string {
	return "-----BEGIN NATS USER JWT-----\n" + userJWT + "\n------END NATS USER JWT------\n"
}
