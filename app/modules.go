package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"mesh-controller/app/builder"
	"mesh-controller/app/plan"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/health"
	"mesh-controller/contexts/identity"
	"mesh-controller/contexts/inventory"
	"mesh-controller/contexts/secrets"
	"mesh-controller/embedded/broker"
)

// ManifestProblem is one problem module check found: the file, the field, what.
type ManifestProblem struct {
	File  string `json:"file"`
	Field string `json:"field"`
	What  string `json:"what"`
}

func (p ManifestProblem) String() string { return p.File + ": " + p.Field + ": " + p.What }

// ManifestsJudged is module check's judgement as one document: OK when no
// manifest has a problem. A problem is an error: a manifest with one is
// refused by module add.
type ManifestsJudged struct {
	OK        bool              `json:"ok"`
	Manifests []string          `json:"manifests"`
	Problems  []ManifestProblem `json:"problems"`
}

// ErrNoManifests means module check was given paths holding no manifest.
var ErrNoManifests = errors.New("no manifest found: a directory is searched for mesh.json files, and the .json files directly in it")

// ModuleCheck judges manifests where they are written, with no mesh and no
// store: files as given; a directory by the mesh.json files beneath it (a
// tree of module sources) and the .json files directly in it (a folder of
// manifests, as ../shared/examples is). It returns the files judged and
// every problem.
func ModuleCheck(paths []string) (files []string, problems []ManifestProblem, err error) {
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			problems = append(problems, ManifestProblem{File: p, Field: "(file)", What: "cannot be read: " + errors.Unwrap(err).Error()})
			continue
		}
		if !fi.IsDir() {
			files = append(files, p)
			continue
		}
		filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
			top := filepath.Dir(path) == filepath.Clean(p)
			if err == nil && !d.IsDir() && (d.Name() == "mesh.json" || (top && filepath.Ext(d.Name()) == ".json")) {
				files = append(files, path)
			}
			return nil
		})
	}
	if len(files) == 0 && len(problems) == 0 {
		return nil, nil, ErrNoManifests
	}
	for _, f := range files {
		b, err := ReadInput(f, MaxManifestBytes, "a manifest")
		if err != nil {
			problems = append(problems, ManifestProblem{File: f, Field: "(file)", What: err.Error()})
			continue
		}
		_, ps := inventory.ParseManifest(b)
		for _, p := range ps {
			problems = append(problems, ManifestProblem{File: f, Field: p.Field, What: p.What})
		}
	}
	return files, problems, nil
}

// readManifest reads and judges one manifest file; any problem refuses.
func readManifest(file string) (inventory.Manifest, error) {
	b, err := ReadInput(file, MaxManifestBytes, "a manifest")
	if err != nil {
		return inventory.Manifest{}, err
	}
	m, ps := inventory.ParseManifest(b)
	var problems []string
	for _, p := range ps {
		problems = append(problems, file+": "+p.String())
	}
	if err := refuse("module add "+file, problems); err != nil {
		return inventory.Manifest{}, err
	}
	return m, nil
}

// ModuleAdded is what module add did.
type ModuleAdded struct {
	Module   string
	Version  string
	Added    inventory.Added
	Current  string
	Behind   []string // nodes running an older version
	Manifest inventory.Manifest
}

// ModuleAdd registers a module version from its manifest (checked first).
func (c *Modules) ModuleAdd(ctx context.Context, file, source string) (ModuleAdded, error) {
	m, err := readManifest(file)
	if err != nil {
		return ModuleAdded{}, err
	}
	if err := inventory.CheckRepository(source); err != nil {
		return ModuleAdded{}, fmt.Errorf("--source: %w", err)
	}
	st, err := c.stores(ctx)
	if err != nil {
		return ModuleAdded{}, err
	}
	inv := st.Inventory
	canon, err := protocol.Canonical(m)
	if err != nil {
		return ModuleAdded{}, err
	}
	added, err := inv.AddModule(ctx, m, canon, source, c.Now())
	if err != nil {
		return ModuleAdded{}, err
	}
	mod, err := inv.Module(ctx, m.Module)
	if err != nil {
		return ModuleAdded{}, err
	}
	snap, err := inv.Snapshot(ctx)
	if err != nil {
		return ModuleAdded{}, err
	}
	out := ModuleAdded{Module: m.Module, Version: m.Version, Added: added, Current: mod.CurrentVersion, Manifest: m}
	for _, a := range snap.Assignments {
		if a.Module == m.Module && inventory.CompareVersions(a.Version, mod.CurrentVersion) < 0 {
			out.Behind = append(out.Behind, a.Node)
		}
	}
	return out, nil
}

