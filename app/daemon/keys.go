package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"mesh-controller/app/protocol"
	"mesh-controller/contexts/identity"
)

// RotatedSubject is where a person's command tells the serving controller
// that the signing key was rotated (identity rotate): it announces the new
// key to every host. Only controller users may publish under mesh.control.
const RotatedSubject = "mesh.control.rotated"

// keyPushEvery is how often, at most, a host that beats with a key older
// than the current one is sent the latest link again.
const keyPushEvery = 30 * time.Second

// KeyLinkOf is a kept link of the chain as it travels.
func KeyLinkOf(l identity.KeyLink) protocol.KeyLink {
	return protocol.KeyLink{Announcement: l.Announcement, OldSignature: l.OldSignature, NewSignature: l.NewSignature}
}

// keyState is the signing key as the daemon announces it: the current
// key's id, the latest link as a notice to send (nil before any rotation)
// and when it was last announced to every host, read and written under mu
// (a rotation is announced off the loop, which may be busy judging ten
// thousand nodes); and, the loop's own, per node the key its host last
// said it verifies with, what of it waits to be written, and when it was
// last sent the notice.
type keyState struct {
	mu        sync.Mutex
	current   string
	notice    []byte
	announced time.Time

	acked  map[string]string
	due    map[string]string
	pushed map[string]time.Time
}

// latest is the current key, the notice of it, and when it was announced.
func (k *keyState) latest() (string, []byte, time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.current, k.notice, k.announced
}

// readKeys reads the current key and the latest link.
func (d *daemon) readKeys(ctx context.Context) error {
	key, err := d.st.Identity.SigningKey(ctx)
	if err != nil {
		return err
	}
	chain, err := d.st.Identity.KeyChain(ctx)
	if err != nil {
		return err
	}
	var notice []byte
	if n := len(chain); n > 0 {
		if notice, err = json.Marshal(protocol.KeyNotice{Links: []protocol.KeyLink{KeyLinkOf(chain[n-1])}}); err != nil {
			return err
		}
	}
	d.ks.mu.Lock()
	d.ks.current, d.ks.notice = key.Fingerprint(), notice
	d.ks.mu.Unlock()
	return nil
}

// loadKeys reads the current key and the latest link, and what hosts
// said, as the daemon starts.
func (d *daemon) loadKeys(ctx context.Context) error {
	if err := d.readKeys(ctx); err != nil {
		return err
	}
	if d.ks.acked == nil {
		acks, err := d.st.Identity.KeyAcks(ctx)
		if err != nil {
			return err
		}
		d.ks.acked, d.ks.due, d.ks.pushed = make(map[string]string, len(acks)), map[string]string{}, map[string]time.Time{}
		for _, a := range acks {
			d.ks.acked[a.Node] = a.Key
		}
	}
	return nil
}

// absorbKey takes the key a beat says its host verifies with: kept for the
// next flush when it changed, and answered with the latest link when it
// is not the current key (a host that missed the announcement, away or
// beating while no controller served).
func (d *daemon) absorbKey(node, key string, now time.Time) {
	if key == "" {
		return // a host that predates rotations
	}
	if d.ks.acked[node] != key {
		d.ks.acked[node], d.ks.due[node] = key, key
	}
	current, notice, announced := d.ks.latest()
	if key == current || notice == nil || now.Sub(d.ks.pushed[node]) < keyPushEvery || time.Since(announced) < keyPushEvery {
		return
	}
	d.ks.pushed[node] = now
	if err := d.nc.Publish(protocol.NodeSubject(node, protocol.KeyInbox), notice); err != nil {
		d.log.Warn("announce the signing key", "node", node, "err", err)
	}
}

// flushKeys writes the keys hosts said they verify with, changed since.
func (d *daemon) flushKeys(ctx context.Context) {
	if len(d.ks.due) == 0 {
		return
	}
	if err := d.st.Identity.RecordKeyAcks(ctx, d.ks.due, d.u.Now()); err != nil {
		d.deposed(err)
		d.log.Error("record the keys hosts verify with", "nodes", len(d.ks.due), "err", err)
		for node := range d.ks.due {
			delete(d.ks.acked, node) // written again with its next beat
		}
	}
	d.ks.due = map[string]string{}
}

// onRotated reads the new key and announces it to every joined host, once,
// off the loop (the handlers' goroutine): a host that misses it hears it
// again when it beats with the old one.
func (d *daemon) onRotated(*nats.Msg) {
	if err := d.readKeys(d.bg); err != nil {
		d.log.Error("read the rotated signing key", "err", err)
		return
	}
	d.ks.mu.Lock()
	current, notice := d.ks.current, d.ks.notice
	d.ks.announced = time.Now()
	d.ks.mu.Unlock()
	if notice == nil {
		return
	}
	sent := 0
	for _, node := range d.keys.nodes() {
		if err := d.nc.Publish(protocol.NodeSubject(node, protocol.KeyInbox), notice); err != nil {
			d.log.Warn("announce the signing key", "node", node, "err", err)
			continue
		}
		sent++
	}
	if err := d.nc.FlushTimeout(brokerTimeout); err != nil {
		d.log.Warn("announce the signing key", "err", err)
	}
	d.log.Info("signing key rotated: announced to every host", "key", current, "hosts", sent)
}

