package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"filippo.io/age"
	"github.com/nats-io/nats.go"

	"mesh-controller/app/daemon"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/inventory"
	"mesh-controller/contexts/licences"
)

// RefreshTool is the tool a licence's manager answers: in
// {"licence": NAME}, out {"access_token": "…", "expires_at": "RFC 3339"}.
const RefreshTool = "refresh"

// RefreshTimeout is how long a refresh waits for the manager's answer.
const RefreshTimeout = 10 * time.Second

// refreshAt is the part of a licence's life after which serve refreshes it.
const refreshAt = 0.8

// Why a refresh fails or is refused.
var (
	// ErrNoRefreshTool means the manager's manifest names no refresh tool.
	ErrNoRefreshTool = errors.New("has no tool " + RefreshTool + ": a licence's manager answers it")
	// ErrBadRefresh means the manager's answer is not a usable token.
	ErrBadRefresh = errors.New(`did not answer {"access_token": "…", "expires_at": "RFC 3339, in the future"}`)
	// ErrManagerRefused means the manager answered the refresh with an
	// error of its own (the provider refused, say).
	ErrManagerRefused = errors.New("answered an error")
)

// LicenceManagerRequest names the module on a node that holds a
// refreshable licence's refresh token and answers its refresh tool: the
// operator's key file opens the refresh token (the mesh keeps no key that
// can), which is sealed again to that node and the operator key.
type LicenceManagerRequest struct {
	Name, Manager string
	KeyFile       string
}

// LicenceManaged is what licence manager did.
type LicenceManaged struct {
	Name    string `json:"name"`
	Manager string `json:"manager"`
	// Before is the manager it replaced, "" if none.
	Before string   `json:"before,omitempty"`
	Pushed []Pushed `json:"pushed"`
}

// LicenceManager makes a module on a node the manager of a refreshable
// licence: its refresh token, sealed to the node, travels in its
// declaration; a manager named before loses its copy.
func (c *Licences) LicenceManager(ctx context.Context, r LicenceManagerRequest) (LicenceManaged, error) {
	if err := CheckName(r.Name); err != nil {
		return LicenceManaged{}, err
	}
	node, module, err := parseHolder(r.Manager)
	if err != nil {
		return LicenceManaged{}, err
	}
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return LicenceManaged{}, err
	}
	version, err := assignedOn(snap, node, module)
	if err != nil {
		return LicenceManaged{}, err
	}
	if !slices.ContainsFunc(snap.Manifests[module][version].Tools, func(t inventory.Tool) bool { return t.Name == RefreshTool }) {
		return LicenceManaged{}, fmt.Errorf("module %s %s %w", module, version, ErrNoRefreshTool)
	}
	l, err := st.Licences.Licence(ctx, r.Name)
	if err != nil {
		return LicenceManaged{}, err
	}
	if !l.Refreshable {
		return LicenceManaged{}, fmt.Errorf("licence %s %w: it has no refresh token to manage", r.Name, licences.ErrNotRefreshable)
	}
	rc, err := st.Licences.RefreshCopy(ctx, r.Name)
	if err != nil {
		return LicenceManaged{}, err
	}
	recipient, err := nodeRecipient(ctx, st.Identity, node)
	if err != nil {
		return LicenceManaged{}, err
	}
	key, err := st.Secrets.OperatorKey(ctx)
	if err != nil {
		return LicenceManaged{}, err
	}
	identities, err := readOperatorKey(r.KeyFile)
	if err != nil {
		return LicenceManaged{}, err
	}
	v, err := openLicence(rc, identities, r.KeyFile)
	if err != nil {
		return LicenceManaged{}, err
	}
	sealed, err := sealTo(v, protocol.RefreshLabel(node, module, r.Name, rc.Version), key.Recipient, recipient)
	clear(v.Reveal()) // sealed now: the plaintext goes nowhere else
	if err != nil {
		return LicenceManaged{}, err
	}
	nodes := []string{node}
	if l.ManagerNode != "" && l.ManagerNode != node {
		nodes = append(nodes, l.ManagerNode)
	}
	// The plan moves first, as for licence use.
	if err := st.Inventory.BumpPlans(ctx, nodes); err != nil {
		return LicenceManaged{}, err
	}
	if _, err := st.Licences.SetManager(ctx, licences.Copy{Licence: r.Name, Version: rc.Version, Node: node, Module: module,
		NodeRecipient: recipient, OperatorKey: key.Recipient, Sealed: sealed}, c.Now()); err != nil {
		return LicenceManaged{}, err
	}
	out := LicenceManaged{Name: r.Name, Manager: node + "/" + module}
	if l.ManagerNode != "" {
		out.Before = l.ManagerNode + "/" + l.ManagerModule
	}
	out.Pushed, err = c.sendPlans(ctx, st, nodes)
	return out, err
}

