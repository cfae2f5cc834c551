// Package host is the reference host (mesh-host): it joins a mesh with a
// one-time token, keeps its keys in a state dir, reports its machine, and
// applies the declarations its controller signs. It knows the controller only
// through the protocol.
package host

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"filippo.io/age"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"mesh-controller/app/protocol"
	"mesh-controller/app/service"
)

// Version is the host's version, sent when joining.
var Version = "development build"

// DefaultStateDir is where the host keeps its keys and credentials unless
// told: for root (euid 0) /var/lib/mesh-host, the service's
// (service.Host.DataDir); for another user $XDG_STATE_HOME/mesh-host, else
// ~/.local/state/mesh-host.
func DefaultStateDir(getenv func(string) string, euid int) string {
	if euid == 0 {
		return service.Host.DataDir()
	}
	if x := getenv("XDG_STATE_HOME"); x != "" {
		return filepath.Join(x, "mesh-host")
	}
	home := getenv("HOME")
	if home == "" {
		home, _ = os.UserHomeDir()
	}
	return filepath.Join(home, ".local", "state", "mesh-host")
}

// ErrRefused means the controller refused the join; the error says why.
var ErrRefused = errors.New("the controller refused the join")

// ErrJoinedAlready means the state dir already holds a joined host.
var ErrJoinedAlready = errors.New("this state dir has joined already")

// UnreachableError is a broker URL no server of which took a connection:
// a person checks the URL, the controller and the way there, none of
// which the host can tell apart.
type UnreachableError struct {
	URL string
	Err error
}

// Error says which URL was not reached, and the connection's why.
func (e *UnreachableError) Error() string {
	return "reach the broker at " + e.URL + ": " + e.Err.Error()
}

// Unwrap is the connection's own error.
func (e *UnreachableError) Unwrap() error { return e.Err }

// State is what a joined host keeps in its state dir.
type State struct {
	Dir           string
	Node          string
	HostKey       ed25519.PrivateKey
	Age           *age.X25519Identity
	Creds         string // .creds document: the user JWT and the host's own nkey seed
	ControllerKey ed25519.PublicKey
	BrokerURLs    []string
	// WireGuard is the host's WireGuard private key (the overlay's): kept
	// in its state dir, never sent; its public half is a fact. Zero for a
	// host joined before the overlay until Runner.Run makes one.
	WireGuard wgtypes.Key

	// mu guards what changes while the host runs: Creds (renewed),
	// ControllerKey and ring (rotated).
	mu sync.Mutex
	// ring is the controller keys the host accepts once it heard a
	// rotation (keys.go); nil: ControllerKey alone.
	ring *keyring
	// parsed is Creds read (parsedCreds), kept until Creds changes: each
	// connection asks for the user JWT and a signature with the nkey.
	parsedCreds string
	parsedJWT   string
	parsedKey   nkeys.KeyPair
}

const (
	fileNode       = "node"
	fileHostKey    = "host.key"
	fileAgeKey     = "age.key"
	fileCreds      = "nats.creds"
	fileController = "controller.pub"
	fileBroker     = "broker"
	fileApplied    = "applied.json"
	// fileWireGuard holds the WireGuard private key, base64 as wg genkey
	// writes it.
	fileWireGuard = "wireguard.key"
)

// JoinOptions are what a person gives mesh-host join.
type JoinOptions struct {
	Broker string
	Token  string
	Node   string
	State  string
}

// Join makes the host's keys (ed25519, age X25519, nkey, WireGuard), asks the
// controller to join as the join user, and keeps what it answers in the
// state dir (0700, files 0600).
func Join(ctx context.Context, o JoinOptions) (*State, error) {
	if _, err := os.Stat(filepath.Join(o.State, fileCreds)); err == nil {
		return nil, fmt.Errorf("%s: %w", o.State, ErrJoinedAlready)
	}
	return join(ctx, o, true)
}

