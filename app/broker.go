package app

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"

	"mesh-controller/app/daemon"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/identity"
	"mesh-controller/embedded/broker"
)

// The broker users of protocol.md, each with exactly what its role needs.

func controllerPermissions() broker.Permissions {
	return broker.Permissions{Publish: []string{"mesh.>", "_INBOX.>"}, Subscribe: []string{"mesh.>", "_INBOX.>"}}
}

// joinPermissions admit a connection with no credentials as the join user:
// it may ask to join and read its own answer, nothing else.
func joinPermissions() broker.Permissions {
	return broker.Permissions{Publish: []string{protocol.JoinSubject}, Subscribe: []string{protocol.JoinInboxPrefix + ".>"}}
}

func hostPermissions(node string) broker.Permissions {
	return broker.Permissions{
		Publish:   []string{"mesh.node." + node + ".>"},
		Subscribe: []string{"mesh.node." + node + ".inbox.>", protocol.HostInboxPrefix(node) + ".>"},
	}
}

// brokerKeys reads the broker's keys from the identity store.
func brokerKeys(ctx context.Context, ids *identity.Store) (broker.Keys, error) {
	seeds, err := ids.BrokerSeeds(ctx)
	if err != nil {
		return broker.Keys{}, err
	}
	return broker.KeysFromSeeds(seeds.Operator, seeds.Account, seeds.System)
}

// trustOf is what a broker must hold to trust this controller, with every
// revoked user revoked in the account.
func trustOf(ctx context.Context, ids *identity.Store, keys broker.Keys) (broker.Trust, error) {
	revoked, err := ids.Revoked(ctx)
	if err != nil {
		return broker.Trust{}, err
	}
	return keys.Trust(joinPermissions(), revoked)
}

// RevokedSubject is where a person's command tells the serving controller
// that users were revoked; only controller users may publish under mesh.control.
const RevokedSubject = daemon.RevokedSubject

func newBrokerSeeds() (identity.BrokerSeeds, error) {
	op, acc, sys, err := broker.NewSeeds()
	return identity.BrokerSeeds{Operator: op, Account: acc, System: sys}, err
}

// ErrBrokerUnreachable means no broker answered: no controller serves, or
// --broker points nowhere.
var ErrBrokerUnreachable = daemon.ErrBrokerUnreachable

// brokerURL is where a person's command reaches the broker: --broker, else
// the live lease's.
func (c *Controller) brokerURL(ctx context.Context, ids *identity.Store) (string, error) {
	if c.Broker != "" {
		return c.Broker, nil
	}
	l, err := ids.Lease(ctx)
	if err != nil {
		return "", err
	}
	if l == nil || !l.ExpiresAt.After(c.Now()) || l.BrokerURL == "" {
		return "", fmt.Errorf("%w: no controller is serving", ErrBrokerUnreachable)
	}
	return l.BrokerURL, nil
}

// dialBroker connects a person's command to the broker as a fresh controller
// user; ErrBrokerUnreachable if none answers within a few seconds.
func (c *Controller) dialBroker(ctx context.Context, ids *identity.Store) (*nats.Conn, error) {
	url, err := c.brokerURL(ctx, ids)
	if err != nil {
		return nil, err
	}
	keys, err := brokerKeys(ctx, ids)
	if err != nil {
		return nil, err
	}
	userJWT, seed, err := keys.NewUser("controller-command", controllerPermissions())
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(url, nats.UserJWTAndSeed(userJWT, string(seed)), nats.Name("mesh-controller command"),
		nats.Timeout(protocol.AnswerTimeout), nats.NoReconnect())
	if err != nil {
		return nil, fmt.Errorf("%w at %s: %v", ErrBrokerUnreachable, url, err)
	}
	return nc, nil
}

// UserView is one kind of broker user and what it may do.
type UserView struct {
	User      string   `json:"user"`
	Publish   []string `json:"publish"`
	Subscribe []string `json:"subscribe"`
}

// ExternalTrust is what an external NATS server must be configured with to
// trust this controller's operator.
type ExternalTrust struct {
	OperatorJWT     string            `json:"operator_jwt"`
	SystemAccount   string            `json:"system_account"`
	ResolverPreload map[string]string `json:"resolver_preload"`
	DefaultSentinel string            `json:"default_sentinel"`
}

// BrokerView tells where hosts should dial and what each user may do.
type BrokerView struct {
	URLs []string `json:"urls"`
	// Serving says a controller holds the lease now (for the embedded broker).
	Serving  bool       `json:"serving"`
	External bool       `json:"external"`
	Operator string     `json:"operator"`
	Account  string     `json:"account"`
	Users    []UserView `json:"users"`
	// Trust is set for an external broker: its configuration.
	Trust *ExternalTrust `json:"trust,omitempty"`
}

// DefaultListen is where serve's embedded broker listens unless told otherwise.
const DefaultListen = "127.0.0.1:4222"

// BrokerShow tells where the broker is, its account, and the permissions of
// each kind of user; with an external broker, the trust it must hold.
func (c *Controller) BrokerShow(ctx context.Context) (BrokerView, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return BrokerView{}, err
	}
	ids := st.Identity
	keys, err := brokerKeys(ctx, ids)
	if err != nil {
		return BrokerView{}, err
	}
	v := BrokerView{External: c.Broker != ""}
	v.Operator, _ = keys.Operator.PublicKey()
	v.Account, _ = keys.Account.PublicKey()
	// Serving means ready: the lease names the broker only once it answers.
	if l, err := ids.Lease(ctx); err == nil && l != nil && l.ExpiresAt.After(c.Now()) && l.BrokerURL != "" {
		v.Serving = true
		if !v.External {
			v.URLs = []string{l.BrokerURL}
		}
	}
	switch {
	case v.External:
		v.URLs = []string{c.Broker}
		trust, err := trustOf(ctx, ids, keys)
		if err != nil {
			return BrokerView{}, err
		}
		v.Trust = &ExternalTrust{OperatorJWT: trust.OperatorJWT, SystemAccount: trust.SystemPub,
			ResolverPreload: map[string]string{trust.AccountPub: trust.AccountJWT, trust.SystemPub: trust.SystemJWT},
			DefaultSentinel: trust.Sentinel}
	case v.URLs == nil:
		v.URLs = []string{"nats://" + DefaultListen}
	}
	for _, u := range []struct {
		name string
		p    broker.Permissions
	}{
		{"controller", controllerPermissions()},
		{"join (a connection without credentials)", joinPermissions()},
		{"host of node N", hostPermissions("N")},
	} {
		v.Users = append(v.Users, UserView{User: u.name, Publish: u.p.Publish, Subscribe: u.p.Subscribe})
	}
	return v, nil
}
