// Package broker runs the embedded NATS server in operator mode, and signs
// the JWTs of the controller's operator, its account and every broker user.
package broker

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// Keys are the broker's signing keys, kept in the identity store: the
// operator's, the mesh account's and the system account's.
type Keys struct {
	Operator nkeys.KeyPair
	Account  nkeys.KeyPair
	System   nkeys.KeyPair
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
	return k, nil
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

// Permissions are what a user may publish and subscribe to.
type Permissions struct {
	Publish   []string `json:"publish"`
	Subscribe []string `json:"subscribe"`
	// Respond lets the user answer requests made to it (one reply each).
	Respond bool `json:"respond,omitempty"`
}

// IssueUser signs a user JWT in the mesh account for the nkey userPub. A
// bearer user connects with the JWT alone.
func (k Keys) IssueUser(name, userPub string, p Permissions, bearer bool) (string, error) {
	uc := jwt.NewUserClaims(userPub)
	uc.Name = name
	uc.BearerToken = bearer
	uc.Pub.Allow.Add(p.Publish...)
	uc.Sub.Allow.Add(p.Subscribe...)
	if len(p.Publish) == 0 {
		uc.Pub.Deny.Add(">")
	}
	if len(p.Subscribe) == 0 {
		uc.Sub.Deny.Add(">")
	}
	if p.Respond {
		uc.Resp = &jwt.ResponsePermission{MaxMsgs: 1}
	}
	return uc.Encode(k.Account)
}

// NewUser makes a fresh user nkey and its JWT: for the controller's own
// connections, which are made anew by each process, and for modules.
func (k Keys) NewUser(name string, p Permissions) (userJWT string, seed []byte, err error) {
	u, err := nkeys.CreateUser()
	if err != nil {
		return "", nil, err
	}
	pub, _ := u.PublicKey()
	if userJWT, err = k.IssueUser(name, pub, p, false); err != nil {
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
// operator, the mesh and system accounts, and the default sentinel that
// admits a connection without credentials as the join user.
type Trust struct {
	Operator    *jwt.OperatorClaims
	OperatorJWT string
	AccountPub  string
	AccountJWT  string
	SystemPub   string
	SystemJWT   string
	// Sentinel is the bearer user JWT a connection without credentials gets.
	Sentinel string
}

// Trust signs the operator and account JWTs and the sentinel user with the
// given (join) permissions; the account JWT revokes the revoked users.
func (k Keys) Trust(sentinel Permissions, revoked map[string]time.Time) (Trust, error) {
	opPub, _ := k.Operator.PublicKey()
	accPub, _ := k.Account.PublicKey()
	sysPub, _ := k.System.PublicKey()
	oc := jwt.NewOperatorClaims(opPub)
	oc.Name = "mesh-controller"
	oc.SystemAccount = sysPub
	opJWT, err := oc.Encode(k.Operator)
	if err != nil {
		return Trust{}, err
	}
	ac := jwt.NewAccountClaims(accPub)
	ac.Name = "mesh"
	for pub, at := range revoked {
		ac.RevokeAt(pub, at)
	}
	accJWT, err := ac.Encode(k.Operator)
	if err != nil {
		return Trust{}, err
	}
	sc := jwt.NewAccountClaims(sysPub)
	sc.Name = "system"
	sysJWT, err := sc.Encode(k.Operator)
	if err != nil {
		return Trust{}, err
	}
	join, err := nkeys.CreateUser()
	if err != nil {
		return Trust{}, err
	}
	joinPub, _ := join.PublicKey()
	sentinelJWT, err := k.IssueUser("join", joinPub, sentinel, true)
	if err != nil {
		return Trust{}, err
	}
	decoded, err := jwt.DecodeOperatorClaims(opJWT)
	if err != nil {
		return Trust{}, err
	}
	return Trust{Operator: decoded, OperatorJWT: opJWT, AccountPub: accPub, AccountJWT: accJWT,
		SystemPub: sysPub, SystemJWT: sysJWT, Sentinel: sentinelJWT}, nil
}

// Server is the embedded NATS server.
type Server struct {
	srv      *server.Server
	resolver *server.MemAccResolver
}

// Start starts the embedded server on listen (host:port; port 0 picks a free
// one) in operator mode, and waits until it takes connections.
func Start(listen string, t Trust) (*Server, error) {
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
	if err := resolver.Store(t.AccountPub, t.AccountJWT); err != nil {
		return nil, err
	}
	if err := resolver.Store(t.SystemPub, t.SystemJWT); err != nil {
		return nil, err
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
		MaxPayload:       8 << 20,
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded broker: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, errors.New("embedded broker: not ready after 10s (is the address in use?)")
	}
	return &Server{srv: srv, resolver: resolver}, nil
}

// UpdateAccount gives the running server the account JWT of t: users it
// revokes are disconnected at once (a revoked user is not disconnected by
// itself otherwise).
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
}

// JWTBlock is the JWT half of a .creds document, for a party that holds the
// seed itself and joins the two.
func JWTBlock(userJWT string) string {
	return "-----BEGIN NATS USER JWT-----\n" + userJWT + "\n------END NATS USER JWT------\n"
}