// onKeyChainAsk answers a host's ask for the chain from the key it knows.
func (d *daemon) onKeyChainAsk(m *nats.Msg) {
	var ask protocol.KeyChainAskBody
	node, ok := d.verify(m, protocol.KeyChainAsk, &ask)
	if !ok {
		return
	}
	chain, err := d.st.Identity.KeyChain(d.bg)
	if err != nil {
		// Not answered: the host asks again when the declaration comes
		// again (an answer with an error says its key is none of ours).
		d.log.Error("read the chain of signing keys", "node", node, "err", err)
		return
	}
	answer := protocol.KeyChain{Links: []protocol.KeyLink{}}
	from := -1
	for i, l := range chain {
		if protocol.KeyID(l.OldKey) == ask.From {
			from = i
			break
		}
	}
	latest := len(chain) == 0 || protocol.KeyID(chain[len(chain)-1].NewKey) == ask.From
	switch {
	case from < 0 && latest:
		// The host holds the current key: nothing to follow.
	case from < 0:
		answer.Error = "no rotation hands over from key " + clip(ask.From) + ": it is not one this controller had"
	default:
		for _, l := range chain[from:] {
			answer.Links = append(answer.Links, KeyLinkOf(l))
		}
	}
	d.respondTo(m, node, answer)
}

// onKeyRefused keeps that a host refused a chain or an announcement: the
// self-check raises node.key-refused.
func (d *daemon) onKeyRefused(m *nats.Msg) {
	var r protocol.KeyRefusal
	node, ok := d.verify(m, protocol.KeyRefusedReport, &r)
	if !ok {
		return
	}
	d.log.Warn("a host refused a chain of signing keys", "node", node, "key", clip(r.Key), "refused", clip(r.Refused))
	if err := d.st.Identity.RecordKeyRefusal(d.bg, node, clip(r.Key), clip(r.Refused), d.u.Now()); err != nil {
		d.deposed(err)
		d.log.Error("record a chain refused", "node", node, "err", err)
	}
	d.kick()
}

// onCredsRenew signs a host a new broker user for the nkey it made, before
// its credential expires; answered only into its own inbox.
func (d *daemon) onCredsRenew(m *nats.Msg) {
	var b protocol.CredsRenewBody
	node, ok := d.verify(m, protocol.CredsRenew, &b)
	if !ok {
		return
	}
	creds, revoked, err := d.u.Hosts.Renew(d.bg, node, b.NKey)
	if err != nil {
		d.renewFailed(node, err)
		d.respondTo(m, node, protocol.CredsReply{Error: renewError(err)})
		return
	}
	d.log.Info("host credential renewed", "node", node)
	d.respondTo(m, node, protocol.CredsReply{OK: true, Creds: creds})
	d.renewRevoked(node, revoked)
}

// renewRevoked has the broker refuse the users a renewal revoked.
func (d *daemon) renewRevoked(node string, revoked int) {
	if revoked > 0 {
		d.disconnectRevoked("host credential renewed: its credential from before credentials expired revoked", "node", node)
	}
}

// renewByJoin renews the credential of a host whose own expired, asked
// through the join path (it can no longer connect as itself): the request
// signed by the host key the node joined with, recent, the answer a grant
// sealed to the node's age recipient. Anything else is refused as a join
// is, with the one answer.
func (d *daemon) renewByJoin(ctx context.Context, m *nats.Msg, r protocol.JoinRequest) {
	source := sourceOf(m)
	refuse := func(reason string) {
		if d.refusalLog.allow(source, d.u.Now()) {
			d.log.Warn("renewal refused", "node", clip(r.Node), "source", source, "reason", reason)
		}
		d.handOver(event{kind: evRefused, source: source, reason: reason})
		d.respondTo(m, "", protocol.JoinReply{Error: protocol.JoinRefused})
	}
	key := d.keys.get(r.Node)
	var b protocol.RenewBody
	switch {
	case key == nil:
		refuse("renewal for an unknown host")
		return
	case protocol.Open(r.Renew, key, &b) != nil:
		refuse("renewal not signed by the host key")
		return
	case b.Node != r.Node:
		refuse("renewal for another node")
		return
	case d.u.Now().Sub(b.At).Abs() > protocol.RenewWithin:
		refuse("renewal too old")
		return
	}
	reply, revoked, err := d.u.Hosts.RenewGrant(ctx, r.Node, b.NKey, d.urls)
	if err != nil {
		d.renewFailed(r.Node, err)
		var refusal *Refusal
		if errors.As(err, &refusal) {
			d.respondTo(m, "", protocol.JoinReply{Error: protocol.JoinRefused})
		} else {
			d.respondTo(m, "", protocol.JoinReply{Error: protocol.JoinFailed})
		}
		return
	}
	d.log.Info("host credential renewed through the join path (it had expired)", "node", r.Node, "source", source)
	d.respondTo(m, "", reply)
	d.renewRevoked(r.Node, revoked)
}

// renewFailed logs a renewal not made.
func (d *daemon) renewFailed(node string, err error) {
	d.deposed(err)
	var refusal *Refusal
	if errors.As(err, &refusal) {
		d.log.Warn("host credential not renewed", "node", node, "err", err)
		return
	}
	d.log.Error("host credential not renewed", "node", node, "err", err)
}

// renewError is what a host is told of a renewal not made.
func renewError(err error) string {
	var refusal *Refusal
	if errors.As(err, &refusal) {
		return "refused: " + refusal.Reason
	}
	return "the controller could not renew it now: ask again later"
}