// join makes the keys, joins, and (if save) keeps the state in its dir.
func join(ctx context.Context, o JoinOptions, save bool) (*State, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	ageID, err := age.GenerateX25519Identity()
	if err != nil {
		return nil, err
	}
	nk, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	wg, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		return nil, err
	}
	nkPub, _ := nk.PublicKey()
	nkSeed, _ := nk.Seed()

	req, _ := json.Marshal(protocol.JoinRequest{Token: o.Token, Node: o.Node, HostKey: base64.StdEncoding.EncodeToString(pub),
		AgeRecipient: ageID.Recipient().String(), NKey: nkPub, HostVersion: Version, Protocol: protocol.Version})
	ctx, cancel := context.WithTimeout(ctx, joinWithin)
	defer cancel()
	reply, err := askToJoin(ctx, o, req)
	if err != nil {
		return nil, err
	}
	switch {
	case reply.OK:
	case reply.Error == protocol.JoinRefused:
		return nil, fmt.Errorf("%w: %s", ErrRefused, reply.Error)
	default:
		// Not a refusal (JoinFailed: ask again later): a new token would not
		// help, so the answer is not ErrRefused, whose hint asks for one.
		return nil, errors.New(reply.Error)
	}
	// The answer is sealed to this host's age identity: another connection
	// without credentials may see it, but not read it.
	g, err := protocol.OpenJoinGrant(reply.Sealed, ageID, o.Node)
	if err != nil {
		return nil, fmt.Errorf("the controller's answer: %w", err)
	}
	userJWT, err := jwt.ParseDecoratedJWT([]byte(g.Creds))
	if err != nil {
		return nil, fmt.Errorf("the controller's creds: %w", err)
	}
	creds, err := jwt.FormatUserConfig(userJWT, nkSeed)
	if err != nil {
		return nil, err
	}
	ck, err := base64.StdEncoding.DecodeString(g.ControllerKey)
	if err != nil || len(ck) != ed25519.PublicKeySize {
		return nil, errors.New("the controller's key is not an ed25519 public key")
	}
	urls := g.BrokerURLs
	if len(urls) == 0 {
		urls = []string{o.Broker}
	}
	st := &State{Dir: o.State, Node: o.Node, HostKey: priv, Age: ageID, Creds: string(creds), ControllerKey: ck, BrokerURLs: urls, WireGuard: wg}
	if !save {
		return st, nil
	}
	return st, st.save()
}

// joinWithin bounds a join, asking again included; one request waits
// askWithin for its answer, a little longer than the controller answers in.
const (
	joinWithin = time.Minute
	askWithin  = protocol.JoinAnswerWithin + time.Second
	// noRespondersFor is how long a join is asked again while the broker
	// says no one answers joins: the controller's connection moving to
	// another server of a cluster, or a server wiring the join account
	// to the controller's for the first connections at once. Past it, no
	// controller serves, and the join says so.
	noRespondersFor = 10 * time.Second
)

// errNoAnswer means a join request was not answered within askWithin: the
// controller did not admit it (it admits only what it can still answer),
// so it is safe to ask again.
var errNoAnswer = errors.New("no answer")

// askToJoin asks the controller to join as the join user, and asks again a
// moment later while the broker has no room for another connection without
// credentials or no time to finish its handshake, or the controller answers
// that it is busy or not at all: a rack of machines joining at once is
// admitted in turns. While the broker says no one answers, it asks again
// for noRespondersFor.
func askToJoin(ctx context.Context, o JoinOptions, req []byte) (protocol.JoinReply, error) {
	var noResponders time.Time
	for attempt := 1; ; attempt++ {
		reply, err := askOnce(ctx, o, req)
		if errors.Is(err, nats.ErrNoResponders) && noResponders.IsZero() {
			noResponders = time.Now()
		}
		busy := errors.Is(err, nats.ErrMaxAccountConnectionsExceeded) || errors.Is(err, errNoAnswer) || errors.Is(err, errHandshake) ||
			(err == nil && reply.Error == protocol.JoinBusy) ||
			(errors.Is(err, nats.ErrNoResponders) && time.Since(noResponders) < noRespondersFor)
		if !busy {
			return reply, err
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = errors.New(reply.Error)
			}
			return protocol.JoinReply{}, fmt.Errorf("ask to join: %w (is a controller serving?)", err)
		case <-time.After(backoff(attempt, joinRetryFirst, joinRetryMost)):
		}
	}
}

