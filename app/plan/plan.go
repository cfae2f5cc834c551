// Package plan computes what one node should run, and why: a pure function
// of a snapshot of the inventory and the secrets' sealed copies, so that
// computing a plan twice gives the same bytes. It does no I/O (a layout
// test keeps it so); the application reads the stores and signs what it
// makes.
package plan

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"mesh-controller/app/overlay"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/inventory"
)

// Plan is what one node should run and why.
type Plan struct {
	Node string
	// PlanVersion is the node's plan version the snapshot saw.
	PlanVersion int64
	// Body is the declaration the node would be sent (no serial or issued_at).
	Body protocol.Declaration
	// Reasons says, per module, why it is there.
	Reasons map[string][]string
	// Problems are why this plan cannot be declared as it stands.
	Problems []string
}

// Sealed is a secret's sealed copy as a plan carries it.
type Sealed struct {
	Name    string
	Version int64
	Sealed  string
}

// runOf and portsOf carry the manifest's run and ports into the
// declaration; run's env has each ${settings.NAME} filled in from the
// node's effective settings (a string as it is, anything else as JSON, an
// unset one as nothing).
func runOf(m inventory.Manifest, settings json.RawMessage) *protocol.Run {
	if m.Run == nil {
		return nil
	}
	r := &protocol.Run{Command: m.Run.Command, StopGrace: m.Run.StopGrace}
	if rd := m.Run.Ready; rd != nil {
		r.Ready = &protocol.Ready{Port: rd.Port, Command: rd.Command, After: rd.After}
	}
	if len(m.Run.Env) > 0 {
		var values map[string]json.RawMessage
		_ = json.Unmarshal(settings, &values) // not an object: every reference is unset
		r.Env = make(map[string]string, len(m.Run.Env))
		for k, v := range m.Run.Env {
			r.Env[k] = settingRef.ReplaceAllStringFunc(v, func(ref string) string {
				raw, ok := values[strings.TrimSuffix(strings.TrimPrefix(ref, "${settings."), "}")]
				if !ok {
					return ""
				}
				var str string
				if json.Unmarshal(raw, &str) == nil {
					return str
				}
				return string(raw)
			})
		}
	}
	return r
}

// settingRef is a reference module check allows in run.env.
var settingRef = regexp.MustCompile(`\$\{settings\.[^}]+\}`)

func portsOf(m inventory.Manifest) []protocol.Port {
	var out []protocol.Port
	for _, p := range m.Ports {
		out = append(out, protocol.Port{Name: p.Name, Port: p.Port, Expose: p.Expose})
	}
	return out
}

// CadenceWord names how often a data set is backed up: its manifest's
// word, else daily for irreplaceable and weekly for costly data.
func CadenceWord(d inventory.DataSpec) string {
	if d.Backup.Every != "" {
		return d.Backup.Every
	}
	if d.Precious == inventory.Costly {
		return "weekly"
	}
	return "daily"
}

var cadences = map[string]time.Duration{"hourly": time.Hour, "daily": 24 * time.Hour, "weekly": 7 * 24 * time.Hour}

// BackupCadence is how often a data set is backed up, as CadenceWord names it.
func BackupCadence(d inventory.DataSpec) time.Duration {
	if c, ok := cadences[CadenceWord(d)]; ok {
		return c
	}
	// A word the manifest check refuses is timed by the default for its
	// preciousness (CadenceWord still shows it as written).
	return cadences[CadenceWord(inventory.DataSpec{Precious: d.Precious})]
}

