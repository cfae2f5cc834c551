package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"mesh-controller/contexts/secrets"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"mesh-controller/app/protocol"
	"mesh-controller/contexts/inventory"
)

// Plan is what one node should run and why: a pure function of the stores
// (a snapshot), so computing it twice gives the same bytes.
type Plan struct {
	Node string
	// PlanVersion is the node's plan version the snapshot saw.
	PlanVersion int64
	// Body is the declaration body the node would be sent (no serial or issued_at).
	Body PlanBody
	// Reasons says, per module, why it is there.
	Reasons map[string][]string
	// Problems are why this plan cannot be declared as it stands.
	Problems []string
}

// PlanBody is a declaration body as plans make it.
type PlanBody struct {
	Node        string          `json:"node"`
	Mode        string          `json:"mode"`
	Modules     []PlannedModule `json:"modules"`
	Seats       []string        `json:"seats"`
	BackupLines []BackupLine    `json:"backup_lines"`
	// Delete is what a person asked, with cleanup delete, this node to delete.
	Delete []PlannedDeletion `json:"delete,omitempty"`
}

// BackupLine is one data set the backup seat's holder keeps copies of.
type BackupLine struct {
	Node       string     `json:"node"`
	Module     string     `json:"module"`
	Data       string     `json:"data"`
	Path       string     `json:"path"`
	Precious   string     `json:"precious"`
	Cadence    string     `json:"cadence"`
	LastBackup *time.Time `json:"last_backup"`
}

// PlannedDeletion is one cleanup the host carries out and reports done.
type PlannedDeletion struct {
	Module string `json:"module"`
	Kind   string `json:"kind"` // data or consumer
	Target string `json:"target"`
	Path   string `json:"path,omitempty"`
}

// PlannedConsumer is one consumer of a provider module, and its access.
type PlannedConsumer struct {
	Consumer          string `json:"consumer"`
	Provision         string `json:"provision"`
	State             string `json:"state"`
	CredentialName    string `json:"credential_name,omitempty"`
	CredentialVersion int64  `json:"credential_version,omitempty"`
	Credential        string `json:"credential,omitempty"`
}

// PlannedModule is one module of a plan.
type PlannedModule struct {
	Module   string                  `json:"module"`
	Version  string                  `json:"version"`
	Run      *inventory.Run          `json:"run,omitempty"`
	Ports    []inventory.Port        `json:"ports,omitempty"`
	Settings json.RawMessage         `json:"settings"`
	Data     []protocol.DeclaredData `json:"data"`
	Bindings []Binding               `json:"bindings"`
	Secrets  []SealedSecret          `json:"secrets"`
	// Consumers are a provider's consumers and their access.
	Consumers []PlannedConsumer `json:"consumers,omitempty"`
	// WaitingFor names the secrets the module waits for: its host does not
	// start it half-configured.
	WaitingFor []string `json:"waiting_for,omitempty"`
}

// SealedSecret is a secret as a declaration carries it: sealed to the node
// (and the operator), never plain.
type SealedSecret struct {
	Name    string `json:"name"`
	Version int64  `json:"version"`
	Sealed  string `json:"sealed"`
}

// Binding is which provider (node/module) a module gets a provision from,
// why that one, and the credential for it, sealed to both ends.
type Binding struct {
	Provision         string `json:"provision"`
	From              string `json:"from"`
	Why               string `json:"why"`
	CredentialName    string `json:"credential_name,omitempty"`
	CredentialVersion int64  `json:"credential_version,omitempty"`
	Credential        string `json:"credential,omitempty"`
}

// Canonical is the plan's body as canonical JSON.
func (p Plan) Canonical() ([]byte, error) { return protocol.Canonical(p.Body) }

// planner computes plans from one snapshot, compiling each settings schema
// once and indexing assignments by node, so a mesh's plans cost little more
// than reading it.
type planner struct {
	snap *inventory.Snapshot
	// sealed are the secrets' sealed copies, by node/module/name.
	sealed  map[string]secrets.Copy
	byNode  map[string][]inventory.Assignment
	schemas map[string]*jsonschema.Schema
	// settings caches effective settings of nodes without a layer of their own.
	settings map[string]settingsResult
	// bindings are every consumer's provider, and why.
	bindings map[string]choice
	// seatsOf is the seats each assignment holds.
	seatsOf map[inventory.Holder][]string
}

