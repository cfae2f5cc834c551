package broker

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// A mesh that outgrows the embedded broker points the controller at a NATS
// cluster of its own (several nats-server processes): ServerConfig is what
// each of its servers is configured with, and the controller keeps the
// cluster's account JWTs current itself, through the system account
// (PushAccount), whose key it holds already.

// ClusterNode is what differs between the servers of one cluster: the rest
// of their configuration is the same on every one.
type ClusterNode struct {
	// Name is the server's name, unique in the cluster (JetStream needs it).
	Name string
	// Listen is where clients dial (host:port); ClusterListen where the
	// other servers route to (host:port).
	Listen, ClusterListen string
	// Routes are every server's route URL (nats-route://host:port), its own
	// among them: the server skips its own.
	Routes []string
	// Dir is where the server keeps the account JWTs its resolver holds
	// (Dir/jwt) and JetStream's files (Dir/jetstream).
	Dir string
}

// ClusterName is the cluster's name in ServerConfig.
const ClusterName = "mesh"

// ServerConfig is one cluster server's nats-server configuration trusting
// t: the operator, the system account, a full resolver that keeps the
// accounts' JWTs in files and takes updates from the system account
// (preloaded with the mesh's accounts, so a server knows them before the
// controller first pushes), the sentinel that admits a connection without
// credentials as the join user, JetStream bounded as the embedded broker's
// is, and the cluster block.
func ServerConfig(t Trust, n ClusterNode) string {
	var b strings.Builder
	q := strconv.Quote
	fmt.Fprintf(&b, "# nats-server configuration of one server of the mesh's broker cluster,\n")
	fmt.Fprintf(&b, "# printed by 'mesh-controller broker show --config'. Every server takes\n")
	fmt.Fprintf(&b, "# the same but for server_name, listen, cluster.listen and the directories.\n")
	fmt.Fprintf(&b, "server_name: %s\n", q(n.Name))
	fmt.Fprintf(&b, "listen: %s\n", q(n.Listen))
	fmt.Fprintf(&b, "max_payload: %d\n", maxPayload)
	fmt.Fprintf(&b, "# a crowd of hosts coming back at once is authenticated in turn\n")
	fmt.Fprintf(&b, "authorization: { timeout: %g }\n", AuthTimeout.Seconds())
	fmt.Fprintf(&b, "\n# the mesh's operator and its system account\n")
	fmt.Fprintf(&b, "operator: %s\n", q(t.OperatorJWT))
	fmt.Fprintf(&b, "system_account: %s\n", q(t.SystemPub))
	fmt.Fprintf(&b, "# a connection without credentials lands in the join account\n")
	fmt.Fprintf(&b, "default_sentinel: %s\n", q(t.Sentinel))
	fmt.Fprintf(&b, "\n# the controller pushes account updates (revoked users) to this resolver;\n")
	fmt.Fprintf(&b, "# the servers compare what they hold every 5 s, so one that was away\n")
	fmt.Fprintf(&b, "# takes what it missed when it is back\n")
	fmt.Fprintf(&b, "resolver: {\n  type: full\n  dir: %s\n  allow_delete: false\n  interval: \"5s\"\n  timeout: \"5s\"\n}\n", q(n.Dir+"/jwt"))
	fmt.Fprintf(&b, "resolver_preload: {\n")
	preload := t.Preload()
	for _, pub := range slices.Sorted(maps.Keys(preload)) {
		fmt.Fprintf(&b, "  %s: %s\n", pub, q(preload[pub]))
	}
	fmt.Fprintf(&b, "}\n")
	fmt.Fprintf(&b, "\n# the archives bucket; every write on disk before it is acknowledged\n")
	fmt.Fprintf(&b, "jetstream: {\n  store_dir: %s\n  max_file_store: %d\n  max_memory_store: %d\n  sync_interval: always\n}\n",
		q(n.Dir+"/jetstream"), MaxStore, maxMemory)
	fmt.Fprintf(&b, "\ncluster: {\n  name: %s\n  listen: %s\n  routes: [\n", q(ClusterName), q(n.ClusterListen))
	for _, r := range n.Routes {
		fmt.Fprintf(&b, "    %s\n", q(r))
	}
	fmt.Fprintf(&b, "  ]\n}\n")
	return b.String()
}