// sealTo seals a value to the operator key and to each node recipient.
func sealTo(v protocol.Secret, l protocol.Label, operatorKey string, nodeRecipients ...string) (string, error) {
	var rs []age.Recipient
	for _, s := range append(nodeRecipients, operatorKey) {
		r, err := age.ParseX25519Recipient(s)
		if err != nil {
			return "", fmt.Errorf("%s: a recipient: %w", l.Name, err)
		}
		rs = append(rs, r)
	}
	return protocol.SealSecret(v, l, rs...)
}

// LicenceRefreshed is what a refresh did.
type LicenceRefreshed struct {
	Name    string     `json:"name"`
	Manager string     `json:"manager"`
	From    int64      `json:"from"`
	Version int64      `json:"version"`
	Expires *time.Time `json:"expires,omitempty"`
	// DiscardAfter is when the version it replaced stops being recoverable.
	DiscardAfter time.Time `json:"discard_after"`
	Holders      []string  `json:"holders"`
	Pushed       []Pushed  `json:"pushed"`
}

// LicenceRefresh asks a licence's manager for a new access token and seals
// it to every holder in one act; the old version stays recoverable by the
// operator for licences.GracePeriod. A failure through the manager is
// recorded (licence.refresh-failed) and the holders keep the old token.
func (c *Licences) LicenceRefresh(ctx context.Context, name string) (LicenceRefreshed, error) {
	if err := CheckName(name); err != nil {
		return LicenceRefreshed{}, err
	}
	st, err := c.stores(ctx)
	if err != nil {
		return LicenceRefreshed{}, err
	}
	// Refused before the broker is dialled: these need no manager to say.
	l, err := refreshable(ctx, st, name)
	if err != nil {
		return LicenceRefreshed{}, err
	}
	nc, err := c.dialBroker(ctx, st.Identity)
	if err != nil {
		return LicenceRefreshed{}, err
	}
	defer nc.Close()
	r, err := c.refreshLicence(ctx, st, nc, l, RefreshTimeout)
	if err != nil {
		return r, err
	}
	r.Pushed, err = c.sendPlans(ctx, st, holderNodes(r.Holders))
	return r, err
}

func holderNodes(holders []string) []string {
	var nodes []string
	for _, h := range holders {
		node, _, _ := parseHolder(h)
		if !slices.Contains(nodes, node) {
			nodes = append(nodes, node)
		}
	}
	return nodes
}

// refreshAnswer is the manager's answer to its refresh tool.
type refreshAnswer struct {
	AccessToken string `json:"access_token"`
	ExpiresAt   string `json:"expires_at"`
	Error       string `json:"error"`
}

// refreshLicence is a refresh of l (as refreshable read it) up to its
// push: asked over nc (answered into nc's own inbox), sealed and kept, the
// holders' plans moved; the caller sends them (serve's catch-up does, for
// its own refreshes). A licence changed since it was read is refused by
// the store (ErrVersionMoved).
func (c uses) refreshLicence(ctx context.Context, st *Stores, nc *nats.Conn, l licences.Licence, timeout time.Duration) (LicenceRefreshed, error) {
	name := l.Name
	manager := l.ManagerNode + "/" + l.ManagerModule
	out := LicenceRefreshed{Name: name, Manager: manager, From: l.Version, Holders: []string{}}
	v, expires, err := askRefresh(ctx, nc, l, timeout, c.Now())
	if err == nil {
		out.Expires = &expires
		out.Version, out.DiscardAfter, err = c.keepRefreshed(ctx, st, l, v, expires)
		clear(v.Reveal())
	}
	if err != nil {
		err = fmt.Errorf("refresh licence %s through %s: %w; its holders keep version %d", name, manager, err, l.Version)
		if rerr := st.Licences.RefreshFailed(ctx, name, c.Now()); rerr != nil {
			return out, errors.Join(err, rerr)
		}
		return out, err
	}
	for _, h := range l.Holders {
		out.Holders = append(out.Holders, h.String())
	}
	return out, nil
}

// refreshable reads a licence that can be refreshed: kept, refreshable,
// with a manager.
func refreshable(ctx context.Context, st *Stores, name string) (licences.Licence, error) {
	l, err := st.Licences.Licence(ctx, name)
	switch {
	case err != nil:
		return l, err
	case !l.Refreshable:
		return l, fmt.Errorf("licence %s %w: it has no refresh token", name, licences.ErrNotRefreshable)
	case l.ManagerNode == "":
		return l, fmt.Errorf("licence %s %w", name, licences.ErrNoManager)
	}
	return l, nil
}