type settingsResult struct {
	doc      json.RawMessage
	problems []string
}

func newPlanner(snap *inventory.Snapshot, sealed map[string]secrets.Copy) *planner {
	p := &planner{snap: snap, sealed: sealed, byNode: map[string][]inventory.Assignment{}, schemas: map[string]*jsonschema.Schema{},
		settings: map[string]settingsResult{}}
	for _, a := range snap.Assignments {
		p.byNode[a.Node] = append(p.byNode[a.Node], a)
	}
	p.bindings = chooseBindings(snap)
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

// sealedCopies reads every secret's sealed copy, keyed node/module/name.
func sealedCopies(ctx context.Context, sec *secrets.Store) (map[string]secrets.Copy, error) {
	copies, err := sec.Copies(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string]secrets.Copy, len(copies))
	for _, c := range copies {
		out[c.Node+"/"+c.Module+"/"+c.Name] = c
	}
	return out, nil
}

func (pl *planner) schema(m inventory.Manifest) (*jsonschema.Schema, error) {
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

func (pl *planner) plan(node string) (Plan, error) {
	snap := pl.snap
	n, ok := snap.Nodes[node]
	if !ok {
		return Plan{}, fmt.Errorf("node %s %w", node, inventory.ErrNodeNotFound)
	}
	p := Plan{Node: node, PlanVersion: n.PlanVersion, Reasons: map[string][]string{},
		Body: PlanBody{Node: node, Mode: string(n.Mode), Modules: []PlannedModule{}, Seats: []string{}, BackupLines: []BackupLine{}}}
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
		pm := PlannedModule{Module: a.Module, Version: a.Version, Run: m.Run, Ports: m.Ports, Settings: settings,
			Data: []protocol.DeclaredData{}, Bindings: []Binding{}, Secrets: []SealedSecret{}}
		for _, sec := range m.Secrets {
			if c, ok := pl.sealed[node+"/"+a.Module+"/"+sec.Name]; ok {
				pm.Secrets = append(pm.Secrets, SealedSecret{Name: sec.Name, Version: c.Version, Sealed: c.Sealed})
			} else {
				pm.WaitingFor = append(pm.WaitingFor, sec.Name)
			}
		}
		for _, d := range m.Data {
			pm.Data = append(pm.Data, protocol.DeclaredData{Name: d.Name, Path: d.Path, Precious: d.Precious})
		}
		why := []string{"assigned by a person on " + a.AssignedAt.Format("2006-01-02")}
		if len(pm.WaitingFor) > 0 {
			why = append(why, "waits for secrets: "+strings.Join(waitingReasons(m, pm.WaitingFor, n.Joined), ", "))
		}
		for _, need := range m.Needs {
			ch, ok := pl.bindings[bindingKey(node, a.Module, need.Provision)]
			if !ok {
				if !need.Optional {
					p.Problems = append(p.Problems, fmt.Sprintf("%s needs %s and nothing in the mesh provides it", a.Module, need.Provision))
				}
				continue
			}
			b := Binding{Provision: need.Provision, From: ch.provider.String(), Why: ch.why}
			if c, ok := pl.sealed[ch.provider.String()+"/"+credentialName(node, a.Module, need.Provision)]; ok {
				b.CredentialName, b.CredentialVersion, b.Credential = c.Name, c.Version, c.Sealed
			}
			pm.Bindings = append(pm.Bindings, b)
			why = append(why, fmt.Sprintf("needs %s: bound to %s, %s", need.Provision, ch.provider, ch.why))
		}
		holder := inventory.Holder{Node: node, Module: a.Module}
		for _, seat := range pl.seatsOf[holder] {
			why = append(why, "holds seat "+seat)
			p.Body.Seats = append(p.Body.Seats, seat)
			if seat == snap.Seats.SeatName("backup") {
				p.Body.BackupLines = pl.backupLines()
			}
		}
		for _, cs := range snap.Seats.Consumers {
			if cs.Provider != holder || cs.State == "deleted" {
				continue
			}
			pc := PlannedConsumer{Consumer: cs.Consumer, Provision: cs.Provision, State: cs.State}
			if cs.State == "active" || cs.State == "rejected" || cs.State == "waiting" {
				cn, cm, _ := splitKey(cs.Consumer + "/x")
				if c, ok := pl.sealed[holder.String()+"/"+credentialName(cn, cm, cs.Provision)]; ok {
					pc.CredentialName, pc.CredentialVersion, pc.Credential = c.Name, c.Version, c.Sealed
				}
			}
			pm.Consumers = append(pm.Consumers, pc)
		}
		if len(a.Unverified) > 0 {
			why = append(why, "requirements not yet verified: "+strings.Join(a.Unverified, ", "))
		}
		p.Body.Modules = append(p.Body.Modules, pm)
		p.Reasons[a.Module] = append(why, neededBy(snap, m)...)
	}
	sort.Strings(p.Body.Seats)
	for _, d := range snap.Seats.Deletions {
		if d.Node == node {
			p.Body.Delete = append(p.Body.Delete, PlannedDeletion{Module: d.Module, Kind: d.Kind, Target: d.Target, Path: d.Path})
		}
	}
	return p, nil
}