// Planner computes plans from one snapshot, compiling each settings schema
// once and indexing assignments by node, so a mesh's plans cost little more
// than reading it.
type Planner struct {
	snap *inventory.Snapshot
	// sealed are the secrets' sealed copies, by node/module/name.
	sealed  map[string]Sealed
	byNode  map[string][]inventory.Assignment
	schemas map[string]*jsonschema.Schema
	// settings caches effective settings of nodes without a layer of their own.
	settings map[string]settingsResult
	// bindings are every consumer's provider, and why.
	bindings map[string]inventory.Choice
	// seatsOf is the seats each assignment holds.
	seatsOf map[inventory.Holder][]string
	// creds are the modules' own broker users, sealed to their nodes, by
	// node/module.
	creds map[string]string
	// licences are the licence copies each module holds, by node/module.
	licences map[string][]Sealed
	// managed are the refresh-token copies each manager holds, by
	// node/module.
	managed map[string][]Sealed
	// render renders the packet filter of a node the mesh owns one on,
	// from its plan's body; nil: none can be.
	render FilterRender
	// overlay is the mesh's overlay, computed once (on the first plan) for
	// all the plans of this snapshot.
	overlay *overlay.Mesh
	// recipients are the hosts' age recipients, by node (WithRecipients).
	recipients map[string]string
	// meshWide is what every plan reads of the whole mesh, computed once
	// (on the first plan that needs it) and indexed, so that a declare to
	// every node costs in proportion to the mesh, not to its square.
	meshWide *meshWide
}

// meshWide is what the plans of one snapshot share: each part a scan of
// the whole mesh, made once and indexed by what one plan looks up.
type meshWide struct {
	// backupSets are BackupSets(snap); setsOf are their indexes by node.
	backupSets []BackupSet
	setsOf     map[string][]int
	// holder is Backup(), once.
	holder BackupHolder
	// consumers are the seats' consumers by provider, not deleted.
	consumers map[inventory.Holder][]inventory.Consumer
	// deletions are the seats' deletions by node.
	deletions map[string][]inventory.Deletion
	// neededBy are neededBy's lines, by module@version of the provider.
	neededBy map[string][]string
}

// shared computes what the plans of this snapshot share, once.
func (pl *Planner) shared() *meshWide {
	if pl.meshWide != nil {
		return pl.meshWide
	}
	snap := pl.snap
	w := &meshWide{setsOf: map[string][]int{}, consumers: map[inventory.Holder][]inventory.Consumer{},
		deletions: map[string][]inventory.Deletion{}, neededBy: map[string][]string{}}
	w.backupSets = BackupSets(snap)
	for i, s := range w.backupSets {
		w.setsOf[s.Node] = append(w.setsOf[s.Node], i)
	}
	w.holder = pl.Backup()
	for _, cs := range snap.Seats.Consumers {
		if cs.State != "deleted" {
			w.consumers[cs.Provider] = append(w.consumers[cs.Provider], cs)
		}
	}
	for _, d := range snap.Seats.Deletions {
		w.deletions[d.Node] = append(w.deletions[d.Node], d)
	}
	// Who needs each provision, in the order of the assignments, read once.
	consumersOf := map[string][]string{}
	for _, a := range snap.Assignments {
		for _, need := range snap.Manifests[a.Module][a.Version].Needs {
			consumersOf[need.Provision] = append(consumersOf[need.Provision], a.Node+"/"+a.Module)
		}
	}
	for _, versions := range snap.Manifests {
		for v, m := range versions {
			var out []string
			for _, prov := range m.Provides {
				if cs := consumersOf[prov.Provision]; len(cs) > 0 {
					out = append(out, fmt.Sprintf("provides %s, needed by %s", prov.Provision, strings.Join(cs, ", ")))
				}
			}
			w.neededBy[m.Module+"@"+v] = out
		}
	}
	pl.meshWide = w
	return w
}

// Overlay is the node's overlay part as computed from the snapshot, less
// what its host would refuse of it (overlay.Mesh.Accepted): never a part
// that makes the host refuse the declaration. Nil: none, its host has
// reported no key yet (or one another node holds).
func (pl *Planner) Overlay(node string) *protocol.DeclaredOverlay {
	if pl.overlay == nil {
		m := overlay.Compute(pl.snap.Overlay)
		pl.overlay = &m
	}
	d, _ := pl.overlay.Accepted(node)
	return d
}

