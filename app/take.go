package app

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/nats-io/nats.go"

	"mesh-controller/app/protocol"
	"mesh-controller/contexts/health"
	"mesh-controller/contexts/inventory"
)

// Why take refuses.
var (
	// ErrConverged means take was asked on a converged node: the mesh is its
	// whole, and a module is assigned there, not taken.
	ErrConverged = errors.New("is converged: take is for adopted nodes, where something may already run")
	// ErrTakeDigestUnknown means --yes named a digest that is not of a
	// preview of this take (another node's, another module's, a typo, or
	// one older than the previews kept).
	ErrTakeDigestUnknown = errors.New("is not the digest of a preview of this take")
	// ErrTakeChanged means the machine changed since the preview a digest
	// is of: the person previews again and confirms what is there now.
	ErrTakeChanged = errors.New("what runs there changed since that preview")
	// ErrTakeSymlink means a data path of the module is a symbolic link
	// on the node: take does not follow a link out of what it shows.
	ErrTakeSymlink = errors.New("is a symbolic link there")
	// ErrAlreadyOnNode means the module is on the node already.
	ErrAlreadyOnNode = errors.New("is already on that node")
)

// TakeRequest is a take: a preview, or with Yes, the cutover it shows.
type TakeRequest struct {
	Node, Module string
	// Yes is the digest of the preview the person approved; "" previews.
	Yes string
}

// TakePreview is what take shows: what runs on the node now beside what
// the module declares, what the cutover will do, and the digest of it.
type TakePreview struct {
	Node    string `json:"node"`
	Module  string `json:"module"`
	Version string `json:"version"`
	// Declared are the module's ports and data sets, as its manifest says.
	Declared     []protocol.Port         `json:"declared_ports"`
	DeclaredData []protocol.DeclaredData `json:"declared_data"`
	// Look is what its host saw, now.
	Look protocol.LookAnswer `json:"look"`
	// Stop is what the cutover stops: units (stopped and disabled) and
	// processes (SIGTERM, SIGKILL after the grace, each only if its pid
	// still runs that command).
	Stop protocol.DeclaredTake `json:"stop"`
	// Cutover is what will be done, in order, in words.
	Cutover []string `json:"cutover"`
	// From says what ran there, in words, as the record keeps it.
	From   []string `json:"from"`
	Digest string   `json:"digest"`
}

// Taken is what take --yes did: the preview carried out, the assignment.
type Taken struct {
	Preview  TakePreview `json:"preview"`
	Assigned Assigned    `json:"assigned"`
}

// takeDigestLen is how many hex characters of the sha256 a take digest shows.
const takeDigestLen = 16

