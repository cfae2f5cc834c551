package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"mesh-controller/contexts/health"
	"mesh-controller/contexts/identity"
	"mesh-controller/contexts/inventory"
)

// NodeView is a node as commands show it.
type NodeView struct {
	Name      string     `json:"name"`
	Mode      string     `json:"mode"`
	Joined    bool       `json:"joined"`
	JoinedAt  *time.Time `json:"joined_at"`
	LastHeard *time.Time `json:"last_heard"`
	CreatedAt time.Time  `json:"created_at"`
	// SerialDeclared is its latest declaration's serial; SerialApplied the
	// highest its host reported applied (0 when none).
	SerialDeclared int64 `json:"serial_declared"`
	SerialApplied  int64 `json:"serial_applied"`
	// Behind says its declaration is older than its plan, or not yet
	// applied, or an upgrade is recorded for it and not sent; BehindWhy
	// says which.
	Behind    bool   `json:"behind"`
	BehindWhy string `json:"behind_why,omitempty"`
	// HeartbeatS is the interval its host beats at (0 until heard).
	HeartbeatS float64 `json:"heartbeat_interval_s"`
	// LastApply is its host's latest apply report.
	LastApply *ApplyView `json:"last_apply"`
	// Applying is the declaration its host's latest beat said it was
	// applying, while not applied yet; absent otherwise.
	Applying *ApplyingView `json:"applying,omitempty"`
	// HostVersion is the version its host says it runs (in its beats, or
	// at join before it beat); Protocol the protocol it was last heard
	// speaking ("1.0" for a host that says none); HostRelease the host
	// release declared to it (absent when none is: its host is left on
	// what it runs). Each absent until known.
	HostVersion string `json:"host_version,omitempty"`
	Protocol    string `json:"protocol,omitempty"`
	HostRelease string `json:"host_release,omitempty"`
}

// ApplyingView is a declaration a node's host is applying.
type ApplyingView struct {
	Serial int64 `json:"serial"`
	// Since is when its host began, on the host's clock.
	Since time.Time `json:"since"`
	// Phase is the part under way (verify, archives, files…), "" if not said.
	Phase string `json:"phase,omitempty"`
}

// NodeDetail is one node whole, as node show tells it.
type NodeDetail struct {
	NodeView
	// Token is the newest join token's state (never the token).
	Token *TokenView `json:"token"`
	// Facts are what its host reported of the machine, each with why.
	Facts []inventory.Fact `json:"facts"`
	// Found is what its host found running beside the mesh's modules.
	Found []inventory.Found `json:"found"`
	// Data are its data sets as last reported.
	Data []DataSetView `json:"data"`
	// Dropped counts messages claiming to be from it that were refused.
	Dropped []health.Drop `json:"dropped_messages"`
	// Modules are its assigned modules and their state as its host reports
	// them ("unreported" until it does).
	Modules []health.ModuleState `json:"modules"`
	// PublicDomain is the domain its routed names are composed under, ""
	// for none; Networks are the networks it routes for what it hosts.
	PublicDomain string   `json:"public_domain"`
	Networks     []string `json:"networks"`
}

// StateUnreported is the state of an assigned module its host has not
// reported: not applied yet, or a host that does not supervise.
const StateUnreported = "unreported"

// moduleStatesOf lists a node's assigned modules with their reported
// states, and modules still reported that are no longer assigned (being
// stopped).
func moduleStatesOf(assigned []inventory.Assignment, reported []health.ModuleState) []health.ModuleState {
	byModule := map[string]health.ModuleState{}
	for _, m := range reported {
		byModule[m.Module] = m
	}
	out := []health.ModuleState{}
	for _, a := range assigned {
		m, ok := byModule[a.Module]
		if !ok {
			m = health.ModuleState{Node: a.Node, Module: a.Module, Version: a.Version, State: StateUnreported}
		}
		delete(byModule, a.Module)
		out = append(out, m)
	}
	for _, m := range byModule {
		m.Detail = strings.TrimSpace("no longer assigned; " + m.Detail)
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Module < out[j].Module })
	return out
}

// ApplyView is a host's report of applying a declaration.
type ApplyView struct {
	Serial  int64     `json:"serial"`
	OK      bool      `json:"ok"`
	Error   string    `json:"error,omitempty"`
	TotalMS float64   `json:"total_ms"`
	At      time.Time `json:"at"`
}