// FilterRender renders the packet filter f a node's declaration carries
// from the rest of its body: the ruleset text (one table inet mesh).
type FilterRender func(body protocol.Declaration, f inventory.Filter) (string, error)

// WithCreds gives the planner each module's broker user, sealed to its
// node, by node/module: a declared module carries its own.
func (pl *Planner) WithCreds(creds map[string]string) *Planner {
	pl.creds = creds
	return pl
}

// WithLicences gives the planner the copy of each licence a module holds
// (its current version, sealed to its node), by node/module.
func (pl *Planner) WithLicences(held map[string][]Sealed) *Planner {
	pl.licences = held
	return pl
}

// WithManaged gives the planner the refresh token of each licence a module
// manages (sealed to its node), by node/module.
func (pl *Planner) WithManaged(managed map[string][]Sealed) *Planner {
	pl.managed = managed
	return pl
}

// WithFilter gives the planner the renderer of the packet filter of each
// node the mesh owns one on (converged with --filter). A node that owns a
// filter cannot be planned without it: declared without one, its host
// would remove the filter.
func (pl *Planner) WithFilter(render FilterRender) *Planner {
	pl.render = render
	return pl
}

// providedPort is the port a provider names for a provision, or 0.
func (pl *Planner) providedPort(h inventory.Holder, provision string) int {
	for _, p := range pl.snap.Manifests[h.Module][pl.snap.VersionOn(h.Node, h.Module)].Provides {
		if p.Provision == provision {
			return p.Port
		}
	}
	return 0
}

type settingsResult struct {
	doc      json.RawMessage
	problems []string
}

// New makes a planner over a snapshot and the sealed copies, keyed
// node/module/name.
func New(snap *inventory.Snapshot, sealed map[string]Sealed) *Planner {
	p := &Planner{snap: snap, sealed: sealed, byNode: map[string][]inventory.Assignment{}, schemas: map[string]*jsonschema.Schema{},
		settings: map[string]settingsResult{}}
	for _, a := range snap.Assignments {
		p.byNode[a.Node] = append(p.byNode[a.Node], a)
	}
	p.bindings = snap.ChooseBindings()
	p.seatsOf = map[inventory.Holder][]string{}
	for seat, holders := range snap.Seats.Holders {
		for _, h := range holders {
			p.seatsOf[h] = append(p.seatsOf[h], seat)
		}
	}
	for h := range p.seatsOf {
		sort.Strings(p.seatsOf[h])
	}
	return p
}

func (pl *Planner) schema(m inventory.Manifest) (*jsonschema.Schema, error) {
	key := m.Module + "@" + m.Version
	if s, ok := pl.schemas[key]; ok {
		return s, nil
	}
	s, err := m.SettingsSchema()
	if err != nil {
		return nil, err
	}
	pl.schemas[key] = s
	return s, nil
}