// Take previews a module's cutover onto an adopted node from a live look
// at its machine, or, with r.Yes, looks again, refuses if the preview is no
// longer the one approved (saying what changed), and assigns the module
// with the cutover in its declaration: its host stops what was approved,
// then starts the module on the data already there, which it never wipes.
// Either way the preview is remembered by its digest for a while.
func (c *Nodes) Take(ctx context.Context, r TakeRequest) (TakePreview, *Taken, error) {
	if err := CheckNames(r.Node, r.Module); err != nil {
		return TakePreview{}, nil, err
	}
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return TakePreview{}, nil, err
	}
	n, ok := snap.Nodes[r.Node]
	switch {
	case !ok:
		return TakePreview{}, nil, fmt.Errorf("node %s %w", r.Node, inventory.ErrNodeNotFound)
	case snap.Current[r.Module] == "":
		return TakePreview{}, nil, fmt.Errorf("module %s: %w", r.Module, inventory.ErrModuleNotFound)
	case n.Mode != inventory.Adopted:
		return TakePreview{}, nil, fmt.Errorf("node %s %w", r.Node, ErrConverged)
	case !n.Joined:
		return TakePreview{}, nil, fmt.Errorf("node %s %w", r.Node, ErrNotJoined)
	case snap.VersionOn(r.Node, r.Module) != "":
		return TakePreview{}, nil, fmt.Errorf("module %s %w (%s)", r.Module, ErrAlreadyOnNode, r.Node)
	}
	m := snap.Manifests[r.Module][snap.Current[r.Module]]
	p := TakePreview{Node: r.Node, Module: r.Module, Version: m.Version, Declared: []protocol.Port{}, DeclaredData: []protocol.DeclaredData{}}
	for _, port := range m.Ports {
		p.Declared = append(p.Declared, protocol.Port{Name: port.Name, Port: port.Port, Expose: port.Expose})
	}
	for _, d := range m.Data {
		p.DeclaredData = append(p.DeclaredData, protocol.DeclaredData{Name: d.Name, Path: d.Path, Precious: d.Precious})
	}
	if p.Look, err = c.look(ctx, st, r.Node, protocol.LookAsk{Module: r.Module, Ports: p.Declared, Data: p.DeclaredData}); err != nil {
		return TakePreview{}, nil, err
	}
	for _, d := range p.Look.Data {
		if d.Symlink != "" {
			return TakePreview{}, nil, fmt.Errorf("data %s of %s at %s on %s %w (%s): take does not follow links", d.Name, r.Module, d.Path, r.Node, ErrTakeSymlink, d.Symlink)
		}
	}
	p.finish()
	other, old, err := previewShown(ctx, st.Inventory, inventory.TakePreview{Digest: p.Digest, Node: r.Node, Module: r.Module, ShownAt: c.Now()}, p, r.Yes)
	if err != nil {
		return TakePreview{}, nil, err
	}
	if r.Yes == "" {
		return p, nil, nil
	}
	if other {
		if old == nil {
			return p, nil, fmt.Errorf("nothing taken: %s %w (take %s %s); its preview's digest is %s", r.Yes, ErrTakeDigestUnknown, r.Node, r.Module, p.Digest)
		}
		return p, nil, fmt.Errorf("nothing taken: %w: %s; its digest is now %s", ErrTakeChanged, strings.Join(changes(*old, p), "; "), p.Digest)
	}
	tk := &inventory.Take{Digest: p.Digest, At: c.Now(), From: p.From, Units: p.Stop.Units}
	for _, pr := range p.Stop.Processes {
		tk.Processes = append(tk.Processes, inventory.TakeProcess{Pid: pr.Pid, Command: pr.Command})
	}
	what := "take " + r.Node + " " + r.Module
	out, err := (&Modules{c.uses}).AssignMany(ctx, ManyRequest{Nodes: []string{r.Node}, Modules: []string{r.Module}, Taken: tk})
	if err != nil {
		return p, nil, err
	}
	taken := &Taken{Preview: p, Assigned: out.Nodes[0]}
	taken.Assigned.Pushed = out.Pushed
	_, err = st.Health.RecordHandAct(ctx, health.HandAct{At: c.Now(), What: what, Cause: "take", Who: who(),
		Why: fmt.Sprintf("the cutover previewed as %s: %s", p.Digest, strings.Join(p.Cutover, "; "))})
	return p, taken, err
}

// look asks a node's host what runs there now (protocol.LookInbox) and
// opens its signed answer with the host's key.
func (c uses) look(ctx context.Context, st *Stores, node string, ask protocol.LookAsk) (protocol.LookAnswer, error) {
	hosts, err := st.Identity.Hosts(ctx)
	if err != nil {
		return protocol.LookAnswer{}, err
	}
	var key ed25519.PublicKey
	for _, h := range hosts {
		if h.Node == node {
			key = h.HostKey
		}
	}
	if key == nil {
		return protocol.LookAnswer{}, fmt.Errorf("node %s %w", node, ErrNotJoined)
	}
	n, err := st.Inventory.Node(ctx, node)
	if err != nil {
		return protocol.LookAnswer{}, err
	}
	nc, err := c.dialBroker(ctx, st.Identity)
	if err != nil {
		return protocol.LookAnswer{}, err
	}
	defer nc.Close()
	b, err := json.Marshal(ask)
	if err != nil {
		return protocol.LookAnswer{}, err
	}
	msg, err := requestHost(ctx, nc, node, protocol.NodeSubject(node, protocol.LookInbox), b)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return protocol.LookAnswer{}, fmt.Errorf("node %s %w: no host listens for a look (%s)", node, ErrNotConnected, silentSince(n))
	case err != nil:
		return protocol.LookAnswer{}, fmt.Errorf("node %s %w: its host did not answer a look within %s (%s)", node, ErrNotConnected, protocol.AnswerTimeout, silentSince(n))
	}
	var a protocol.LookAnswer
	if err := protocol.Open(msg.Data, key, &a); err != nil {
		return protocol.LookAnswer{}, fmt.Errorf("the look from %s: %w", node, err)
	}
	if a.Error != "" {
		return protocol.LookAnswer{}, fmt.Errorf("the look from %s: %s", node, a.Error)
	}
	return a, nil
}

