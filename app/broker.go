package app

import (
	"context"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go"

	"mesh-controller/app/daemon"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/identity"
	"mesh-controller/contexts/inventory"
	"mesh-controller/embedded/broker"
)

// The broker users of protocol.md, each with exactly what its role needs,
// in four accounts the operator signs:
//
//	account  user                      publish                         subscribe                          largest message
//	mesh     controller                mesh.>  _INBOX.>                mesh.>  _INBOX.>                   the server's (8 MiB)
//	                                   $JS.API.>  $JS.FC.>  $O.>
//	mesh     host of node N            mesh.node.N.>                   mesh.node.N.inbox.>  _INBOX.N.>    1 MiB
//	mesh     module M on node N        _INBOX.*.*  mesh.module.<emits> mesh.tool.M.*  mesh.tool.M.*.N  mesh.module.<consumes>  1 MiB
//	                                   + a builder's, for the build seat's holder (builderPermissions)
//	admit    controller (joins)        _R_.>                           mesh.join                          the server's
//	join     join (no credentials)     mesh.join (admit's service)     _INBOX.join.>                      4 KiB, 2 subscriptions, 1024 connections
//	system   controller (an external  $SYS.REQ.CLAIMS.UPDATE          _INBOX.>                           the server's
//	         broker only)              $SYS.REQ.SERVER.PING.JSZ
//	         (and the server's own)
//
// Archives (protocol.md, "Added in the second round") are kept in the mesh
// account's JetStream object store, bucket mesh-archives, and only the
// controller uses the JetStream API (issue 28). Whoever may use it chooses
// where the server publishes its answer (the request's reply subject), a
// pull's deliveries (the pull request's reply subject) and a push
// consumer's (its deliver subject): the server checks none of them against
// the user's permissions (embedded/broker's TestServer_JetStreamAnswersAnywhere),
// so a host that could pull or make a consumer could have the server
// publish a stored chunk, bytes a builder chose, into another host's inbox
// or onto mesh.build.ask.B; and whoever may publish to the bucket's
// subjects chooses its headers (Nats-Rollup purges the stream, a delete
// marker removes an archive). So a host reads an archive declared to it a
// piece at a time from the controller (mesh.node.N.archive), and a builder
// hands the controller the pieces of an archive its build made
// (mesh.build.archive.B), which the controller stores under their digest
// unless it holds that archive already (app/archive's Server): neither has
// a subject of JetStream's, $JS.>, $O.>, $KV.> or $JSC.>, to publish to.
//
// No user is given a NATS response permission (allow_responses): the server
// lets such a user publish on any reply subject it was handed, its deny list
// notwithstanding (embedded/broker's TestServer_ResponsePermissionIgnoresDeny),
// so two modules could relay each other onto mesh.alert or a host's inbox.
// A module that answers requests is allowed answerInboxes instead; a host
// answers under its own subjects, where every request to it asks to be
// answered (protocol.AnswerSubject).

// answerInboxes is where modules and builders may answer a request: a
// requester's inbox as nats.go makes it by default (_INBOX.<id>.<n>), never
// a mesh. subject, and never a host's inbox, which is one token deeper
// (_INBOX.<node>.<id>.<n>); the join inbox is in another account.
const answerInboxes = "_INBOX.*.*"

// What the broker lets each kind of user send (issue 11, item 8). The
// server closes a connection that publishes a larger message, before it
// reads it; nats.go learns the cap from the server and refuses by itself.
const (
	// joinMaxPayload: a join request is under 1 KiB (a token of at most 64
	// characters, a node name, three public keys and a version).
	joinMaxPayload = 4 << 10
	// joinMaxSubs: a joining host holds one subscription (its answers).
	joinMaxSubs = 2
	// joinMaxConns: anonymous connections at once. Each costs the broker
	// 50–65 KB idle (lessons.md), so this bounds them at about 64 MiB; past
	// it the server refuses a connection and the host asks again.
	joinMaxConns = 1024
	// memberMaxPayload is a host's or a module's largest message, NATS's
	// own default: a heartbeat or an apply report is a few KB, a data report
	// of several thousand data sets fits.
	memberMaxPayload = 1 << 20
)

// controllerPermissions: the controller makes the archives bucket when it
// starts serving (the JetStream API), reads archives (flow control answers
// to its fetches' deliveries) and may let them go ($O.>, the collection).
func controllerPermissions() broker.Permissions {
	return broker.Permissions{Publish: []string{"mesh.>", "_INBOX.>", "$JS.API.>", "$JS.FC.>", "$O.>"},
		Subscribe: []string{"mesh.>", "_INBOX.>"}}
}

