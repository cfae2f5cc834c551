package app

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"filippo.io/age"

	"mesh-controller/app/protocol"
	"mesh-controller/contexts/health"
	"mesh-controller/contexts/identity"
	"mesh-controller/contexts/inventory"
	"mesh-controller/contexts/licences"
	"mesh-controller/contexts/secrets"
)

// Why a secret command refuses.
var (
	ErrNotJoined      = errors.New("has not joined: its age recipient is not known yet")
	ErrSecretNotNamed = errors.New("does not name that secret")
	ErrMadeByMesh     = errors.New("is made by the mesh, not given by a person")
	ErrEmptySecret    = errors.New("the value is empty")
	ErrNotAnExport    = errors.New("is not a secret export")
	ErrNotInExport    = errors.New("the export holds no copy of that secret")
	ErrNotOperatorKey = errors.New("holds no age identity")
	ErrBadRecipient   = errors.New("is not an age X25519 public key (age1…)")
	// ErrWrongOperatorKey means the key given does not open the copy.
	ErrWrongOperatorKey = errors.New("does not open this copy: it is sealed to another operator key")
	errOutExists        = errors.New("exists already: it is never overwritten; choose another --out")
	errOperatorRefusal  = "set one with 'mesh-controller operator key set' (make one off the mesh with 'mesh-controller operator key make')"
)

// OperatorKeyMade is a new operator key pair: the private half went only to File.
type OperatorKeyMade struct {
	Public string
	File   string
}

// OperatorKeyMake makes an age key pair off the mesh: the private half is
// written only to out (created exclusively, 0600), the public half returned.
// It touches no store.
func OperatorKeyMake(out string) (OperatorKeyMade, error) {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		return OperatorKeyMade{}, err
	}
	content := fmt.Sprintf("# mesh-controller operator key, made %s\n# public key: %s\n%s\n",
		time.Now().UTC().Format(time.RFC3339), id.Recipient(), id)
	if err := writeExclusive(out, []byte(content)); err != nil {
		return OperatorKeyMade{}, err
	}
	return OperatorKeyMade{Public: id.Recipient().String(), File: out}, nil
}

// writeExclusive creates path 0600, refusing an existing file or link, and
// leaves no file behind if writing fails.
func writeExclusive(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if errors.Is(err, os.ErrExist) {
		return fmt.Errorf("%s %w", path, errOutExists)
	}
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(path)
		return err
	}
	return nil
}

// OperatorKeySet tells the mesh which key to seal to from now on.
func (c *Secrets) OperatorKeySet(ctx context.Context, public string, replace bool) (previous string, err error) {
	if _, err := age.ParseX25519Recipient(public); err != nil {
		return "", fmt.Errorf("%q %w", public, ErrBadRecipient)
	}
	st, err := c.stores(ctx)
	if err != nil {
		return "", err
	}
	prev, err := st.Secrets.SetOperatorKey(ctx, public, replace, c.Now())
	if err != nil || prev == nil {
		return "", err
	}
	return prev.Recipient, nil
}

// OperatorKeyView is the operator key and what it can recover.
type OperatorKeyView struct {
	Key   string    `json:"key"`
	SetAt time.Time `json:"set_at"`
	// Recoverable counts the copies this key opens; OnlyOlderKeys those only a replaced key opens.
	Recoverable   int `json:"recoverable"`
	OnlyOlderKeys int `json:"only_older_keys"`
	// LicenceCopies counts the licence copies this key opens;
	// LicenceCopiesOnlyOlder those only a replaced key opens.
	LicenceCopies          int `json:"licence_copies"`
	LicenceCopiesOnlyOlder int `json:"licence_copies_only_older"`
}

// OperatorKeyShow shows the operator key and what it can recover.
func (c *Secrets) OperatorKeyShow(ctx context.Context) (OperatorKeyView, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return OperatorKeyView{}, err
	}
	sec := st.Secrets
	k, err := sec.OperatorKey(ctx)
	if err != nil {
		return OperatorKeyView{}, err
	}
	v := OperatorKeyView{Key: k.Recipient, SetAt: k.SetAt}
	if v.Recoverable, v.OnlyOlderKeys, err = sec.Recoverable(ctx); err != nil {
		return v, err
	}
	v.LicenceCopies, v.LicenceCopiesOnlyOlder, err = licenceCopiesSealedTo(ctx, st, k.Recipient)
	return v, err
}

// licenceCopiesSealedTo counts the licence copies the current operator key
// opens, and those only an older key opens.
func licenceCopiesSealedTo(ctx context.Context, st *Stores, current string) (cur, onlyOlder int, err error) {
	by, err := st.Licences.SealedTo(ctx)
	for key, n := range by {
		if key == current {
			cur += n
		} else {
			onlyOlder += n
		}
	}
	return cur, onlyOlder, err
}