// finish works out what the cutover stops and does, in words, and the digest.
func (p *TakePreview) finish() {
	units := map[string]bool{}
	procs := map[int]protocol.TakeProcess{}
	stop := func(h protocol.LookProcess) {
		if h.Pid == 0 {
			return
		}
		if h.Unit != "" && p.Look.Systemd {
			units[h.Unit] = true
			return
		}
		procs[h.Pid] = protocol.TakeProcess{Pid: h.Pid, Command: h.Command}
	}
	p.From = []string{}
	for _, s := range p.Look.Ports {
		for _, h := range s.Holders {
			stop(h)
		}
		p.From = append(p.From, fmt.Sprintf("%s/%d on %s %s", s.Proto, s.Port, s.Address, HoldersSaid(s.Holders)))
	}
	for _, u := range p.Look.Units {
		units[u] = true
		p.From = append(p.From, "unit "+u+" active")
	}
	for _, h := range p.Look.Processes {
		stop(h)
		p.From = append(p.From, fmt.Sprintf("process pid %d (%s)", h.Pid, h.Command))
	}
	p.Stop = protocol.DeclaredTake{Module: p.Module}
	for u := range units {
		p.Stop.Units = append(p.Stop.Units, u)
	}
	sort.Strings(p.Stop.Units)
	for _, pr := range procs {
		p.Stop.Processes = append(p.Stop.Processes, pr)
	}
	sort.Slice(p.Stop.Processes, func(i, j int) bool { return p.Stop.Processes[i].Pid < p.Stop.Processes[j].Pid })
	p.Cutover = []string{}
	for _, u := range p.Stop.Units {
		p.Cutover = append(p.Cutover, fmt.Sprintf("stop and disable unit %s (systemctl stop, then disable)", u))
	}
	for _, pr := range p.Stop.Processes {
		p.Cutover = append(p.Cutover, fmt.Sprintf("stop pid %d (%s): SIGTERM, then SIGKILL after %s, only while pid %d still runs %s",
			pr.Pid, pr.Command, protocol.TakeGrace, pr.Pid, pr.Command))
	}
	for _, s := range p.Look.Ports {
		if len(s.Holders) == 0 {
			p.Cutover = append(p.Cutover, fmt.Sprintf("leave %s/%d on %s alone: its holder is not visible to the host (another user's, as non-root), so the module may not get it",
				s.Proto, s.Port, s.Address))
		}
	}
	var paths []string
	for _, d := range p.Look.Data {
		paths = append(paths, d.Path)
	}
	on := "its data paths: none"
	if len(paths) > 0 {
		on = "the data already there (" + strings.Join(paths, ", ") + "), which is never wiped"
	}
	p.Cutover = append(p.Cutover, fmt.Sprintf("start %s %s on %s", p.Module, p.Version, on))
	p.Digest = takeDigest(*p)
	p.Stop.Digest = p.Digest
}

// HoldersSaid names who holds a socket, as a preview and a change say it.
func HoldersSaid(hs []protocol.LookProcess) string {
	if len(hs) == 0 {
		return "held by a process the host cannot see"
	}
	var out []string
	for _, h := range hs {
		s := fmt.Sprintf("pid %d (%s)", h.Pid, h.Command)
		if h.Unit != "" {
			s += " in " + h.Unit
		}
		out = append(out, s)
	}
	return "held by " + strings.Join(out, ", ")
}