// Plan computes one node's plan.
func (pl *Planner) Plan(node string) (Plan, error) {
	snap := pl.snap
	n, ok := snap.Nodes[node]
	if !ok {
		return Plan{}, fmt.Errorf("node %s %w", node, inventory.ErrNodeNotFound)
	}
	p := Plan{Node: node, PlanVersion: n.PlanVersion, Reasons: map[string][]string{},
		Body: protocol.Declaration{Node: node, Mode: string(n.Mode), Modules: []protocol.DeclaredModule{}, Seats: []string{}, BackupLines: []protocol.BackupLine{}}}
	p.Body.Host = hostOf(snap, n)
	for _, a := range pl.byNode[node] {
		m, ok := snap.Manifests[a.Module][a.Version]
		if !ok {
			p.Problems = append(p.Problems, fmt.Sprintf("%s %s is not registered", a.Module, a.Version))
			continue
		}
		sch, err := pl.schema(m)
		if err != nil {
			p.Problems = append(p.Problems, fmt.Sprintf("%s settings schema: %v", a.Module, err))
			continue
		}
		settings, problems := pl.effective(m, sch, node)
		for _, pr := range problems {
			p.Problems = append(p.Problems, fmt.Sprintf("%s settings%s", a.Module, pr))
		}
		pm := protocol.DeclaredModule{Module: a.Module, Version: a.Version, Run: runOf(m, settings), Ports: portsOf(m), Settings: settings,
			Data: []protocol.DeclaredData{}, Bindings: []protocol.DeclaredBinding{}, Secrets: []protocol.DeclaredSecret{},
			BrokerCreds: pl.creds[node+"/"+a.Module]}
		if m.Requires != nil {
			pm.MemoryMB = m.Requires.MemoryMB
		}
		if m.Prepare != nil {
			pm.Prepare = &protocol.Prepare{Command: m.Prepare.Command, Timeout: m.Prepare.Timeout}
			// A roll-out a person allowed without a snapshot marks the
			// version it moves this node to.
			pm.WithoutSnapshot = snap.WithoutSnapshot[inventory.Holder{Node: node, Module: a.Module}] == a.Version
		}
		if built, ok := snap.Archives[a.Module+"@"+a.Version]; ok {
			pm.Archive = &protocol.Archive{Digest: built.Digest, Bytes: built.Bytes, UnpackedBytes: built.UnpackedBytes}
		}
		for _, sec := range m.Secrets {
			if c, ok := pl.sealed[node+"/"+a.Module+"/"+sec.Name]; ok {
				pm.Secrets = append(pm.Secrets, protocol.DeclaredSecret{Name: sec.Name, Version: c.Version, Sealed: c.Sealed})
			} else {
				pm.WaitingFor = append(pm.WaitingFor, sec.Name)
			}
		}
		held := map[string]bool{}
		for _, l := range pl.licences[node+"/"+a.Module] {
			pm.Licences = append(pm.Licences, protocol.DeclaredLicence{Name: l.Name, Version: l.Version, Sealed: l.Sealed})
			held[l.Name] = true
		}
		for _, l := range pl.managed[node+"/"+a.Module] {
			pm.Manages = append(pm.Manages, protocol.DeclaredLicence{Name: l.Name, Version: l.Version, Sealed: l.Sealed})
		}
		for _, need := range m.Licences {
			if !held[need.Name] {
				pm.WaitingForLicences = append(pm.WaitingForLicences, need.Name)
			}
		}
		for _, d := range m.Data {
			pm.Data = append(pm.Data, protocol.DeclaredData{Name: d.Name, Path: d.Path, Precious: d.Precious})
		}
		why := []string{"assigned by a person on " + a.AssignedAt.Format("2006-01-02")}
		if tk := a.Taken; tk != nil {
			why = []string{takenReason(tk)}
			dt := protocol.DeclaredTake{Digest: tk.Digest, Module: a.Module, Units: tk.Units}
			for _, pr := range tk.Processes {
				dt.Processes = append(dt.Processes, protocol.TakeProcess{Pid: pr.Pid, Command: pr.Command})
			}
			p.Body.Taken = append(p.Body.Taken, dt)
		}
		if len(pm.WaitingFor) > 0 {
			why = append(why, "waits for secrets: "+strings.Join(waitingReasons(m, pm.WaitingFor, n.Joined), ", "))
		}
		for _, l := range pm.WaitingForLicences {
			why = append(why, fmt.Sprintf("waits for licence %s (a person gives it: mesh-controller licence use %s %s/%s --key OPERATOR-KEY)", l, l, node, a.Module))
		}
		for _, need := range m.Needs {
			ch, ok := pl.bindings[inventory.BindingKey(node, a.Module, need.Provision)]
			if !ok {
				if !need.Optional {
					p.Problems = append(p.Problems, fmt.Sprintf("%s needs %s and nothing in the mesh provides it", a.Module, need.Provision))
				}
				continue
			}
			b := protocol.DeclaredBinding{Provision: need.Provision, From: ch.Provider.String(), Why: ch.Why, Port: pl.providedPort(ch.Provider, need.Provision)}
			if c, ok := pl.sealed[ch.Provider.String()+"/"+inventory.CredentialName(node, a.Module, need.Provision)]; ok {
				b.CredentialName, b.CredentialVersion, b.Credential = c.Name, c.Version, c.Sealed
			}
			pm.Bindings = append(pm.Bindings, b)
			why = append(why, fmt.Sprintf("needs %s: bound to %s, %s", need.Provision, ch.Provider, ch.Why))
		}
		holder := inventory.Holder{Node: node, Module: a.Module}
		for _, seat := range pl.seatsOf[holder] {
			why = append(why, "holds seat "+seat)
			p.Body.Seats = append(p.Body.Seats, seat)
			pm.Seats = append(pm.Seats, seat)
			if seat == snap.Seats.SeatName("backup") {
				p.Body.BackupLines = pl.backupLines()
				pm.HoldsBackup = true
			}
		}
		for _, cs := range pl.shared().consumers[holder] {
			pc := protocol.DeclaredConsumer{Consumer: cs.Consumer, Provision: cs.Provision, State: cs.State}
			if cs.State == "active" || cs.State == "rejected" || cs.State == "waiting" {
				cn, cm, _ := strings.Cut(cs.Consumer, "/")
				if c, ok := pl.sealed[holder.String()+"/"+inventory.CredentialName(cn, cm, cs.Provision)]; ok {
					pc.CredentialName, pc.CredentialVersion, pc.Credential = c.Name, c.Version, c.Sealed
				}
			}
			pm.Consumers = append(pm.Consumers, pc)
		}
		if len(a.Unverified) > 0 {
			why = append(why, "requirements not yet verified: "+strings.Join(a.Unverified, ", "))
		}
		p.Body.Modules = append(p.Body.Modules, pm)
		p.Reasons[a.Module] = append(why, pl.shared().neededBy[a.Module+"@"+a.Version]...)
	}
	sort.Strings(p.Body.Seats)
	if rt, ok := snap.Routing[node]; ok {
		p.Body.PublicDomain = rt.PublicDomain
		if len(rt.Networks) > 0 {
			p.Body.Networks = rt.Networks
		}
	}
	for _, d := range pl.shared().deletions[node] {
		p.Body.Delete = append(p.Body.Delete, protocol.DeclaredDeletion{Module: d.Module, Kind: d.Kind, Target: d.Target, Path: d.Path})
	}
	p.Body.Backups = pl.backups(node)
	p.Body.Overlay = pl.Overlay(node)
	// Last: the filter is rendered from the rest of the body.
	if f, ok := snap.Filters[node]; ok {
		rs, err := "", fmt.Errorf("none was rendered for it")
		if pl.render != nil {
			rs, err = pl.render(p.Body, f)
		}
		if err != nil {
			p.Problems = append(p.Problems, fmt.Sprintf("%s owns the %s filter: %v", node, f.Kind, err))
		} else {
			p.Body.Filter = &protocol.DeclaredFilter{Kind: f.Kind, Ruleset: rs}
		}
	}
	return p, nil
}