// mergePermissions is a with b's subjects added; b's limits apply where a
// has none.
func mergePermissions(a, b broker.Permissions) broker.Permissions {
	a.Publish = append(slices.Clip(a.Publish), b.Publish...)
	a.Subscribe = append(slices.Clip(a.Subscribe), b.Subscribe...)
	if a.MaxPayload == 0 {
		a.MaxPayload = b.MaxPayload
	}
	if a.MaxSubs == 0 {
		a.MaxSubs = b.MaxSubs
	}
	return a
}

// admitPermissions are the controller's connection that answers joins, in
// the admit account: it hears mesh.join and answers where the server maps
// the reply of a request that came through a service import (_R_.…), and
// can reach nothing of the mesh account.
func admitPermissions() broker.Permissions {
	return broker.Permissions{Publish: []string{"_R_.>"}, Subscribe: []string{protocol.JoinSubject}}
}

// joinUser admits a connection with no credentials into the join account:
// it may ask to join (through the admit account's mesh.join service) and
// read the answers in its inbox, nothing else, and send nothing larger than
// a join request.
func joinUser() broker.JoinUser {
	return broker.JoinUser{
		Permissions: broker.Permissions{Publish: []string{protocol.JoinSubject}, Subscribe: []string{protocol.JoinInboxPrefix + ".>"},
			MaxPayload: joinMaxPayload, MaxSubs: joinMaxSubs},
		Services:     []string{protocol.JoinSubject},
		MaxConns:     joinMaxConns,
		AnswerWithin: protocol.JoinAnswerWithin,
	}
}

// hostPermissions: a host reports under its node's subjects (its reads of
// archives among them, mesh.node.N.archive) and hears its inbox. The
// broker keeps each connection's entries in trees of its own (about 1 KB
// an entry, 10 MB at 10,000 hosts: BenchmarkBrokerConnection), so a host
// has as few as its protocol allows: three.
//
// Publish is one entry: the controller's requests to a host (logs, look,
// backup, restore) carry a reply subject under the host's own subjects
// (protocol.AnswerSubject), so mesh.node.N.> covers its answers too, and a
// host may answer in no other inbox. Hosts of protocol 1.0 and 1.1 answer
// on whatever reply subject they are handed, so a host rolled back to one
// of them keeps answering with these credentials.
//
// Subscribe stays two entries: a host hears the controller in
// mesh.node.N.inbox.> and the answers to its own requests (its declaration,
// its reports, a credential renewal, archive pieces) in _INBOX.N.>, the
// inbox its connection names (protocol.HostInboxPrefix). No one subject
// covers both and nothing more (the broker's wildcards match whole
// tokens). A new host could take its answers under mesh.node.N.inbox., but a
// host of protocol 1.0 or 1.1 (the releases before, to which a
// self-upgrade rolls back) takes every answer under _INBOX.N.: holding
// credentials without it, its subscription there is refused and every
// request it makes (its declaration, its apply reports, a renewal) goes
// unanswered.
func hostPermissions(node string) broker.Permissions {
	return broker.Permissions{
		Publish:    []string{"mesh.node." + node + ".>"},
		Subscribe:  []string{"mesh.node." + node + ".inbox.>", protocol.HostInboxPrefix(node) + ".>"},
		MaxPayload: memberMaxPayload,
	}
}

// HostPermissions are what the host of node may do on the broker: the load
// bench gives the same to each connection of a bare nats-server, the floor
// the controller's memory is measured beside.
func HostPermissions(node string) broker.Permissions { return hostPermissions(node) }

// ControllerPermissions are the controller's own user's, for the same bench.
func ControllerPermissions() broker.Permissions { return controllerPermissions() }

// brokerKeys reads the broker's keys from the identity store.
func brokerKeys(ctx context.Context, ids *identity.Store) (broker.Keys, error) {
	seeds, err := ids.BrokerSeeds(ctx)
	if err != nil {
		return broker.Keys{}, err
	}
	return broker.KeysFromSeeds(seeds.Operator, seeds.Account, seeds.System)
}

