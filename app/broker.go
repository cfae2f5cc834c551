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
//	mesh     host of node N             mesh.node.N.>  _INBOX.*.*       mesh.node.N.inbox.>  _INBOX.N.>    1 MiB
//	                                   + archive reads (below)
//	mesh     module M on node N        _INBOX.*.*  mesh.module.<emits> mesh.tool.M.*  mesh.tool.M.*.N  mesh.module.<consumes>  1 MiB
//	                                   + archive writes, for the build seat's holder (below)
//	admit    controller (joins)        _R_.>                           mesh.join                          the server's
//	join     join (no credentials)     mesh.join (admit's service)     _INBOX.join.>                      4 KiB, 2 subscriptions, 1024 connections
//	system   controller (an external  $SYS.REQ.CLAIMS.UPDATE          _INBOX.>                           the server's
//	         broker only)              $SYS.REQ.SERVER.PING.JSZ
//	         (and the server's own)
//
// Archives (protocol.md, "Added in the second round") are kept in the mesh
// account's JetStream object store, bucket mesh-archives (stream
// OBJ_mesh-archives, chunks on $O.mesh-archives.C.<nuid>, each object's
// meta on $O.mesh-archives.M.<name>): archiveReadPermissions are what a
// host needs to read one by name with nats.go's jetstream ObjectStore,
// builderArchivePermissions what a builder needs to write one, and nothing
// else; the controller, which makes the bucket, has all of it. The answers
// of the JetStream API and a fetch's deliveries come to the user's own
// inbox, which it subscribes to already.
//
// Whoever may use the JetStream API chooses where the server publishes its
// answer (the request's reply subject) and, for a push consumer, its
// deliveries (the consumer's deliver subject): the server checks neither
// against the user's permissions (embedded/broker's
// TestServer_JetStreamAnswersAnywhere). So a host could make the server
// publish a stored archive chunk, and a builder a JSON answer, on any mesh
// subject: what the mesh reads from a subject is trusted for what it
// verifies (a host's signature, the controller's envelope), never for the
// subject it arrived on. The bucket answers no direct get (its stream has
// allow_direct off), so an answer is always a JetStream JSON document,
// never bytes a builder stored.
//
// No user is given a NATS response permission (allow_responses): the server
// lets such a user publish on any reply subject it was handed, its deny list
// notwithstanding (embedded/broker's TestServer_ResponsePermissionIgnoresDeny),
// so two modules could relay each other onto mesh.alert or a host's inbox.
// A user that answers requests is allowed answerInboxes instead.

// answerInboxes is where hosts and modules may answer a request: a
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

// The JetStream subjects of the archives bucket, as nats.go's jetstream
// ObjectStore uses them.
const (
	// archiveStream is the bucket's stream.
	archiveStream = "OBJ_" + protocol.ArchiveBucket
	// archiveChunks is where an object's bytes are, in chunks, on a subject
	// of its own ($O.<bucket>.C.<nuid>); archiveMeta where each object's
	// meta is ($O.<bucket>.M.<base64 of its name>).
	archiveChunks = "$O." + protocol.ArchiveBucket + ".C."
	archiveMeta   = "$O." + protocol.ArchiveBucket + ".M."
	// jsAPI prefixes the JetStream API's subjects.
	jsAPI = "$JS.API."
)

// archiveReadPermissions are what reading an archive by name takes
// (archive.Get), merged into a host's permissions: the bucket's stream
// info (looking the bucket up), the last message of a meta subject (the
// object's meta: its size, digest and chunks' subject; the body of a
// message get names the subject), a pull consumer of one object's chunks,
// created filtered to a chunk subject, pulled from a batch at a time, and
// deleted when the fetch ends. The batches come to the user's own inbox
// (a host's is _INBOX.<node>.>, already its own). A consumer's name is
// random, so another host cannot guess it to pull from it. Nothing here
// writes to the bucket, deletes an object or purges.
func archiveReadPermissions() broker.Permissions {
	return broker.Permissions{Publish: []string{
		jsAPI + "STREAM.INFO." + archiveStream,
		jsAPI + "STREAM.MSG.GET." + archiveStream,
		jsAPI + "CONSUMER.CREATE." + archiveStream + ".*." + archiveChunks + "*",
		jsAPI + "CONSUMER.MSG.NEXT." + archiveStream + ".*",
		jsAPI + "CONSUMER.DELETE." + archiveStream + ".*",
	}}
}

// builderArchivePermissions are what writing an archive takes (ObjectStore
// Put), for the user of a module holding the build seat: the bucket's
// stream info (looking it up), the last message of a meta subject (Put and
// PutArchive first look for an object of that name), and publishing chunks
// and a meta. Archives are named by their digest, so an object is never
// put twice and never needs replacing: a builder may not purge the stream,
// delete a message or an object's chunks, nor create, change or delete a
// stream or a consumer. Its publish acknowledgements and API answers come
// to its own inbox (app/builder's BuilderInbox), which the user it is
// merged into must subscribe to.
func builderArchivePermissions() broker.Permissions {
	return broker.Permissions{Publish: []string{
		jsAPI + "STREAM.INFO." + archiveStream,
		jsAPI + "STREAM.MSG.GET." + archiveStream,
		archiveChunks + ">",
		archiveMeta + ">",
	}}
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

// hostPermissions: a host reports under its node's subjects, hears its
// inbox, and reads archives (archiveReadPermissions).
func hostPermissions(node string) broker.Permissions {
	return mergePermissions(broker.Permissions{
		// answerInboxes: a host answers the controller's requests to it
		// (mesh.node.N.inbox.logs, mesh.node.N.inbox.look).
		Publish:    []string{"mesh.node." + node + ".>", answerInboxes},
		Subscribe:  []string{"mesh.node." + node + ".inbox.>", protocol.HostInboxPrefix(node) + ".>"},
		MaxPayload: memberMaxPayload,
	}, archiveReadPermissions())
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
		{"archive writes (added to the module user of the build seat's holder)", builderArchivePermissions()},
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
func (c *Controller) BrokerConfig(ctx context.Context, n BrokerConfigRequest) (string, error) {
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