// waitingReasons says why each missing secret is missing.
func waitingReasons(m inventory.Manifest, names []string, joined bool) []string {
	var out []string
	for _, name := range names {
		for _, s := range m.Secrets {
			if s.Name != name {
				continue
			}
			switch {
			case s.MadeBy == "person":
				out = append(out, name+" (a person gives it: mesh-controller secret accept)")
			case !joined:
				out = append(out, name+" (the mesh makes it when the node joins)")
			default:
				out = append(out, name+" (the mesh makes it once an operator key is set)")
			}
		}
	}
	return out
}

// effective is effectiveSettings, computed once per module version for the
// nodes that have no layer of their own.
func (pl *Planner) effective(m inventory.Manifest, sch *jsonschema.Schema, node string) (json.RawMessage, []string) {
	layers := pl.snap.Settings[m.Module]
	if _, own := layers[node]; own {
		return EffectiveSettings(m, sch, layers, node)
	}
	key := m.Module + "@" + m.Version
	if r, ok := pl.settings[key]; ok {
		return r.doc, r.problems
	}
	doc, problems := EffectiveSettings(m, sch, layers, node)
	pl.settings[key] = settingsResult{doc, problems}
	return doc, problems
}

// effectiveSettings merges the manifest's defaults, then the mesh layer,
// then the node's layer (objects key by key), and judges the result against
// the manifest's schema.
func EffectiveSettings(m inventory.Manifest, sch *jsonschema.Schema, layers map[string]json.RawMessage, node string) (json.RawMessage, []string) {
	var docs []json.RawMessage
	if m.Settings != nil && len(m.Settings.Defaults) > 0 {
		docs = append(docs, m.Settings.Defaults)
	}
	for _, l := range []string{"", node} {
		if b, ok := layers[l]; ok {
			docs = append(docs, b)
		}
	}
	merged, err := MergeSettings(docs...)
	if err != nil {
		return nil, []string{": " + err.Error()}
	}
	var out []string
	for _, pr := range inventory.Validate(sch, merged) {
		out = append(out, fmt.Sprintf(" %s: %s", pr.Field, pr.What))
	}
	return merged, out
}

