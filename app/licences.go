package app

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"filippo.io/age"

	"mesh-controller/app/protocol"
	"mesh-controller/contexts/inventory"
	"mesh-controller/contexts/licences"
)

// Why a licence command refuses.
var (
	ErrEmptyLicence = errors.New("the token is empty")
	// ErrNotTokens means a refreshable licence's file is not the JSON shape
	// RefreshableTokens documents.
	ErrNotTokens   = errors.New(`is not {"access_token": "…", "refresh_token": "…", "expires_at": "RFC 3339"}`)
	ErrNoRefresh   = errors.New("holds no refresh_token: a refreshable licence is refreshed with it")
	ErrNoAccess    = errors.New("holds no access_token")
	ErrBadExpires  = errors.New("is neither an RFC 3339 time (2027-01-31T00:00:00Z) nor a duration (720h, 90d)")
	ErrExpired     = errors.New("is in the past: the token has run out already")
	ErrBadProvider = errors.New("is not a valid provider: a lowercase letter, then up to 62 lowercase letters, digits or dashes")
)

// RefreshableTokens is a refreshable licence's file, as 'licence add
// --refreshable --from FILE' reads it: the access token, the refresh token
// and when the access token runs out (RFC 3339; optional).
type RefreshableTokens struct {
	AccessToken  string `json:"access_token"`
	RefreshToken string `json:"refresh_token"`
	ExpiresAt    string `json:"expires_at,omitempty"`
}

// LicenceAddRequest is a licence a person adds: Token is the file's exact
// bytes, or what was typed at the terminal.
type LicenceAddRequest struct {
	Name, Provider string
	Refreshable    bool
	// Expires is RFC 3339, or a duration from now (Go's, or N days as Nd);
	// "" is the refreshable file's expires_at, else none.
	Expires string
	Token   protocol.Secret
}

// LicenceAdded is what licence add kept.
type LicenceAdded struct {
	Name        string     `json:"name"`
	Version     int64      `json:"version"`
	Refreshable bool       `json:"refreshable"`
	Expires     *time.Time `json:"expires,omitempty"`
	OperatorKey string     `json:"operator_key"`
}

// parseExpires reads an expiry: RFC 3339, or a duration from now.
func parseExpires(s string, now time.Time) (*time.Time, error) {
	if s == "" {
		return nil, nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		d, derr := time.ParseDuration(s)
		if days, ok := strings.CutSuffix(s, "d"); ok && derr != nil {
			n, nerr := strconv.Atoi(days)
			d, derr = time.Duration(n)*24*time.Hour, nerr
		}
		if derr != nil || d <= 0 {
			return nil, fmt.Errorf("expiry %q %w", s, ErrBadExpires)
		}
		t = now.Add(d)
	}
	if !t.After(now) {
		return nil, fmt.Errorf("expiry %s %w", t.UTC().Format(time.RFC3339), ErrExpired)
	}
	t = t.UTC().Truncate(time.Second)
	return &t, nil
}

// splitTokens reads a refreshable licence's file into its access token,
// its refresh token and its expires_at.
func splitTokens(v protocol.Secret) (access, refresh protocol.Secret, expires string, err error) {
	var tk RefreshableTokens
	dec := json.NewDecoder(bytes.NewReader(v.Reveal()))
	dec.DisallowUnknownFields()
	// The error is never shown: json's messages may quote the value.
	if dec.Decode(&tk) != nil {
		return access, refresh, "", fmt.Errorf("the file %w", ErrNotTokens)
	}
	defer func() { tk = RefreshableTokens{} }()
	switch {
	case tk.AccessToken == "":
		return access, refresh, "", fmt.Errorf("the file %w", ErrNoAccess)
	case tk.RefreshToken == "":
		return access, refresh, "", fmt.Errorf("the file %w", ErrNoRefresh)
	}
	return protocol.NewSecret([]byte(tk.AccessToken)), protocol.NewSecret([]byte(tk.RefreshToken)), tk.ExpiresAt, nil
}