// ModuleView is a module as module list shows it.
type ModuleView struct {
	Name         string   `json:"name"`
	Version      string   `json:"version"`
	Versions     []string `json:"versions"`
	Source       string   `json:"source"`
	Commit       string   `json:"commit"`
	MovedCommit  string   `json:"moved_commit,omitempty"`
	BehindSource bool     `json:"behind_source"`
	Nodes        []string `json:"nodes"`
	Description  string   `json:"description"`
}

// ModuleList lists every module: version, source, behind its source or not, where it runs.
func (c *Modules) ModuleList(ctx context.Context) ([]ModuleView, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return nil, err
	}
	inv := st.Inventory
	mods, err := inv.Modules(ctx)
	if err != nil {
		return nil, err
	}
	snap, err := inv.Snapshot(ctx)
	if err != nil {
		return nil, err
	}
	out := []ModuleView{}
	for _, m := range mods {
		nodes := snap.NodesRunning(m.Name)
		if nodes == nil {
			nodes = []string{}
		}
		out = append(out, ModuleView{Name: m.Name, Version: m.CurrentVersion, Versions: m.Versions, Source: inventory.RedactRepository(m.Source), Commit: m.Commit,
			MovedCommit: m.MovedCommit, BehindSource: m.BehindSource(), Nodes: nodes, Description: m.Current.Description})
	}
	return out, nil
}

// ModuleMoved records that a module's source has a commit newer than the mesh built.
func (c *Modules) ModuleMoved(ctx context.Context, name, commit string) error {
	if err := CheckName(name); err != nil {
		return err
	}
	if strings.TrimSpace(commit) == "" || strings.ContainsAny(commit, " \t\n") {
		return errors.New("a commit is one word, such as a hash")
	}
	st, err := c.stores(ctx)
	if err != nil {
		return err
	}
	return st.Inventory.MarkMoved(ctx, name, commit)
}

// ForgetRequest is what module forget is asked.
type ForgetRequest struct {
	Name string
	// AndWhatItHolds discards the settings and secrets the mesh holds for
	// it, which are otherwise a reason to refuse; it is a hand act, so it
	// needs Why.
	AndWhatItHolds bool
	Why            string
}

// Forgotten is what module forget did.
type Forgotten struct {
	inventory.Holdings
	// Secrets are, per node, the secrets whose sealed copies were
	// discarded: their names, never their values.
	Secrets []secrets.Holding
	// Revoked counts the broker users issued for it, now revoked;
	// Disconnected says the serving controller was told to close their
	// connections (otherwise it does when serve runs).
	Revoked      int
	Disconnected bool
}

// Discarded says what --and-what-it-holds discarded, in a few words:
// settings layers and secrets per node, by name.
func (f Forgotten) Discarded() string {
	var parts []string
	if len(f.Settings) > 0 {
		parts = append(parts, Plural(len(f.Settings), "settings layer")+" ("+strings.Join(f.Settings, ", ")+")")
	}
	for _, h := range f.Secrets {
		parts = append(parts, Plural(len(h.Names), "secret")+" on "+h.Node+" ("+strings.Join(h.Names, ", ")+")")
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, "; ")
}