// How long a host turned away waits before it asks again: a random pause,
// so machines that were turned away together do not come back together,
// within a wait that doubles each time it is turned away (backoff). A rack
// of ten thousand machines comes back spread over seconds rather than all
// within the first, which would cost the broker a handshake for each one
// it turns away again.
const (
	joinRetryFirst = time.Second
	joinRetryMost  = 4 * time.Second
)

// errHandshake means the broker took the connection but did not finish its
// handshake in time: busy with others, as when a rack connects at once (a
// cluster of one's own nats-servers, unlike the embedded broker, pings a
// connection whose handshake it has not answered within two seconds, which
// the client takes for a failed handshake).
var errHandshake = errors.New("the broker took the connection but did not finish its handshake in time")

// handshakeBusy says whether a connection's error is the broker's being
// too busy to finish the handshake: it timed out, or the server's first
// ping came before its answer to the client's.
func handshakeBusy(err error) bool {
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		strings.Contains(err.Error(), "expected 'PONG', got 'PING'")
}

func askOnce(ctx context.Context, o JoinOptions, req []byte) (protocol.JoinReply, error) {
	// No credentials: the broker admits this connection as the join user,
	// which may ask to join and read its own answer, nothing else.
	nc, err := nats.Connect(o.Broker, nats.Name("mesh-host join "+o.Node), nats.Timeout(protocol.AnswerTimeout),
		nats.NoReconnect(), nats.CustomInboxPrefix(protocol.JoinInboxPrefix))
	if errors.Is(err, nats.ErrMaxAccountConnectionsExceeded) {
		return protocol.JoinReply{}, err
	}
	if err != nil && handshakeBusy(err) {
		return protocol.JoinReply{}, fmt.Errorf("%w: %w", errHandshake, err)
	}
	if err != nil {
		return protocol.JoinReply{}, &UnreachableError{URL: o.Broker, Err: err}
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, askWithin)
	defer cancel()
	msg, err := nc.RequestWithContext(ctx, protocol.JoinSubject, req)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
		return protocol.JoinReply{}, errNoAnswer
	}
	if err != nil {
		return protocol.JoinReply{}, fmt.Errorf("ask to join: %w (is a controller serving?)", err)
	}
	var reply protocol.JoinReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return protocol.JoinReply{}, fmt.Errorf("the controller's answer is not JSON: %w", err)
	}
	return reply, nil
}

func (s *State) save() error {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return err
	}
	if err := os.Chmod(s.Dir, 0o700); err != nil {
		return err
	}
	files := map[string]string{
		fileNode:       s.Node + "\n",
		fileHostKey:    base64.StdEncoding.EncodeToString(s.HostKey.Seed()) + "\n",
		fileAgeKey:     s.Age.String() + "\n",
		fileCreds:      s.Creds,
		fileController: base64.StdEncoding.EncodeToString(s.ControllerKey) + "\n",
		fileBroker:     strings.Join(s.BrokerURLs, "\n") + "\n",
		fileWireGuard:  s.WireGuard.String() + "\n",
	}
	for name, content := range files {
		if err := writeFile(filepath.Join(s.Dir, name), []byte(content)); err != nil {
			return err
		}
	}
	return nil
}