// DataSetView is one data set as its host last reported it.
type DataSetView struct {
	Module     string     `json:"module"`
	Name       string     `json:"name"`
	Path       string     `json:"path"`
	Bytes      int64      `json:"bytes"`
	Precious   string     `json:"precious"`
	LastBackup *time.Time `json:"last_backup"`
}

// TokenView is a join token as commands show it: never the token itself.
type TokenView struct {
	State     string     `json:"state"`
	IssuedAt  time.Time  `json:"issued_at"`
	ExpiresAt time.Time  `json:"expires_at"`
	UsedAt    *time.Time `json:"used_at"`
}

func nodeView(n inventory.Node) NodeView {
	v := NodeView{
		Name: n.Name, Mode: string(n.Mode), Joined: n.JoinedAt != nil,
		JoinedAt: n.JoinedAt, LastHeard: n.LastHeard, CreatedAt: n.CreatedAt,
		SerialDeclared: n.SerialDeclared, SerialApplied: n.SerialApplied, HeartbeatS: n.HeartbeatIntervalS, Behind: n.Behind(), BehindWhy: BehindWhy(n),
		HostVersion: n.HostVersion, HostRelease: n.HostRelease,
	}
	if o := n.LastOutcome; o != nil {
		v.LastApply = &ApplyView{Serial: o.Serial, OK: o.OK, Error: o.Error, TotalMS: o.TotalMS, At: o.At}
	}
	// A beat sent before the apply's report may be written after it.
	if a := n.Applying; a != nil && a.Serial > n.SerialApplied {
		v.Applying = &ApplyingView{Serial: a.Serial, Since: a.Since, Phase: a.Phase}
	}
	return v
}

// NodeAdd records a node, converged unless adopted.
func (c *Nodes) NodeAdd(ctx context.Context, name string, adopted bool) (NodeView, error) {
	if err := CheckNodeName(name); err != nil {
		return NodeView{}, err
	}
	st, err := c.stores(ctx)
	if err != nil {
		return NodeView{}, err
	}
	n, err := st.Inventory.AddNode(ctx, name, modeOf(adopted), c.Now())
	if err != nil {
		return NodeView{}, err
	}
	return nodeView(n), nil
}

func modeOf(adopted bool) inventory.Mode {
	if adopted {
		return inventory.Adopted
	}
	return inventory.Converged
}

// NodeList lists every node by name.
func (c *Nodes) NodeList(ctx context.Context) ([]NodeView, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return nil, err
	}
	nodes, err := st.Inventory.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	hosts, err := st.Identity.HostVersions(ctx)
	if err != nil {
		return nil, err
	}
	byNode := make(map[string]identity.HostVersion, len(hosts))
	for _, h := range hosts {
		byNode[h.Node] = h
	}
	views := make([]NodeView, 0, len(nodes))
	for _, n := range nodes {
		v := nodeView(n)
		// What its beats say it runs is newer than what it said at join.
		if h, ok := byNode[n.Name]; ok {
			v.Protocol = h.Protocol
			if v.HostVersion == "" {
				v.HostVersion = hostVersionOf(h.Version)
			}
		}
		views = append(views, v)
	}
	return views, nil
}