// SystemPermissions are the controller's own user in the system account:
// it pushes account JWTs and asks the servers about JetStream, nothing else.
func SystemPermissions() Permissions {
	return Permissions{Publish: []string{claimsUpdate, jszPing}, Subscribe: []string{"_INBOX.>"}}
}

// NewSystemUser makes a fresh user of the system account, signed with its
// key, which the controller keeps with the operator's (identity's broker
// seeds): it needs no credential given to it by the cluster's operator.
func (k Keys) NewSystemUser(name string) (userJWT string, seed []byte, err error) {
	return newUser(k.System, name, SystemPermissions())
}

// The system account's subjects the controller uses.
const (
	// claimsUpdate is where a full resolver takes an account's JWT.
	claimsUpdate = "$SYS.REQ.CLAIMS.UPDATE"
	// jszPing asks every server for its JetStream's state.
	jszPing = "$SYS.REQ.SERVER.PING.JSZ"
	// answersSettle is how long answers from further servers are waited for
	// after the first.
	answersSettle = 300 * time.Millisecond
)

// ErrNoResolver means no server took an account JWT: none of the broker's
// servers has a full resolver (a broker configured otherwise, or an old
// configuration), and a person must give it the JWT.
var ErrNoResolver = errors.New("no broker server took the account JWT: give the broker a full resolver ('mesh-controller broker show --config')")

// PushAccount gives the mesh account's JWT of t to the full resolver of
// every server that hears nc, a system account connection: each keeps it
// and applies it at once (users it revokes are disconnected), and a server
// away now takes it from the others when it comes back. taken counts the
// servers that said they kept it; an error a server gave is returned with
// it.
func PushAccount(nc *nats.Conn, t Trust, within time.Duration) (taken int, err error) {
	var refused []string
	err = gather(nc, claimsUpdate, []byte(t.AccountJWT), within, func(b []byte) {
		var a struct {
			Data *struct {
				Code int `json:"code"`
			} `json:"data"`
			Error *struct {
				Description string `json:"description"`
			} `json:"error"`
		}
		switch {
		case json.Unmarshal(b, &a) != nil:
			refused = append(refused, "an answer that is not JSON")
		case a.Error != nil:
			refused = append(refused, a.Error.Description)
		case a.Data != nil && a.Data.Code == 200:
			taken++
		}
	})
	if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) {
		return 0, ErrNoResolver
	}
	if err == nil && len(refused) > 0 {
		err = fmt.Errorf("%d broker servers refused the account JWT: %s", len(refused), strings.Join(refused, "; "))
	}
	return taken, err
}

// JetStreamClusterSize is how many servers the broker's JetStream spans,
// those away now included, as a server of it knows them; 1 for a broker
// not clustered, 0 for one without JetStream.
func JetStreamClusterSize(nc *nats.Conn, within time.Duration) (int, error) {
	size := 0
	err := gather(nc, jszPing, nil, within, func(b []byte) {
		var a struct {
			Data struct {
				Disabled bool `json:"disabled"`
				Meta     *struct {
					Size int `json:"cluster_size"`
				} `json:"meta_cluster"`
			} `json:"data"`
		}
		if json.Unmarshal(b, &a) != nil || a.Data.Disabled {
			return
		}
		n := 1
		if a.Data.Meta != nil && a.Data.Meta.Size > 1 {
			n = a.Data.Meta.Size
		}
		size = max(size, n)
	})
	return size, err
}

// gather asks every server on subject and hands each answer to take: it
// waits up to within for the first, then answersSettle for the others.
func gather(nc *nats.Conn, subject string, body []byte, within time.Duration, take func([]byte)) error {
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest(subject, inbox, body); err != nil {
		return err
	}
	wait := within
	for n := 0; ; n++ {
		m, err := sub.NextMsg(wait)
		switch {
		case errors.Is(err, nats.ErrTimeout) && n > 0:
			return nil
		case err != nil:
			return err
		case len(m.Data) == 0 && m.Header.Get("Status") == "503":
			return nats.ErrNoResponders
		}
		take(m.Data)
		wait = answersSettle
	}
}