// writeFile writes a file of the state dir 0600 as every file of the root
// is written (writeAt): through a temporary file made exclusively beside it
// and a rename, so a crash leaves the old content or the new, never half,
// and no file or link already there is ever written through.
func writeFile(name string, b []byte) error {
	dir, err := unix.Open(filepath.Dir(name), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", filepath.Dir(name), err)
	}
	defer unix.Close(dir)
	if err := writeAt(dir, filepath.Base(name), b, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}

// Load reads a joined host's state dir.
func Load(dir string) (*State, error) {
	read := func(name string) (string, error) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("%s has no %s: join first with 'mesh-host join'", dir, name)
		}
		return strings.TrimSpace(string(b)), err
	}
	s := &State{Dir: dir}
	var err error
	if s.Node, err = read(fileNode); err != nil {
		return nil, err
	}
	seed, err := read(fileHostKey)
	if err != nil {
		return nil, err
	}
	raw, err := base64.StdEncoding.DecodeString(seed)
	if err != nil || len(raw) != ed25519.SeedSize {
		return nil, fmt.Errorf("%s: host.key is damaged", dir)
	}
	s.HostKey = ed25519.NewKeyFromSeed(raw)
	ageKey, err := read(fileAgeKey)
	if err != nil {
		return nil, err
	}
	if s.Age, err = age.ParseX25519Identity(ageKey); err != nil {
		return nil, fmt.Errorf("%s: age.key: %w", dir, err)
	}
	if s.Creds, err = read(fileCreds); err != nil {
		return nil, err
	}
	ck, err := read(fileController)
	if err != nil {
		return nil, err
	}
	if s.ControllerKey, err = base64.StdEncoding.DecodeString(ck); err != nil || len(s.ControllerKey) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("%s: controller.pub is damaged", dir)
	}
	urls, err := read(fileBroker)
	if err != nil {
		return nil, err
	}
	s.BrokerURLs = strings.Fields(urls)
	if err := s.loadKeys(); err != nil {
		return nil, err
	}
	// A host joined before the overlay has no WireGuard key: Runner.Run
	// makes it one (EnsureWireGuardKey), Load only reads.
	if b, err := os.ReadFile(filepath.Join(dir, fileWireGuard)); err == nil {
		if s.WireGuard, err = wgtypes.ParseKey(strings.TrimSpace(string(b))); err != nil {
			return nil, fmt.Errorf("%s: %s is damaged; move it away: mesh-host makes a new key when it starts, and its peers are declared the new one", dir, fileWireGuard)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return s, nil
}

// EnsureWireGuardKey makes the host a WireGuard key pair if it has none
// (joined before the overlay), the private key written 0600 in its state
// dir; a host that has one keeps it.
func (s *State) EnsureWireGuardKey() error {
	if s.WireGuard != (wgtypes.Key{}) {
		return nil
	}
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		return fmt.Errorf("make the WireGuard key: %w", err)
	}
	if err := writeFile(filepath.Join(s.Dir, fileWireGuard), []byte(k.String()+"\n")); err != nil {
		return err
	}
	s.WireGuard = k
	return nil
}

// ConnectOptions connect as this host's broker user, with the inbox prefix
// only it may read. The user is read at each (re)connection: a credential
// renewed while the host runs is the one its next connection presents.
func (s *State) ConnectOptions() ([]nats.Option, error) {
	if _, _, err := s.parsed(); err != nil {
		return nil, err
	}
	user := func() (string, error) {
		userJWT, _, err := s.parsed()
		return userJWT, err
	}
	sign := func(nonce []byte) ([]byte, error) {
		_, kp, err := s.parsed()
		if err != nil {
			return nil, err
		}
		return kp.Sign(nonce)
	}
	return []nats.Option{nats.UserJWT(user, sign), nats.Name("mesh-host " + s.Node),
		nats.CustomInboxPrefix(protocol.HostInboxPrefix(s.Node))}, nil
}

// parsed is the host's creds read: the user JWT and the nkey, read again
// only once they changed (renewed).
func (s *State) parsed() (string, nkeys.KeyPair, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.parsedKey == nil || s.parsedCreds != s.Creds {
		userJWT, kp, err := parseCreds(s.Creds)
		if err != nil {
			return "", nil, err
		}
		s.parsedCreds, s.parsedJWT, s.parsedKey = s.Creds, userJWT, kp
	}
	return s.parsedJWT, s.parsedKey, nil
}

// parseCreds reads a .creds document: the user JWT and the nkey.
func parseCreds(creds string) (string, nkeys.KeyPair, error) {
	userJWT, err := jwt.ParseDecoratedJWT([]byte(creds))
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", fileCreds, err)
	}
	kp, err := jwt.ParseDecoratedNKey([]byte(creds))
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", fileCreds, err)
	}
	return userJWT, kp, nil
}