// takeState is what a preview says of the machine, by what it is about:
// the digest is over it (sizes aside: a running holder writes), and two
// previews' changes are told from it.
func takeState(p TakePreview) map[string]string {
	s := map[string]string{}
	for _, port := range p.Look.Ports {
		s[fmt.Sprintf("%s/%d on %s", port.Proto, port.Port, port.Address)] = HoldersSaid(port.Holders)
	}
	for _, d := range p.Look.Data {
		what := "missing"
		switch {
		case d.Symlink != "":
			what = "a symbolic link to " + d.Symlink
		case d.Dir:
			what = "a directory"
		case d.Exists:
			what = "a file"
		}
		s["data "+d.Name+" at "+d.Path] = what
	}
	for _, u := range p.Look.Units {
		s["unit "+u] = "active"
	}
	for _, h := range p.Look.Processes {
		s[fmt.Sprintf("process pid %d", h.Pid)] = "running " + h.Command
	}
	s["systemd"] = fmt.Sprintf("running: %v", p.Look.Systemd)
	return s
}

// previewShown remembers preview p as shown (rec: its digest, node and
// module; module "" for converge, so that a digest of one is never taken
// for the other's). When yes names another digest, other is true and old
// is the preview it names, nil if it is not one of rec's node and module.
func previewShown[T any](ctx context.Context, inv *inventory.Store, rec inventory.TakePreview, p T, yes string) (other bool, old *T, err error) {
	body, err := json.Marshal(p)
	if err != nil {
		return false, nil, err
	}
	rec.Preview = string(body)
	if err := inv.ShowTakePreview(ctx, rec); err != nil {
		return false, nil, err
	}
	if yes == "" || yes == rec.Digest {
		return false, nil, nil
	}
	shown, ok, err := inv.ShownTakePreview(ctx, yes)
	if err != nil || !ok || shown.Node != rec.Node || shown.Module != rec.Module {
		return true, nil, err
	}
	var was T
	if err := json.Unmarshal([]byte(shown.Preview), &was); err != nil {
		return true, nil, err
	}
	return true, &was, nil
}

// takeDigest is the first takeDigestLen hex characters of the sha256 of
// the preview's canonical JSON: what it is of (node, module, version, what
// it declares), what runs there (takeState), and what the cutover does.
// The same machine gives the same bytes; another holder's pid another digest.
func takeDigest(p TakePreview) string {
	b, err := protocol.Canonical(map[string]any{"node": p.Node, "module": p.Module, "version": p.Version,
		"declared_ports": p.Declared, "declared_data": p.DeclaredData, "state": takeState(p), "cutover": p.Cutover})
	if err != nil {
		panic(err) // strings and numbers always marshal
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:takeDigestLen]
}

// changes says what differs between the preview approved and now.
func changes(old, now TakePreview) []string {
	out := stateChanges(takeState(old), takeState(now), func(key string) string {
		switch {
		case strings.HasPrefix(key, "unit "):
			return "not active"
		case strings.HasPrefix(key, "process "):
			return "not running"
		case strings.HasPrefix(key, "data "):
			return "not declared"
		}
		return "not listening"
	})
	if old.Version != now.Version {
		out = append(out, fmt.Sprintf("%s was version %s, now %s", now.Module, old.Version, now.Version))
	}
	if len(out) == 0 {
		out = append(out, "what the module declares")
	}
	return out
}

// stateChanges says, sorted, each key whose value differs between what a
// preview said (was) and what it says now (is); absent words a key one of
// them lacks.
func stateChanges(was, is map[string]string, absent func(key string) string) []string {
	keys := map[string]bool{}
	for k := range was {
		keys[k] = true
	}
	for k := range is {
		keys[k] = true
	}
	var out []string
	for k := range keys {
		a, ok := was[k]
		if !ok {
			a = absent(k)
		}
		b, ok := is[k]
		if !ok {
			b = absent(k)
		}
		if a != b {
			out = append(out, fmt.Sprintf("%s was %s, now %s", k, a, b))
		}
	}
	sort.Strings(out)
	return out
}