// mergeSettings merges JSON objects in order, later keys over earlier ones,
// objects key by key and all else replaced, into canonical JSON.
func MergeSettings(docs ...json.RawMessage) (json.RawMessage, error) {
	result := map[string]any{}
	for _, d := range docs {
		var obj map[string]any
		dec := json.NewDecoder(bytes.NewReader(d))
		dec.UseNumber()
		if err := dec.Decode(&obj); err != nil {
			return nil, fmt.Errorf("not a JSON object: %w", err)
		}
		mergeInto(result, obj)
	}
	return protocol.Canonical(result)
}

func mergeInto(dst, src map[string]any) {
	keys := make([]string, 0, len(src))
	for k := range src {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		sv := src[k]
		if so, ok := sv.(map[string]any); ok {
			if do, ok := dst[k].(map[string]any); ok {
				mergeInto(do, so)
				continue
			}
		}
		dst[k] = sv
	}
}

// takenReason says that a module was taken onto an adopted node, when, and
// from what.
func takenReason(tk *inventory.Take) string {
	from := "nothing running there"
	if len(tk.From) > 0 {
		from = strings.Join(tk.From, "; ")
	}
	return fmt.Sprintf("taken by a person on %s (preview %s) from: %s", tk.At.UTC().Format("2006-01-02"), tk.Digest, from)
}

// Routed is one public port of a node's plan and the name it is routed
// under: <port>.<module>.<domain>, or "" when the node has no public
// domain and the port is not reachable.
type Routed struct {
	Module string `json:"module"`
	Port   string `json:"port"`
	Number int    `json:"number"`
	Name   string `json:"name"`
}

// RoutedNames lists a declaration's public ports, each with its routed
// name, in the declaration's order.
func RoutedNames(d protocol.Declaration) []Routed {
	var out []Routed
	for _, m := range d.Modules {
		for _, p := range m.Ports {
			if p.Expose != "public" {
				continue
			}
			r := Routed{Module: m.Module, Port: p.Name, Number: p.Port}
			if d.PublicDomain != "" {
				r.Name = p.Name + "." + m.Module + "." + d.PublicDomain
			}
			out = append(out, r)
		}
	}
	return out
}

// hostOf is the host release declared to a node, with its archive when
// the controller keeps one of that version; nil when none is declared.
func hostOf(snap *inventory.Snapshot, n inventory.NodeState) *protocol.DeclaredHost {
	if n.HostRelease == "" {
		return nil
	}
	h := &protocol.DeclaredHost{Version: n.HostRelease}
	if r, ok := snap.HostReleases[n.HostRelease]; ok {
		h.Archive = &protocol.Archive{Digest: r.Archive.Digest, Bytes: r.Archive.Bytes, UnpackedBytes: r.Archive.UnpackedBytes}
	}
	return h
}