// NodeShow shows one node and its newest join token.
func (c *Nodes) NodeShow(ctx context.Context, name string) (NodeDetail, error) {
	if err := CheckName(name); err != nil {
		return NodeDetail{}, err
	}
	st, err := c.stores(ctx)
	if err != nil {
		return NodeDetail{}, err
	}
	inv := st.Inventory
	n, err := inv.Node(ctx, name)
	if err != nil {
		return NodeDetail{}, err
	}
	v := NodeDetail{NodeView: nodeView(n)}
	hosts, err := st.Identity.HostVersions(ctx)
	if err != nil {
		return NodeDetail{}, err
	}
	for _, h := range hosts {
		if h.Node == name {
			v.Protocol = h.Protocol
			if v.HostVersion == "" {
				v.HostVersion = hostVersionOf(h.Version)
			}
		}
	}
	rt, err := inv.Routing(ctx, name)
	if err != nil {
		return NodeDetail{}, err
	}
	v.PublicDomain, v.Networks = rt.PublicDomain, rt.Networks
	if v.Facts, v.Found, err = inv.Facts(ctx, name); err != nil {
		return NodeDetail{}, err
	}
	sets, err := inv.DataSets(ctx, name)
	if err != nil {
		return NodeDetail{}, err
	}
	v.Data = []DataSetView{}
	for _, d := range sets {
		v.Data = append(v.Data, DataSetView{Module: d.Module, Name: d.Name, Path: d.Path, Bytes: d.Bytes, Precious: d.Precious, LastBackup: d.LastBackup})
	}
	if v.Dropped, err = st.Health.Drops(ctx, name); err != nil {
		return NodeDetail{}, err
	}
	assigned, err := inv.AssignmentsOn(ctx, name)
	if err != nil {
		return NodeDetail{}, err
	}
	reported, err := st.Health.ModuleStates(ctx, name)
	if err != nil {
		return NodeDetail{}, err
	}
	v.Modules = moduleStatesOf(assigned, reported)
	tokens, err := st.Identity.Tokens(ctx, name)
	if err != nil {
		return NodeDetail{}, err
	}
	if len(tokens) > 0 {
		t := tokens[0]
		v.Token = &TokenView{State: t.State(c.Now()), IssuedAt: t.IssuedAt, ExpiresAt: t.ExpiresAt, UsedAt: t.UsedAt}
	}
	return v, nil
}

// ErrBadTTL means a token's lifetime is not positive.
var ErrBadTTL = errors.New("a token's lifetime must be positive")

// TokenRequest asks for a join token: for an existing node, or for a new
// record made in the same act.
type TokenRequest struct {
	Node    string
	New     bool
	Adopted bool
	TTL     time.Duration
}

// IssuedToken is a join token, returned once.
type IssuedToken struct {
	Token     string
	Node      string
	ExpiresAt time.Time
	// Created says the node record was made by this act.
	Created bool
	Mode    string
	// Revoked counts earlier unused tokens of the node that no longer work.
	Revoked int
}

// TokenIssue issues a one-time join token, kept only as its hash.
func (c *Nodes) TokenIssue(ctx context.Context, r TokenRequest) (IssuedToken, error) {
	if err := CheckNodeName(r.Node); err != nil {
		return IssuedToken{}, err
	}
	if r.TTL <= 0 {
		return IssuedToken{}, fmt.Errorf("--ttl %s: %w", r.TTL, ErrBadTTL)
	}
	st, err := c.stores(ctx)
	if err != nil {
		return IssuedToken{}, err
	}
	inv := st.Inventory
	var n inventory.Node
	if r.New {
		n, err = inv.AddNode(ctx, r.Node, modeOf(r.Adopted), c.Now())
	} else {
		n, err = inv.Node(ctx, r.Node)
	}
	if err != nil {
		return IssuedToken{}, err
	}
	tok, t, revoked, err := st.Identity.IssueToken(ctx, n.Name, r.TTL, c.Now())
	if err != nil {
		return IssuedToken{}, err
	}
	return IssuedToken{Token: tok, Node: n.Name, ExpiresAt: t.ExpiresAt, Created: r.New, Mode: string(n.Mode), Revoked: revoked}, nil
}

// IdentityView is the controller's identity as commands show it: the public
// half only.
type IdentityView struct {
	Algorithm   string    `json:"algorithm"`
	PublicKey   string    `json:"public_key"`
	Fingerprint string    `json:"fingerprint"`
	CreatedAt   time.Time `json:"created_at"`
	// Previous is the key the last rotation replaced, while hosts still
	// accept it (its overlap).
	Previous *PreviousKey `json:"previous,omitempty"`
	// Chain is how many keys the controller has had: one more than its
	// rotations.
	Chain int `json:"chain"`
	// Hosts counts the joined hosts; NotAcknowledged are those whose host
	// has not said it verifies with the current key.
	Hosts           int       `json:"hosts"`
	NotAcknowledged []NodeKey `json:"not_acknowledged"`
}