// newMeshSecret is 32 random bytes, URL-safe base64.
func newMeshSecret() (protocol.Secret, error) {
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return protocol.Secret{}, err
	}
	b := make([]byte, base64.RawURLEncoding.EncodedLen(len(raw)))
	base64.RawURLEncoding.Encode(b, raw[:])
	s := protocol.NewSecret(b)
	clear(b)
	clear(raw[:])
	return s, nil
}

// hostRecipients are the joined hosts' age recipients by node, read once
// for however many secrets are sealed to them.
func hostRecipients(ctx context.Context, ids *identity.Store) (map[string]string, error) {
	hosts, err := ids.Hosts(ctx)
	if err != nil {
		return nil, err
	}
	recipients := make(map[string]string, len(hosts))
	for _, h := range hosts {
		recipients[h.Node] = h.AgeRecipient
	}
	return recipients, nil
}

// recipientOf is a node's recipient among those read, or ErrNotJoined.
func recipientOf(recipients map[string]string, node string) (string, error) {
	if r, ok := recipients[node]; ok {
		return r, nil
	}
	return "", fmt.Errorf("node %s %w", node, ErrNotJoined)
}

func nodeRecipient(ctx context.Context, ids *identity.Store, node string) (string, error) {
	recipients, err := hostRecipients(ctx, ids)
	if err != nil {
		return "", err
	}
	return recipientOf(recipients, node)
}

// SecretAccept takes a value a person has for a module on a node, seals it
// to the node and the operator key at once, and sends the node its plan.
func (c *Secrets) SecretAccept(ctx context.Context, node, module, name string, v protocol.Secret) ([]Pushed, error) {
	if err := CheckNames(node, module); err != nil {
		return nil, err
	}
	if v.Len() == 0 {
		return nil, ErrEmptySecret
	}
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return nil, err
	}
	inv, ids, sec := st.Inventory, st.Identity, st.Secrets
	if _, ok := snap.Nodes[node]; !ok {
		return nil, fmt.Errorf("node %s %w", node, inventory.ErrNodeNotFound)
	}
	version := snap.VersionOn(node, module)
	if version == "" {
		return nil, fmt.Errorf("module %s %w %s", module, ErrNotOnNode, node)
	}
	var spec *inventory.Secret
	for _, s := range snap.Manifests[module][version].Secrets {
		if s.Name == name {
			s := s
			spec = &s
		}
	}
	switch {
	case spec == nil:
		return nil, fmt.Errorf("%s %s %w %q", module, version, ErrSecretNotNamed, name)
	case spec.MadeBy == "mesh":
		return nil, fmt.Errorf("%s of %s %w", name, module, ErrMadeByMesh)
	}
	recipient, err := nodeRecipient(ctx, ids, node)
	if err != nil {
		return nil, err
	}
	if _, err := sec.OperatorKey(ctx); err != nil {
		return nil, err
	}
	k, err := keeping(protocol.Label{Node: node, Module: module, Name: name}, "person", "accepted", v, recipient)
	if err != nil {
		return nil, err
	}
	// The plan moves first: a value kept by a process stopped before the
	// declaration is sent still reaches the node with the catch-up.
	if err := inv.BumpPlans(ctx, []string{node}); err != nil {
		return nil, err
	}
	if _, err := sec.KeepAll(ctx, []secrets.Keeping{k}, c.Now()); err != nil {
		return nil, err
	}
	return c.sendPlans(ctx, st, []string{node})
}

// Export is every operator-sealed copy, ciphertext only: what to keep beside
// the operator key, to recover secrets when the mesh itself is lost.
type Export struct {
	Kind       string         `json:"kind"`
	ExportedAt time.Time      `json:"exported_at"`
	Secrets    []ExportedCopy `json:"secrets"`
	// Licences are every sealed copy of every kept version of every
	// licence: each opens with the operator key alone.
	Licences []ExportedLicenceCopy `json:"licences"`
}

// ExportedLicenceCopy is one licence copy in an export: the operator's own
// (kind operator; kind refresh for a refresh token), or a holder's.
type ExportedLicenceCopy struct {
	Licence     string    `json:"licence"`
	Version     int64     `json:"version"`
	Kind        string    `json:"kind"`
	Holder      string    `json:"holder,omitempty"`
	OperatorKey string    `json:"operator_key"`
	SealedAt    time.Time `json:"sealed_at"`
	Sealed      string    `json:"sealed"`
}