// ModuleForget removes a module; refused while a node runs it, or while the
// mesh holds settings or secrets for it unless AndWhatItHolds discards them,
// which is recorded as a hand act. Its broker users are revoked and their
// connections closed.
func (c *Modules) ModuleForget(ctx context.Context, r ForgetRequest) (Forgotten, error) {
	name := r.Name
	if err := CheckName(name); err != nil {
		return Forgotten{}, err
	}
	if r.AndWhatItHolds && r.Why == "" {
		return Forgotten{}, fmt.Errorf("discarding what %s holds: %w", name, health.ErrNoWhy)
	}
	st, err := c.stores(ctx)
	if err != nil {
		return Forgotten{}, err
	}
	inv, ids, sec := st.Inventory, st.Identity, st.Secrets
	h, err := inv.ModuleHoldings(ctx, name)
	if err != nil {
		return Forgotten{}, err
	}
	f := Forgotten{Holdings: h}
	if f.Secrets, err = sec.Held(ctx, name); err != nil {
		return f, err
	}
	var problems []string
	if len(h.Nodes) > 0 {
		problems = append(problems, fmt.Sprintf("assigned on %s: unassign it first", strings.Join(h.Nodes, ", ")))
	}
	if len(h.Settings) > 0 && !r.AndWhatItHolds {
		problems = append(problems, fmt.Sprintf("settings held for %s: clear them, or add --and-what-it-holds --why \"...\" to discard them", strings.Join(h.Settings, ", ")))
	}
	if len(f.Secrets) > 0 && !r.AndWhatItHolds {
		var on []string
		for _, hs := range f.Secrets {
			on = append(on, hs.Node)
		}
		problems = append(problems, fmt.Sprintf("secrets held for it on %s: add --and-what-it-holds --why \"...\" to discard them (export them first with 'mesh-controller secret export')", strings.Join(on, ", ")))
	}
	if err := refuse("module forget "+name, problems); err != nil {
		return f, err
	}
	if _, err := inv.ForgetModule(ctx, name, r.AndWhatItHolds); err != nil {
		return f, err
	}
	for _, hs := range f.Secrets {
		if err := sec.Forget(ctx, hs.Node, name, c.Now()); err != nil {
			return f, err
		}
	}
	if r.AndWhatItHolds {
		// Recorded once done: the log says what was discarded, never a value.
		if err := c.recordHand(ctx, fmt.Sprintf("module forget %s --and-what-it-holds: discarded %s", name, f.Discarded()), r.Why, "forget", ""); err != nil {
			return f, err
		}
	}
	if f.Revoked, err = ids.RevokeModuleUsers(ctx, name, c.Now()); err != nil || f.Revoked == 0 {
		return f, err
	}
	if nc, err := c.dialBroker(ctx, ids); err == nil {
		f.Disconnected = nc.Publish(RevokedSubject, []byte("{}")) == nil && nc.FlushTimeout(protocol.AnswerTimeout) == nil
		nc.Close()
	}
	return f, nil
}

// ErrNotOnNode means a module is not assigned to a node: "module backup
// is not assigned to nas2".
var ErrNotOnNode = errors.New("is not assigned to")

// ModuleIssue makes a broker user for a module on a node, allowed exactly
// its manifest's emits (publish) and consumes (subscribe) under
// mesh.module., and its tools; it returns a .creds document.
func (c *Modules) ModuleIssue(ctx context.Context, module, node string) (string, error) {
	if err := CheckNames(module, node); err != nil {
		return "", err
	}
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return "", err
	}
	if _, ok := snap.Nodes[node]; !ok {
		return "", fmt.Errorf("node %s %w", node, inventory.ErrNodeNotFound)
	}
	if _, ok := snap.Current[module]; !ok {
		return "", fmt.Errorf("module %s %w", module, inventory.ErrModuleNotFound)
	}
	var m *inventory.Manifest
	for _, a := range snap.AssignmentsOf(node) {
		if a.Module == module {
			mm := snap.Manifests[a.Module][a.Version]
			m = &mm
		}
	}
	if m == nil {
		return "", fmt.Errorf("module %s %w %s", module, ErrNotOnNode, node)
	}
	ids := st.Identity
	keys, err := brokerKeys(ctx, ids)
	if err != nil {
		return "", err
	}
	userJWT, seed, err := keys.NewUser("module "+module+" on "+node, modulePermissions(*m, node))
	if err != nil {
		return "", err
	}
	pub, err := broker.PublicOfSeed(seed)
	if err != nil {
		return "", err
	}
	// Kept, so that forgetting the module revokes it.
	if err := ids.RecordIssuedUser(ctx, identity.IssuedUser{Pub: pub, Kind: "module", Node: node, Module: module}, c.Now()); err != nil {
		return "", err
	}
	return broker.Creds(userJWT, seed)
}