// IdentityShow shows the controller's signing public key.
func (c *Nodes) IdentityShow(ctx context.Context) (IdentityView, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return IdentityView{}, err
	}
	k, err := st.Identity.SigningKey(ctx)
	if err != nil {
		return IdentityView{}, err
	}
	v := IdentityView{Algorithm: "ed25519", PublicKey: k.PublicBase64(), Fingerprint: k.Fingerprint(), CreatedAt: k.CreatedAt, NotAcknowledged: []NodeKey{}}
	chain, err := st.Identity.KeyChain(ctx)
	if err != nil {
		return IdentityView{}, err
	}
	now := c.Now()
	v.Chain = len(chain) + 1
	if n := len(chain); n > 0 && chain[n-1].OverlapUntil.After(now) {
		l := chain[n-1]
		v.Previous = &PreviousKey{KeyShown: keyShown(l.OldKey), RotatedAt: l.MadeAt, OverlapUntil: l.OverlapUntil, Why: l.Why}
	}
	if v.Hosts, v.NotAcknowledged, err = keysStanding(ctx, st.Identity, v.Fingerprint, chain, now); err != nil {
		return IdentityView{}, err
	}
	if v.NotAcknowledged == nil {
		v.NotAcknowledged = []NodeKey{}
	}
	return v, nil
}

// ErrBadCount means a --count is not between 1 and MaxNodesAtOnce.
var ErrBadCount = fmt.Errorf("a count is between 1 and %d", MaxNodesAtOnce)

// TokenBatch is what issuing tokens for many new nodes did.
type TokenBatch struct {
	Count int
	First string
	Last  string
	Out   string
}

// TokenIssueMany makes the records prefix1…prefixN and a join token for
// each, written as "name token" lines to out (0600, created exclusively),
// never to stdout. All records or none are made.
func (c *Nodes) TokenIssueMany(ctx context.Context, prefix string, count int, adopted bool, ttl time.Duration, out string) (TokenBatch, error) {
	if count < 1 || count > MaxNodesAtOnce {
		return TokenBatch{}, ErrBadCount
	}
	if ttl <= 0 {
		return TokenBatch{}, fmt.Errorf("--ttl %s: %w", ttl, ErrBadTTL)
	}
	if err := CheckName(fmt.Sprintf("%s%d", prefix, count)); err != nil {
		return TokenBatch{}, err
	}
	if _, err := os.Lstat(out); err == nil {
		return TokenBatch{}, fmt.Errorf("%s %w", out, errOutExists)
	}
	st, err := c.stores(ctx)
	if err != nil {
		return TokenBatch{}, err
	}
	inv, ids := st.Inventory, st.Identity
	names := make([]string, count)
	for i := range names {
		names[i] = fmt.Sprintf("%s%d", prefix, i+1)
	}
	if err := inv.AddNodes(ctx, names, modeOf(adopted), c.Now()); err != nil {
		return TokenBatch{}, err
	}
	tokens, err := ids.IssueTokens(ctx, names, ttl, c.Now())
	if err != nil {
		return TokenBatch{}, err
	}
	var b strings.Builder
	for i, n := range names {
		fmt.Fprintf(&b, "%s %s\n", n, tokens[i])
	}
	if err := writeExclusive(out, []byte(b.String())); err != nil {
		return TokenBatch{}, err
	}
	return TokenBatch{Count: count, First: names[0], Last: names[count-1], Out: out}, nil
}

// BehindWhy says why a node is behind ("" when it is not): its plan moved
// and is not yet declared, its host has not applied its latest declaration,
// or versions recorded by upgrade record wait for push --behind.
func BehindWhy(n inventory.Node) string {
	return behindWhy(inventory.NodeState{PlanVersion: n.PlanVersion, DeclaredPlanVersion: n.DeclaredPlanVersion,
		SerialApplied: n.SerialApplied, SerialDeclared: n.SerialDeclared, Pending: n.Pending})
}

func behindWhy(n inventory.NodeState) string {
	var why []string
	if n.PlanVersion > n.DeclaredPlanVersion {
		why = append(why, "its plan moved and is not declared yet")
	}
	if n.SerialApplied < n.SerialDeclared {
		why = append(why, fmt.Sprintf("its host applied %d of declaration %d", n.SerialApplied, n.SerialDeclared))
	}
	if n.Pending > 0 {
		why = append(why, fmt.Sprintf("%s recorded by upgrade record (or a rebuilt archive), not sent: 'mesh-controller push --behind' sends %s",
			Plural(n.Pending, "module version"), map[bool]string{true: "it", false: "them"}[n.Pending == 1]))
	}
	return strings.Join(why, "; ")
}