// ExportedCopy is one sealed copy in an export.
type ExportedCopy struct {
	Node        string    `json:"node"`
	Module      string    `json:"module"`
	Name        string    `json:"name"`
	Version     int64     `json:"version"`
	OperatorKey string    `json:"operator_key"`
	SealedAt    time.Time `json:"sealed_at"`
	Sealed      string    `json:"sealed"`
}

const exportKind = "mesh-controller secret export"

// SecretExport writes every operator-sealed copy as one JSON document, to
// out (created 0600, never overwritten) or, if out is "", returns it.
func (c *Secrets) SecretExport(ctx context.Context, out string) ([]byte, int, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return nil, 0, err
	}
	copies, err := st.Secrets.Copies(ctx)
	if err != nil {
		return nil, 0, err
	}
	lcs, err := st.Licences.Copies(ctx, "")
	if err != nil {
		return nil, 0, err
	}
	e := Export{Kind: exportKind, ExportedAt: c.Now().UTC().Truncate(time.Second), Secrets: []ExportedCopy{}, Licences: []ExportedLicenceCopy{}}
	for _, cp := range copies {
		e.Secrets = append(e.Secrets, ExportedCopy{Node: cp.Node, Module: cp.Module, Name: cp.Name, Version: cp.Version,
			OperatorKey: cp.OperatorKey, SealedAt: cp.SealedAt, Sealed: cp.Sealed})
	}
	for _, cp := range lcs {
		ec := ExportedLicenceCopy{Licence: cp.Licence, Version: cp.Version, Kind: cp.Kind, OperatorKey: cp.OperatorKey, SealedAt: cp.SealedAt, Sealed: cp.Sealed}
		if cp.Node != "" {
			ec.Holder = cp.Node + "/" + cp.Module
		}
		e.Licences = append(e.Licences, ec)
	}
	b, err := json.MarshalIndent(e, "", "  ")
	if err != nil {
		return nil, 0, err
	}
	b = append(b, '\n')
	if out != "" {
		return nil, len(e.Secrets) + len(e.Licences), writeExclusive(out, b)
	}
	return b, len(e.Secrets) + len(e.Licences), nil
}

// RecoverRequest is a break-glass recovery.
type RecoverRequest struct {
	Node, Module, Name string
	// KeyFile is the operator's age identity file.
	KeyFile string
	// Out is the file to write (created 0600, never overwritten); "" derives one.
	Out string
	// FromExport reads the sealed copy from an export instead of the store.
	FromExport string
	// Licence, if set, recovers that licence's token (the operator's own
	// copy) instead of a secret: of Version, or of its current version (0).
	Licence string
	Version int64
}

// Recovered is what secret recover did.
type Recovered struct {
	Out     string
	Version int64
	// Recorded says the hand act was recorded; otherwise NotRecorded says why.
	Recorded    bool
	NotRecorded string
}

// SecretRecover opens the operator-sealed copy with the operator key into a
// new 0600 file, and records the act (never the value). A licence's token
// is recovered the same way (r.Licence).
func (c *Secrets) SecretRecover(ctx context.Context, r RecoverRequest) (Recovered, error) {
	if r.Licence != "" {
		return c.licenceRecover(ctx, r)
	}
	if err := CheckNames(r.Node, r.Module); err != nil {
		return Recovered{}, err
	}
	if r.Out == "" {
		r.Out = fmt.Sprintf("%s-%s-%s.secret", r.Node, r.Module, r.Name)
	}
	want := protocol.Label{Node: r.Node, Module: r.Module, Name: r.Name}
	return c.recoverCopy(ctx, r, want, "secret recover "+r.Node+"/"+r.Module+"/"+r.Name, "the secrets store", func(st *Stores) (string, error) {
		if r.FromExport != "" {
			return fromExport(r.FromExport, r.Node, r.Module, r.Name)
		}
		cp, err := st.Secrets.Copy(ctx, r.Node, r.Module, r.Name)
		return cp.Sealed, err
	})
}

// licenceRecover opens a licence's own operator copy of a version.
func (c uses) licenceRecover(ctx context.Context, r RecoverRequest) (Recovered, error) {
	if err := CheckName(r.Licence); err != nil {
		return Recovered{}, err
	}
	want := protocol.OperatorLicenceLabel(r.Licence, licences.KindOperator, r.Version)
	if r.Out == "" {
		r.Out = fmt.Sprintf("licence-%s.token", r.Licence)
		if r.Version > 0 {
			r.Out = fmt.Sprintf("licence-%s-v%d.token", r.Licence, r.Version)
		}
	}
	return c.recoverCopy(ctx, r, want, "secret recover --licence "+r.Licence, "the licences store", func(st *Stores) (string, error) {
		if r.FromExport != "" {
			return licenceFromExport(r.FromExport, r.Licence, r.Version)
		}
		cp, err := st.Licences.OperatorCopy(ctx, r.Licence, r.Version)
		return cp.Sealed, err
	})
}