// modulePermissions: a module on a node hears its tools' requests to any
// instance (mesh.tool.M.T) and to the one on its node (mesh.tool.M.T.N),
// never another node's; it answers into answerInboxes, never with a
// response permission (see app/broker.go).
func modulePermissions(m inventory.Manifest, node string) broker.Permissions {
	p := broker.Permissions{Publish: []string{answerInboxes},
		Subscribe: []string{protocol.ToolSubject(m.Module, "*"), protocol.ToolSubjectOn(m.Module, "*", node)}, MaxPayload: memberMaxPayload}
	for _, s := range m.Emits {
		p.Publish = append(p.Publish, "mesh.module."+s)
	}
	for _, s := range m.Consumes {
		p.Subscribe = append(p.Subscribe, "mesh.module."+s)
	}
	if canBuild(m) {
		p = mergePermissions(p, builderPermissions(node))
	}
	if slices.ContainsFunc(m.Seats, func(s inventory.Seat) bool { return s.Seat == backupSeat }) {
		p = mergePermissions(p, backupPermissions(node))
	}
	return p
}

// backupSeat is the seat whose holder keeps the mesh's backups.
const backupSeat = "backup"

// backupPermissions are the backup seat holder's on node: say a line is
// due, hand over a node's sealed access and report a drill, each on its
// node's own subject (the broker says which holder sent it), the answers
// in its own inbox beneath its node's.
func backupPermissions(node string) broker.Permissions {
	return broker.Permissions{
		Publish:   []string{protocol.BackupDueSubject(node), protocol.BackupAccessSubject(node), protocol.DrillSubject(node)},
		Subscribe: []string{protocol.BackupInboxPrefix(node) + ".>"},
	}
}

// canBuild says a manifest can fill the build seat: its module's user is a
// builder's, scoped to build work.
func canBuild(m inventory.Manifest) bool {
	return slices.ContainsFunc(m.Seats, func(s inventory.Seat) bool { return s.Seat == buildSeat })
}

// builderPermissions are a builder's on node: take the asks addressed to
// its node and be told to kill one, report lines and outcomes and hand the
// controller archives, each on its node's own subject, so that the broker,
// not the builder, says which builder sent it (the outcome and each
// archive piece are requests: their answers come to the builder's own
// inbox, beneath its node's). No JetStream subject: app/broker.go.
func builderPermissions(node string) broker.Permissions {
	return broker.Permissions{
		Publish:   []string{protocol.BuildProgressSubject(node), protocol.BuildResultSubject(node), protocol.ArchiveUploadSubject(node)},
		Subscribe: []string{protocol.BuildAskSubject(node), protocol.BuildKillSubject(node), builder.BuilderInbox(node) + ".>"},
	}
}

// SettingsRequest sets or clears one settings layer.
type SettingsRequest struct {
	Module string
	// Node is "" for the mesh layer.
	Node string
	// Body is the layer (a JSON object), for set.
	Body []byte
	From string
}

// SettingsChanged is what settings set or clear did.
type SettingsChanged struct {
	Layer   string
	Cleared bool
	// Idle says the node does not run the module: the layer waits for it.
	Idle   bool
	Pushed []Pushed
}

// SettingsSet keeps a settings layer after judging it, and every result it
// makes, against the manifest's schema; then sends the affected nodes.
func (c *Modules) SettingsSet(ctx context.Context, r SettingsRequest) (SettingsChanged, error) {
	return c.changeSettings(ctx, r, false)
}

// SettingsClear takes a settings layer away and sends the affected nodes.
func (c *Modules) SettingsClear(ctx context.Context, r SettingsRequest) (SettingsChanged, error) {
	return c.changeSettings(ctx, r, true)
}