// LicenceAdd keeps a new licence under the name a person chose, its token
// sealed at once to the operator key (a refreshable licence's refresh
// token too, apart): nothing else sees it until a module holds it.
func (c *Licences) LicenceAdd(ctx context.Context, r LicenceAddRequest) (LicenceAdded, error) {
	if err := CheckName(r.Name); err != nil {
		return LicenceAdded{}, err
	}
	if !protocol.ValidName(r.Provider) {
		return LicenceAdded{}, fmt.Errorf("%q %w", r.Provider, ErrBadProvider)
	}
	if r.Token.Len() == 0 {
		return LicenceAdded{}, ErrEmptyLicence
	}
	now := c.Now()
	access, expires := r.Token, r.Expires
	var refresh protocol.Secret
	if r.Refreshable {
		var fileExpires string
		var err error
		if access, refresh, fileExpires, err = splitTokens(r.Token); err != nil {
			return LicenceAdded{}, err
		}
		if fileExpires != "" {
			if _, err := time.Parse(time.RFC3339, fileExpires); err != nil {
				return LicenceAdded{}, fmt.Errorf("the file's expires_at %q %w", fileExpires, ErrBadExpires)
			}
		}
		if expires == "" {
			expires = fileExpires
		}
	}
	exp, err := parseExpires(expires, now)
	if err != nil {
		return LicenceAdded{}, err
	}
	st, err := c.stores(ctx)
	if err != nil {
		return LicenceAdded{}, err
	}
	key, err := st.Secrets.OperatorKey(ctx)
	if err != nil {
		return LicenceAdded{}, err
	}
	sealed, err := sealTo(access, protocol.OperatorLicenceLabel(r.Name, licences.KindOperator, 1), key.Recipient)
	if err != nil {
		return LicenceAdded{}, err
	}
	copies := []licences.Copy{{Kind: licences.KindOperator, OperatorKey: key.Recipient, Sealed: sealed}}
	if r.Refreshable {
		sealed, err := sealTo(refresh, protocol.OperatorLicenceLabel(r.Name, licences.KindRefresh, 1), key.Recipient)
		if err != nil {
			return LicenceAdded{}, err
		}
		copies = append(copies, licences.Copy{Kind: licences.KindRefresh, OperatorKey: key.Recipient, Sealed: sealed})
	}
	l := licences.Licence{Name: r.Name, Provider: r.Provider, Refreshable: r.Refreshable, Expires: exp}
	if err := st.Licences.Add(ctx, l, copies, now); err != nil {
		return LicenceAdded{}, err
	}
	return LicenceAdded{Name: r.Name, Version: 1, Refreshable: r.Refreshable, Expires: exp, OperatorKey: key.Recipient}, nil
}

// parseHolder reads NODE/MODULE.
func parseHolder(s string) (node, module string, err error) {
	node, module, ok := strings.Cut(s, "/")
	if !ok {
		return "", "", fmt.Errorf("%q: %w", s, ErrHolderForm)
	}
	return node, module, CheckNames(node, module)
}

// LicenceUseRequest gives a licence to a module on a node: the operator's
// key file opens the licence's current version (the mesh keeps no key that
// can), which is sealed again to the node and the operator key. The key is
// read, used and dropped: it is never kept.
type LicenceUseRequest struct {
	Name, Holder string
	KeyFile      string
}

// LicenceUsed is what licence use did.
type LicenceUsed struct {
	Name    string   `json:"name"`
	Node    string   `json:"node"`
	Module  string   `json:"module"`
	Version int64    `json:"version"`
	Pushed  []Pushed `json:"pushed"`
}