// trustOf is what a broker must hold to trust this controller, with every
// revoked user revoked in the account: the embedded broker, or an external
// one (a cluster).
func trustOf(ctx context.Context, ids *identity.Store, keys broker.Keys, external bool) (broker.Trust, error) {
	revoked, err := ids.Revoked(ctx)
	if err != nil {
		return broker.Trust{}, err
	}
	if external {
		return keys.ClusterTrust(joinUser(), revoked)
	}
	return keys.Trust(joinUser(), revoked)
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
func (c uses) brokerURL(ctx context.Context, ids *identity.Store) (string, error) {
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
func (c uses) dialBroker(ctx context.Context, ids *identity.Store) (*nats.Conn, error) {
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
	// MaxPayload is its largest message in bytes; 0 is the server's limit.
	MaxPayload int64 `json:"max_payload,omitempty"`
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
	Serving  bool   `json:"serving"`
	External bool   `json:"external"`
	Operator string `json:"operator"`
	Account  string `json:"account"`
	// JoinAccount is where connections without credentials land;
	// AdmitAccount where the controller answers their joins.
	JoinAccount  string     `json:"join_account"`
	AdmitAccount string     `json:"admit_account"`
	Users        []UserView `json:"users"`
	// Trust is set for an external broker: its configuration.
	Trust *ExternalTrust `json:"trust,omitempty"`
	// Controllers says which controller serves and which stand by.
	Controllers ControllersView `json:"controllers"`
}

// DefaultListen is where serve's embedded broker listens unless told otherwise.
const DefaultListen = "127.0.0.1:4222"

// BrokerShow tells where the broker is, its account, and the permissions of
// each kind of user; with an external broker, the trust it must hold.
func (c *Nodes) BrokerShow(ctx context.Context) (BrokerView, error) {
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
	v.JoinAccount, _ = keys.Join.PublicKey()
	v.AdmitAccount, _ = keys.Admit.PublicKey()
	if v.Controllers, err = controllersOf(ctx, ids, c.Now()); err != nil {
		return BrokerView{}, err
	}
	// Serving means ready: the lease names the broker only once it answers.
	if l, err := ids.Lease(ctx); err == nil && l != nil && l.ExpiresAt.After(c.Now()) && l.BrokerURL != "" {
		v.Serving = true
		if !v.External {
			v.URLs = []string{l.BrokerURL}
		}
	}
	switch {
	case v.External:
		v.URLs = daemon.SplitURLs(c.Broker)
		trust, err := trustOf(ctx, ids, keys, true)
		if err != nil {
			return BrokerView{}, err
		}
		v.Trust = &ExternalTrust{OperatorJWT: trust.OperatorJWT, SystemAccount: trust.SystemPub,
			ResolverPreload: trust.Preload(),
			DefaultSentinel: trust.Sentinel}
	case v.URLs == nil:
		v.URLs = []string{"nats://" + DefaultListen}
	}
	for _, u := range []struct {
		name string
		p    broker.Permissions
	}{
		{"controller", controllerPermissions()},
		{"controller answering joins (in the admit account)", admitPermissions()},
		{"join (a connection without credentials, in the join account)", joinUser().Permissions},
		{"host of node N", hostPermissions("N")},
		{"module M on node N", modulePermissions(inventory.Manifest{Module: "M", Emits: []string{"EMITS"}, Consumes: []string{"CONSUMES"}}, "N")},
		{"builder on node N (added to the module user of the build seat's holder)", builderPermissions("N")},
		{"backup holder on node N (added to the module user of the backup seat's holder)", backupPermissions("N")},
		{"controller pushing account JWTs (in the system account, with an external broker)", broker.SystemPermissions()},
	} {
		v.Users = append(v.Users, UserView{User: u.name, Publish: u.p.Publish, Subscribe: u.p.Subscribe, MaxPayload: u.p.MaxPayload})
	}
	return v, nil
}

// BrokerConfigRequest says which server of a cluster a configuration is for.
type BrokerConfigRequest = broker.ClusterNode

// BrokerConfig is the nats-server configuration of one server of the
// broker cluster a grown mesh uses instead of the embedded broker
// (serve --broker with every server's URL): it trusts this controller's
// operator, preloads the mesh's accounts into a full resolver the
// controller then keeps current, and runs JetStream for the archives.
func (c *Nodes) BrokerConfig(ctx context.Context, n BrokerConfigRequest) (string, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return "", err
	}
	keys, err := brokerKeys(ctx, st.Identity)
	if err != nil {
		return "", err
	}
	trust, err := trustOf(ctx, st.Identity, keys, true)
	if err != nil {
		return "", err
	}
	return broker.ServerConfig(trust, n), nil
}