func (c uses) changeSettings(ctx context.Context, r SettingsRequest, clear bool) (SettingsChanged, error) {
	for _, n := range []string{r.Module, r.Node} {
		if n != "" {
			if err := CheckName(n); err != nil {
				return SettingsChanged{}, err
			}
		}
	}
	layer := "mesh layer"
	if r.Node != "" {
		layer = r.Node + "'s layer"
	}
	var body json.RawMessage
	if !clear {
		var obj map[string]any
		if err := json.Unmarshal(r.Body, &obj); err != nil || obj == nil {
			return SettingsChanged{}, fmt.Errorf("%s: %w", r.From, ErrSettingsNotObject)
		}
		body = json.RawMessage(r.Body)
	}
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return SettingsChanged{}, err
	}
	inv := st.Inventory
	cur, ok := snap.Current[r.Module]
	if !ok {
		return SettingsChanged{}, fmt.Errorf("module %s %w", r.Module, inventory.ErrModuleNotFound)
	}
	if r.Node != "" {
		if _, ok := snap.Nodes[r.Node]; !ok {
			return SettingsChanged{}, fmt.Errorf("node %s %w", r.Node, inventory.ErrNodeNotFound)
		}
	}
	affected := []string{}
	for _, a := range snap.Assignments {
		if a.Module == r.Module && (r.Node == "" || r.Node == a.Node) {
			affected = append(affected, a.Node)
		}
	}
	out := SettingsChanged{Layer: layer, Idle: r.Node != "" && len(affected) == 0}
	if clear {
		cleared, err := inv.ClearSettings(ctx, r.Module, r.Node, affected)
		if err != nil {
			return out, err
		}
		if !cleared {
			return out, fmt.Errorf("%s has no %s: %w", r.Module, layer, ErrNoSuchLayer)
		}
		out.Cleared = true
	} else {
		// Judge the layer alone, then every result it makes.
		m := snap.Manifests[r.Module][cur]
		var problems []string
		ps, err := m.ValidateSettings(body)
		if err != nil {
			return out, err
		}
		for _, p := range ps {
			problems = append(problems, fmt.Sprintf("%s: %s: %s", r.From, p.Field, p.What))
		}
		layers := map[string]json.RawMessage{}
		for k, v := range snap.Settings[r.Module] {
			layers[k] = v
		}
		layers[r.Node] = body
		if len(problems) == 0 {
			// Each version's schema compiled once, and the result of the
			// nodes with no layer of their own judged once: on every node
			// of a large mesh it is one result.
			type judged struct {
				judge func(node string) []string
				// shared are the problems of a node with no layer of its own.
				shared []string
				done   bool
			}
			byVersion := map[string]*judged{}
			for _, a := range snap.Assignments {
				if a.Module != r.Module || (r.Node != "" && r.Node != a.Node) {
					continue
				}
				j := byVersion[a.Version]
				if j == nil {
					man := snap.Manifests[a.Module][a.Version]
					sch, err := man.SettingsSchema()
					if err != nil {
						return out, err
					}
					j = &judged{judge: func(node string) []string {
						_, ps := plan.EffectiveSettings(man, sch, layers, node)
						return ps
					}}
					byVersion[a.Version] = j
				}
				var ps []string
				if _, own := layers[a.Node]; own || !j.done {
					ps = j.judge(a.Node)
					if !own {
						j.shared, j.done = ps, true
					}
				} else {
					ps = j.shared
				}
				for _, p := range ps {
					problems = append(problems, fmt.Sprintf("the result on %s:%s", a.Node, p))
				}
			}
		}
		if err := refuse(fmt.Sprintf("settings set %s (%s)", r.Module, layer), problems); err != nil {
			return out, err
		}
		if err := inv.SetSettings(ctx, inventory.SettingsLayer{Module: r.Module, Node: r.Node, Body: body, SetAt: c.Now()}, affected); err != nil {
			return out, err
		}
	}
	out.Pushed, err = c.sendPlans(ctx, st, affected)
	return out, err
}

var (
	// ErrSettingsNotObject means a settings file is not one JSON object.
	ErrSettingsNotObject = errors.New("settings are not one JSON object")
	// ErrNoSuchLayer means there is no settings layer to clear.
	ErrNoSuchLayer = errors.New("nothing to clear")
)