// LicenceUse makes a module on a node a holder of a licence: a copy sealed
// to its node, carried in its declaration like a secret.
func (c *Licences) LicenceUse(ctx context.Context, r LicenceUseRequest) (LicenceUsed, error) {
	if err := CheckName(r.Name); err != nil {
		return LicenceUsed{}, err
	}
	node, module, err := parseHolder(r.Holder)
	if err != nil {
		return LicenceUsed{}, err
	}
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return LicenceUsed{}, err
	}
	if _, err := assignedOn(snap, node, module); err != nil {
		return LicenceUsed{}, err
	}
	l, err := st.Licences.Licence(ctx, r.Name)
	if err != nil {
		return LicenceUsed{}, err
	}
	if holds(l, node, module) {
		return LicenceUsed{}, fmt.Errorf("%s/%s %w", node, module, licences.ErrHeld)
	}
	op, err := st.Licences.OperatorCopy(ctx, r.Name, l.Version)
	if err != nil {
		return LicenceUsed{}, err
	}
	recipient, err := nodeRecipient(ctx, st.Identity, node)
	if err != nil {
		return LicenceUsed{}, err
	}
	key, err := st.Secrets.OperatorKey(ctx)
	if err != nil {
		return LicenceUsed{}, err
	}
	identities, err := readOperatorKey(r.KeyFile)
	if err != nil {
		return LicenceUsed{}, err
	}
	v, err := openLicence(op, identities, r.KeyFile)
	if err != nil {
		return LicenceUsed{}, err
	}
	k, err := keeping(protocol.LicenceLabel(node, module, r.Name, op.Version), "person", "used", v, recipient)
	if err != nil {
		clear(v.Reveal())
		return LicenceUsed{}, err
	}
	sealed, err := k.Seal(op.Version, key.Recipient)
	clear(v.Reveal()) // sealed now: the plaintext goes nowhere else
	if err != nil {
		return LicenceUsed{}, err
	}
	// The plan moves first: a holding kept by a process stopped before the
	// declaration is sent still reaches the node with the catch-up.
	if err := st.Inventory.BumpPlans(ctx, []string{node}); err != nil {
		return LicenceUsed{}, err
	}
	if err := st.Licences.Use(ctx, licences.Copy{Licence: r.Name, Version: op.Version, Node: node, Module: module,
		NodeRecipient: recipient, OperatorKey: key.Recipient, Sealed: sealed}, c.Now()); err != nil {
		return LicenceUsed{}, err
	}
	pushed, err := c.sendPlans(ctx, st, []string{node})
	return LicenceUsed{Name: r.Name, Node: node, Module: module, Version: op.Version, Pushed: pushed}, err
}

// assignedOn is the version of a module assigned to a known node, or why
// there is none.
func assignedOn(snap *inventory.Snapshot, node, module string) (string, error) {
	if _, ok := snap.Nodes[node]; !ok {
		return "", fmt.Errorf("node %s %w", node, inventory.ErrNodeNotFound)
	}
	version := snap.VersionOn(node, module)
	if version == "" {
		return "", fmt.Errorf("module %s %w %s", module, ErrNotOnNode, node)
	}
	return version, nil
}

// holds says whether the module on the node holds the licence.
func holds(l licences.Licence, node, module string) bool {
	for _, h := range l.Holders {
		if h.Node == node && h.Module == module {
			return true
		}
	}
	return false
}

// openLicence opens a licence's operator copy with the operator's key.
func openLicence(cp licences.Copy, identities []age.Identity, keyFile string) (protocol.Secret, error) {
	v, _, err := protocol.OpenSealed(cp.Sealed, protocol.OperatorLicenceLabel(cp.Licence, cp.Kind, cp.Version), identities...)
	var noMatch *age.NoIdentityMatchError
	if errors.As(err, &noMatch) {
		return protocol.Secret{}, fmt.Errorf("%s %w", keyFile, ErrWrongOperatorKey)
	}
	return v, err
}

// LicenceStop takes a licence away from a module on a node: its copy is
// dropped, and its host removes the file with the next declaration.
func (c *Licences) LicenceStop(ctx context.Context, name, holder string) ([]Pushed, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	node, module, err := parseHolder(holder)
	if err != nil {
		return nil, err
	}
	st, err := c.stores(ctx)
	if err != nil {
		return nil, err
	}
	// Refused before the plan moves: a refusal sends nothing.
	l, err := st.Licences.Licence(ctx, name)
	if err != nil {
		return nil, err
	}
	if !holds(l, node, module) {
		return nil, fmt.Errorf("%s/%s %w", node, module, licences.ErrNotHeld)
	}
	// The plan moves first, as for licence use: a copy dropped by a process
	// stopped before the declaration is sent leaves with the catch-up.
	if err := st.Inventory.BumpPlans(ctx, []string{node}); err != nil {
		return nil, err
	}
	if err := st.Licences.Stop(ctx, name, node, module, c.Now()); err != nil {
		return nil, err
	}
	return c.sendPlans(ctx, st, []string{node})
}