// askRefresh asks the manager's refresh tool on its node for a new access
// token and judges the answer. The answer is never quoted: it may hold
// the token.
func askRefresh(ctx context.Context, nc *nats.Conn, l licences.Licence, timeout time.Duration, now time.Time) (protocol.Secret, time.Time, error) {
	in, _ := json.Marshal(map[string]string{"licence": l.Name})
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	m, err := nc.RequestWithContext(actx, protocol.ToolSubjectOn(l.ManagerModule, RefreshTool, l.ManagerNode), in)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return protocol.Secret{}, time.Time{}, fmt.Errorf("%w of %s on %s to answer %s", ErrNoInstance, l.ManagerModule, l.ManagerNode, RefreshTool)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return protocol.Secret{}, time.Time{}, fmt.Errorf("%s %w %s within %s", l.ManagerModule, ErrNoAnswer, RefreshTool, timeout)
	case err != nil:
		return protocol.Secret{}, time.Time{}, err
	}
	defer clear(m.Data)
	var a refreshAnswer
	if json.Unmarshal(m.Data, &a) != nil {
		return protocol.Secret{}, time.Time{}, fmt.Errorf("its manager %w", ErrBadRefresh)
	}
	if a.Error != "" {
		return protocol.Secret{}, time.Time{}, fmt.Errorf("its manager %w: %.200s", ErrManagerRefused, a.Error)
	}
	if a.AccessToken == "" {
		return protocol.Secret{}, time.Time{}, fmt.Errorf("its manager's answer holds no access_token: it %w", ErrBadRefresh)
	}
	expires, err := time.Parse(time.RFC3339, a.ExpiresAt)
	if err != nil || !expires.After(now) {
		return protocol.Secret{}, time.Time{}, fmt.Errorf("its manager's expires_at %q is not a future RFC 3339 time: it %w", a.ExpiresAt, ErrBadRefresh)
	}
	return protocol.NewSecret([]byte(a.AccessToken)), expires.UTC().Truncate(time.Second), nil
}

// keepRefreshed seals a new version to the operator key and every holder,
// moves the holders' plans, and keeps it in one transaction.
func (c uses) keepRefreshed(ctx context.Context, st *Stores, l licences.Licence, v protocol.Secret, expires time.Time) (int64, time.Time, error) {
	key, err := st.Secrets.OperatorKey(ctx)
	if err != nil {
		return 0, time.Time{}, err
	}
	next := l.Version + 1
	op, err := sealTo(v, protocol.OperatorLicenceLabel(l.Name, licences.KindOperator, next), key.Recipient)
	if err != nil {
		return 0, time.Time{}, err
	}
	recipients, err := hostRecipients(ctx, st.Identity)
	if err != nil {
		return 0, time.Time{}, err
	}
	r := licences.Refreshed{Licence: l.Name, From: l.Version, Expires: &expires,
		Operator: licences.Copy{Kind: licences.KindOperator, OperatorKey: key.Recipient, Sealed: op}}
	var nodes []string
	for _, h := range l.Holders {
		recipient, err := recipientOf(recipients, h.Node)
		if err != nil {
			return 0, time.Time{}, err
		}
		sealed, err := sealTo(v, protocol.LicenceLabel(h.Node, h.Module, l.Name, next), key.Recipient, recipient)
		if err != nil {
			return 0, time.Time{}, err
		}
		r.Holders = append(r.Holders, licences.Copy{Kind: licences.KindHolder, Node: h.Node, Module: h.Module, NodeRecipient: recipient,
			OperatorKey: key.Recipient, Sealed: sealed})
		if !slices.Contains(nodes, h.Node) {
			nodes = append(nodes, h.Node)
		}
	}
	// The plans move first: a refresh kept by a process stopped before its
	// declarations are sent still reaches the holders with the catch-up.
	if err := st.Inventory.BumpPlans(ctx, nodes); err != nil {
		return 0, time.Time{}, err
	}
	now := c.Now()
	version, err := st.Licences.Refresh(ctx, r, now)
	return version, now.Add(licences.GracePeriod), err
}

// licencesDue are serve's own refreshes: each refreshable licence with a
// manager past refreshAt of its current version's life, as acts the
// healers' brake counts (healer refresh-licence, once per version).
func (c uses) licencesDue(ctx context.Context, st *Stores, nc *nats.Conn) ([]daemon.Due, error) {
	ls, err := st.Licences.Due(ctx, refreshAt, c.Now())
	if err != nil {
		return nil, err
	}
	var out []daemon.Due
	for _, l := range ls {
		out = append(out, daemon.Due{Healer: "refresh-licence", Subject: "licence/" + l.Name, Detail: fmt.Sprintf("version %d", l.Version),
			Act: func(ctx context.Context) error {
				l, err := refreshable(ctx, st, l.Name)
				if err != nil {
					return err
				}
				_, err = c.refreshLicence(ctx, st, nc, l, RefreshTimeout)
				return err
			}})
	}
	return out, nil
}

// maxDiscards bounds how many superseded licence versions one sweep
// discards: the rest wait for the next.
const maxDiscards = 100