// backupLines are every data set needing backup, for the backup seat's holder.
func (pl *planner) backupLines() []BackupLine {
	lines := []BackupLine{}
	for _, a := range pl.snap.Assignments {
		for _, d := range pl.snap.Manifests[a.Module][a.Version].Data {
			if d.Precious == inventory.Rebuildable {
				continue
			}
			l := BackupLine{Node: a.Node, Module: a.Module, Data: d.Name, Path: d.Path, Precious: d.Precious, Cadence: backupCadence(d).String()}
			if t, ok := pl.snap.Seats.Backups[a.Node+"/"+a.Module+"/"+d.Name]; ok {
				l.LastBackup = &t
			}
			lines = append(lines, l)
		}
	}
	return lines
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
func (pl *planner) effective(m inventory.Manifest, sch *jsonschema.Schema, node string) (json.RawMessage, []string) {
	layers := pl.snap.Settings[m.Module]
	if _, own := layers[node]; own {
		return effectiveSettings(m, sch, layers, node)
	}
	key := m.Module + "@" + m.Version
	if r, ok := pl.settings[key]; ok {
		return r.doc, r.problems
	}
	doc, problems := effectiveSettings(m, sch, layers, node)
	pl.settings[key] = settingsResult{doc, problems}
	return doc, problems
}

// neededBy says which assignments in the mesh need what a module provides.
func neededBy(snap *inventory.Snapshot, provider inventory.Manifest) []string {
	var out []string
	for _, prov := range provider.Provides {
		var consumers []string
		for _, a := range snap.Assignments {
			m := snap.Manifests[a.Module][a.Version]
			for _, need := range m.Needs {
				if need.Provision == prov.Provision {
					consumers = append(consumers, a.Node+"/"+a.Module)
				}
			}
		}
		if len(consumers) > 0 {
			out = append(out, fmt.Sprintf("provides %s, needed by %s", prov.Provision, strings.Join(consumers, ", ")))
		}
	}
	return out
}

// effectiveSettings merges the manifest's defaults, then the mesh layer,
// then the node's layer (objects key by key), and judges the result against
// the manifest's schema.
func effectiveSettings(m inventory.Manifest, sch *jsonschema.Schema, layers map[string]json.RawMessage, node string) (json.RawMessage, []string) {
	var docs []json.RawMessage
	if m.Settings != nil && len(m.Settings.Defaults) > 0 {
		docs = append(docs, m.Settings.Defaults)
	}
	for _, l := range []string{"", node} {
		if b, ok := layers[l]; ok {
			docs = append(docs, b)
		}
	}
	merged, err := mergeSettings(docs...)
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
func mergeSettings(docs ...json.RawMessage) (json.RawMessage, error) {
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