// LicenceView is one licence as licence list shows it: never a token.
type LicenceView struct {
	Name        string     `json:"name"`
	Provider    string     `json:"provider"`
	Refreshable bool       `json:"refreshable"`
	Version     int64      `json:"version"`
	Expires     *time.Time `json:"expires"`
	Made        time.Time  `json:"made"`
	Holders     []string   `json:"holders"`
	// Manager is the node/module that holds the refresh token, "" if none.
	Manager string `json:"manager"`
	// NeededBy are the assigned modules whose manifests need it, as
	// node/module, holding it or not.
	NeededBy []string `json:"needed_by"`
}

// LicenceList lists every licence, its holders, manager and expiry.
func (c *Licences) LicenceList(ctx context.Context) ([]LicenceView, error) {
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return nil, err
	}
	ls, err := st.Licences.List(ctx)
	if err != nil {
		return nil, err
	}
	needed := licencesNeeded(snap)
	out := make([]LicenceView, 0, len(ls))
	for _, l := range ls {
		v := LicenceView{Name: l.Name, Provider: l.Provider, Refreshable: l.Refreshable, Version: l.Version, Expires: l.Expires, Made: l.Made,
			Holders: []string{}, NeededBy: needed[l.Name]}
		if v.NeededBy == nil {
			v.NeededBy = []string{}
		}
		for _, h := range l.Holders {
			v.Holders = append(v.Holders, h.String())
		}
		if l.ManagerNode != "" {
			v.Manager = l.ManagerNode + "/" + l.ManagerModule
		}
		out = append(out, v)
	}
	return out, nil
}

// licencesNeeded are, by licence, the assigned modules (node/module) whose
// manifests need it.
func licencesNeeded(snap *inventory.Snapshot) map[string][]string {
	out := map[string][]string{}
	for _, a := range snap.Assignments {
		for _, l := range snap.Manifests[a.Module][a.Version].Licences {
			out[l.Name] = append(out[l.Name], a.Node+"/"+a.Module)
		}
	}
	return out
}

// LicenceKeyView is what key material a licence holds and to whom each copy
// is sealed: never a plaintext.
type LicenceKeyView struct {
	Name        string `json:"name"`
	Provider    string `json:"provider"`
	Refreshable bool   `json:"refreshable"`
	Version     int64  `json:"version"`
	// Material says what the licence's tokens are.
	Material []string          `json:"material"`
	Copies   []LicenceCopyView `json:"copies"`
}

// LicenceCopyView is one sealed copy: of which version, what it holds, and
// the keys it opens with.
type LicenceCopyView struct {
	Version  int64     `json:"version"`
	Kind     string    `json:"kind"`
	Holder   string    `json:"holder,omitempty"`
	SealedTo []string  `json:"sealed_to"`
	SealedAt time.Time `json:"sealed_at"`
	Current  bool      `json:"current"`
}

// LicenceKey says which key material a licence holds, and to whom each
// copy of each version is sealed.
func (c *Licences) LicenceKey(ctx context.Context, name string) (LicenceKeyView, error) {
	if err := CheckName(name); err != nil {
		return LicenceKeyView{}, err
	}
	st, err := c.stores(ctx)
	if err != nil {
		return LicenceKeyView{}, err
	}
	l, err := st.Licences.Licence(ctx, name)
	if err != nil {
		return LicenceKeyView{}, err
	}
	cs, err := st.Licences.Copies(ctx, name)
	if err != nil {
		return LicenceKeyView{}, err
	}
	v := LicenceKeyView{Name: l.Name, Provider: l.Provider, Refreshable: l.Refreshable, Version: l.Version, Material: []string{"an access token (an API key)"},
		Copies: []LicenceCopyView{}}
	if l.Refreshable {
		v.Material = []string{"an access token", "a refresh token (for the manager, sealed apart)"}
	}
	for _, cp := range cs {
		cv := LicenceCopyView{Version: cp.Version, Kind: cp.Kind, SealedAt: cp.SealedAt, Current: cp.Version == l.Version}
		if cp.Node != "" {
			cv.Holder = cp.Node + "/" + cp.Module
			cv.SealedTo = append(cv.SealedTo, "node "+cp.Node+" "+cp.NodeRecipient)
		}
		cv.SealedTo = append(cv.SealedTo, "operator "+cp.OperatorKey)
		v.Copies = append(v.Copies, cv)
	}
	return v, nil
}