// recoverCopy opens the copy find gives (st is nil when reading an export
// needs no store) with the operator key into r.Out, checks it is want, and
// records the act as what, read from source (or the export).
func (c uses) recoverCopy(ctx context.Context, r RecoverRequest, want protocol.Label, what, source string, find func(st *Stores) (string, error)) (Recovered, error) {
	if _, err := os.Lstat(r.Out); err == nil {
		return Recovered{}, fmt.Errorf("%s %w", r.Out, errOutExists)
	}
	identities, err := readOperatorKey(r.KeyFile)
	if err != nil {
		return Recovered{}, err
	}
	var st *Stores
	if r.FromExport == "" {
		if st, err = c.stores(ctx); err != nil {
			return Recovered{}, err
		}
	}
	sealed, err := find(st)
	if err != nil {
		return Recovered{}, err
	}
	v, label, err := protocol.OpenSealed(sealed, want, identities...)
	var noMatch *age.NoIdentityMatchError
	if errors.As(err, &noMatch) {
		return Recovered{}, fmt.Errorf("%s %w", r.KeyFile, ErrWrongOperatorKey)
	}
	if err != nil {
		return Recovered{}, err
	}
	err = writeExclusive(r.Out, v.Reveal())
	clear(v.Reveal())
	if err != nil {
		return Recovered{}, err
	}
	out := Recovered{Out: r.Out, Version: label.Version}
	// The act is recorded where the mesh still has a health store; when the
	// mesh itself is lost, recovering from an export must still work.
	if st, err = c.stores(ctx); err != nil {
		out.NotRecorded = err.Error()
		return out, nil
	}
	if r.FromExport != "" {
		source = "the export " + r.FromExport
	}
	_, err = st.Health.RecordHandAct(ctx, health.HandAct{At: c.Now(), Cause: "break-glass", Who: who(),
		What: fmt.Sprintf("%s version %d from %s", what, label.Version, source),
		Why:  "break-glass recovery with the operator key"})
	if err != nil {
		out.NotRecorded = err.Error()
	} else {
		out.Recorded = true
	}
	return out, nil
}

func readOperatorKey(file string) ([]age.Identity, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ids, err := age.ParseIdentities(io.LimitReader(f, 1<<20))
	if err != nil || len(ids) == 0 {
		return nil, fmt.Errorf("%s %w", filepath.Base(file), ErrNotOperatorKey)
	}
	return ids, nil
}

// readExport reads a secret export for break-glass recovery.
func readExport(file string) (Export, error) {
	b, err := ReadInput(file, MaxExportBytes, "a secret export")
	if err != nil {
		return Export{}, err
	}
	var e Export
	if err := json.Unmarshal(b, &e); err != nil || e.Kind != exportKind {
		return Export{}, fmt.Errorf("%s %w", file, ErrNotAnExport)
	}
	return e, nil
}

// licenceFromExport is a licence's operator copy of a version (0: the
// newest in the export).
func licenceFromExport(file, licence string, version int64) (string, error) {
	e, err := readExport(file)
	if err != nil {
		return "", err
	}
	var found *ExportedLicenceCopy
	for i, l := range e.Licences {
		if l.Licence == licence && l.Kind == licences.KindOperator && (version == 0 && (found == nil || l.Version > found.Version) || l.Version == version) {
			found = &e.Licences[i]
		}
	}
	if found == nil {
		return "", fmt.Errorf("licence %s: %w", licence, ErrNotInExport)
	}
	return found.Sealed, nil
}

func fromExport(file, node, module, name string) (string, error) {
	e, err := readExport(file)
	if err != nil {
		return "", err
	}
	for _, s := range e.Secrets {
		if s.Node == node && s.Module == module && s.Name == name {
			return s.Sealed, nil
		}
	}
	return "", fmt.Errorf("%s/%s/%s: %w", node, module, name, ErrNotInExport)
}

// secretsNeedKey says which of the modules use secrets, for assign's refusal
// when no operator key is set.
func secretsNeedKey(ms []inventory.Manifest) []string {
	var out []string
	for _, m := range ms {
		if len(m.Secrets) > 0 {
			var names []string
			for _, s := range m.Secrets {
				names = append(names, s.Name)
			}
			out = append(out, fmt.Sprintf("%s keeps secrets (%s) and no operator key is set: %s", m.Module, strings.Join(names, ", "), errOperatorRefusal))
		}
	}
	return out
}
