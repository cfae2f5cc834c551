package main

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"mesh-controller/app"
	"mesh-controller/cmd/clirun"
	"mesh-controller/contexts/health"
	"mesh-controller/contexts/inventory"
)

// ModuleCmd groups module commands.
type ModuleCmd struct {
	Check  ModuleCheckCmd  `cmd:"" help:"Judge manifests where they are written, with no mesh and no store."`
	Add    ModuleAddCmd    `cmd:"" help:"Register a module version from its manifest; a newer version becomes current."`
	List   ModuleListCmd   `cmd:"" help:"Every module: current version, source, behind its source or not, where it runs."`
	Moved  ModuleMovedCmd  `cmd:"" help:"Record that a module's source has a commit newer than the mesh built."`
	Forget ModuleForgetCmd `cmd:"" help:"Remove a module; refused while a node runs it or the mesh holds settings or secrets for it (--and-what-it-holds --why discards those)."`
	Issue  ModuleIssueCmd  `cmd:"" help:"A broker user for a module on a node, allowed exactly its emits and consumes; prints a .creds document."`
}

// ModuleCheckCmd is module check.
type ModuleCheckCmd struct {
	Paths []InputPath `arg:"" name:"file|dir" help:"Manifest files, or directories searched for mesh.json."`
	JSON  bool        `name:"json" help:"Print the judgement as one JSON object: ok, the manifests judged, every problem (file, field, what)."`
}

// Run prints every problem as file: field: what is wrong.
func (c *ModuleCheckCmd) Run(env *Env) error {
	paths := make([]string, len(c.Paths))
	for i, p := range c.Paths {
		paths[i] = string(p)
	}
	files, problems, err := app.ModuleCheck(paths)
	if err != nil {
		return err
	}
	if c.JSON {
		if err := printJSON(env.Stdout, app.ManifestsJudged{OK: len(problems) == 0, Manifests: files,
			Problems: append([]app.ManifestProblem{}, problems...)}); err != nil {
			return err
		}
	} else {
		for _, p := range problems {
			fmt.Fprintln(env.Stdout, p.String())
		}
	}
	if len(problems) > 0 {
		them := "them"
		if len(problems) == 1 {
			them = "it"
		}
		return fmt.Errorf("%s in %s, fix %s and check again", app.Plural(len(problems), "problem"), app.Plural(len(files), "manifest"), them)
	}
	fmt.Fprintf(env.Stderr, "%s, no problems\n", app.Plural(len(files), "manifest"))
	return nil
}

// ModuleAddCmd is module add.
type ModuleAddCmd struct {
	File   InputFile `arg:"" help:"The manifest."`
	Source string    `placeholder:"REPO" help:"Where the module's source is, if not the manifest's source."`
}

// Run registers the version.
func (c *ModuleAddCmd) Run(env *Env, md *app.Modules) error {
	a, err := md.ModuleAdd(env.Ctx, string(c.File), c.Source)
	if err != nil {
		return err
	}
	switch {
	case !a.Added.New:
		fmt.Fprintf(env.Stdout, "%s %s was registered already; nothing changed\n", a.Module, a.Version)
	case a.Added.Current && a.Added.Previous == "":
		fmt.Fprintf(env.Stdout, "%s %s registered\n", a.Module, a.Version)
		fmt.Fprintf(env.Stderr, "next: put it on a node with 'mesh-controller assign NODE %s'\n", a.Module)
	case a.Added.Current:
		fmt.Fprintf(env.Stdout, "%s %s registered and current (was %s)\n", a.Module, a.Version, a.Added.Previous)
	default:
		fmt.Fprintf(env.Stdout, "%s %s registered; %s stays current\n", a.Module, a.Version, a.Current)
	}
	if len(a.Behind) > 0 {
		verb := "run"
		if len(a.Behind) == 1 {
			verb = "runs"
		}
		fmt.Fprintf(env.Stderr, "%s %s an older version: see 'mesh-controller upgrade %s'\n", strings.Join(a.Behind, ", "), verb, a.Module)
	}
	return nil
}

// ModuleListCmd is module list.
type ModuleListCmd struct {
	JSON bool `name:"json" help:"Print one JSON array."`
}

// Run lists modules.
func (c *ModuleListCmd) Run(env *Env, md *app.Modules) error {
	mods, err := md.ModuleList(env.Ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, mods)
	}
	if len(mods) == 0 {
		fmt.Fprintln(env.Stderr, "no modules yet; register one with 'mesh-controller module add FILE'")
		return nil
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tVERSION\tSOURCE\tCOMMIT\tBEHIND SOURCE\tNODES")
	for _, m := range mods {
		behind := "no"
		if m.BehindSource {
			behind = "yes (" + m.MovedCommit + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", m.Name, m.Version, dash(m.Source), dash(m.Commit), behind, dash(strings.Join(m.Nodes, ",")))
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// ModuleMovedCmd is module moved.
type ModuleMovedCmd struct {
	Name   Name   `arg:"" predictor:"module" help:"The module."`
	Commit string `arg:"" help:"The source's newer commit."`
}

// Run records it.
func (c *ModuleMovedCmd) Run(env *Env, md *app.Modules) error {
	if err := md.ModuleMoved(env.Ctx, string(c.Name), c.Commit); err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "%s: its source moved to %s; it is behind its source until that commit is built and registered\n", c.Name, c.Commit)
	return nil
}

// ModuleForgetCmd is module forget.
type ModuleForgetCmd struct {
	Name           Name   `arg:"" predictor:"module" help:"The module."`
	AndWhatItHolds bool   `name:"and-what-it-holds" help:"Also discard the settings and secrets the mesh holds for it (a hand act: --why)."`
	Why            string `help:"With --and-what-it-holds: why; recorded in the hand-act log with what was discarded."`
}

// Run forgets it, and says what was discarded with it: names, never values.
func (c *ModuleForgetCmd) Run(env *Env, md *app.Modules) error {
	f, err := md.ModuleForget(env.Ctx, app.ForgetRequest{Name: string(c.Name), AndWhatItHolds: c.AndWhatItHolds, Why: c.Why})
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "module %s forgotten\n", c.Name)
	if len(f.Settings) > 0 {
		fmt.Fprintf(env.Stdout, "discarded %s: %s\n", app.Plural(len(f.Settings), "settings layer"), strings.Join(f.Settings, ", "))
	}
	for _, h := range f.Secrets {
		fmt.Fprintf(env.Stdout, "discarded %s on %s: %s\n", app.Plural(len(h.Names), "secret"), h.Node, strings.Join(h.Names, ", "))
	}
	if c.AndWhatItHolds {
		fmt.Fprintf(env.Stderr, "recorded in the hand-act log: discarded %s\n", f.Discarded())
	}
	switch {
	case f.Revoked > 0 && f.Disconnected:
		fmt.Fprintf(env.Stdout, "%s issued for it revoked; their connections are closed\n", app.Plural(f.Revoked, "broker user"))
	case f.Revoked > 0:
		fmt.Fprintf(env.Stdout, "%s issued for it revoked; the broker refuses them from when 'mesh-controller serve' runs\n", app.Plural(f.Revoked, "broker user"))
	}
	return nil
}

// ModuleIssueCmd is module issue.
type ModuleIssueCmd struct {
	Name Name `arg:"" predictor:"module" help:"The module."`
	Node Name `predictor:"node" required:"" help:"The node it runs on."`
}

// Run prints the .creds document.
func (c *ModuleIssueCmd) Run(env *Env, md *app.Modules) error {
	creds, err := md.ModuleIssue(env.Ctx, string(c.Name), string(c.Node))
	if err != nil {
		return err
	}
	fmt.Fprint(env.Stdout, creds)
	fmt.Fprintf(env.Stderr, "a broker user for %s on %s: it holds a private key, keep it as a secret (0600)\n", c.Name, c.Node)
	return nil
}

// SettingsCmd groups settings commands.
type SettingsCmd struct {
	Set   SettingsSetCmd   `cmd:"" help:"A module's settings for the whole mesh, or one node's layer; checked against its schema."`
	Clear SettingsClearCmd `cmd:"" help:"Take that layer away."`
}

// SettingsSetCmd is settings set.
type SettingsSetCmd struct {
	Module Name      `arg:"" predictor:"module" help:"The module."`
	File   InputFile `arg:"" help:"A JSON object."`
	Node   Name      `predictor:"node" help:"Set this node's layer rather than the mesh's."`
}

// Run sets the layer.
func (c *SettingsSetCmd) Run(env *Env, md *app.Modules) error {
	body, err := app.ReadInput(string(c.File), app.MaxSettingsBytes, "a settings layer")
	if err != nil {
		return err
	}
	r, err := md.SettingsSet(env.Ctx, app.SettingsRequest{Module: string(c.Module), Node: string(c.Node), Body: body, From: string(c.File)})
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "settings of %s: %s set\n", c.Module, r.Layer)
	if r.Idle {
		fmt.Fprintf(env.Stderr, "%s does not run %s: the layer applies when it does\n", c.Node, c.Module)
	}
	printPushed(env, r.Pushed)
	return nil
}

// SettingsClearCmd is settings clear.
type SettingsClearCmd struct {
	Module Name `arg:"" predictor:"module" help:"The module."`
	Node   Name `predictor:"node" help:"Clear this node's layer rather than the mesh's."`
}

// Run clears the layer.
func (c *SettingsClearCmd) Run(env *Env, md *app.Modules) error {
	r, err := md.SettingsClear(env.Ctx, app.SettingsRequest{Module: string(c.Module), Node: string(c.Node)})
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "settings of %s: %s cleared\n", c.Module, r.Layer)
	printPushed(env, r.Pushed)
	return nil
}

// manyLines is how many nodes an act's output lists a line each; beyond
// it, the act is summed up (a line per node of thousands says nothing).
const manyLines = 20

// printPushed says, per node, whether its new declaration was sent.
func printPushed(env *Env, pushed []app.Pushed) {
	var later, unjoined []string
	sent, kept := 0, 0
	many := len(pushed) > manyLines
	for _, p := range pushed {
		switch {
		case p.Problem != "":
			fmt.Fprintf(env.Stderr, "%s: not declared: %s\n", p.Node, p.Problem)
		case p.NotJoined:
			// Sent or kept, it reaches no host before one joins.
			kept++
			if !many {
				fmt.Fprintf(env.Stdout, "%s: declaration %d kept: delivered when its host joins\n", p.Node, p.Serial)
			}
			unjoined = append(unjoined, p.Node)
			if !p.Sent {
				later = append(later, p.Node)
			}
		case p.Sent:
			sent++
			if !many {
				fmt.Fprintf(env.Stdout, "%s: declaration %d sent\n", p.Node, p.Serial)
			}
		default:
			kept++
			if !many {
				fmt.Fprintf(env.Stdout, "%s: declaration %d kept, not sent\n", p.Node, p.Serial)
			}
			later = append(later, p.Node)
		}
	}
	if many {
		fmt.Fprintf(env.Stdout, "declarations: %d sent, %d kept and not sent\n", sent, kept)
	}
	if len(later) > 0 {
		who := strings.Join(later, ", ")
		if len(later) > manyLines {
			who = app.Plural(len(later), "node")
		}
		fmt.Fprintf(env.Stderr, "%s will be sent theirs when 'mesh-controller serve' runs (%s)\n", who, pushedWhy(pushed))
	}
	switch {
	case len(unjoined) == 1:
		fmt.Fprintf(env.Stderr, "%s has not joined yet: its declaration waits for its host; give it a join token with 'mesh-controller token issue --node %s'\n", unjoined[0], unjoined[0])
	case len(unjoined) > 1:
		who := strings.Join(unjoined, ", ")
		if len(unjoined) > manyLines {
			who = app.Plural(len(unjoined), "node")
		}
		fmt.Fprintf(env.Stderr, "%s have not joined yet: their declarations wait for their hosts; give each a join token with 'mesh-controller token issue --node NAME'\n", who)
	}
}

func pushedWhy(pushed []app.Pushed) string {
	for _, p := range pushed {
		if p.NotSent != "" {
			return p.NotSent
		}
	}
	return ""
}

// AssignCmd is assign.
type AssignCmd struct {
	Node    Name   `arg:"" predictor:"node" optional:"" help:"The node (or, with --nodes, the first module)."`
	Modules []Name `arg:"" predictor:"module" optional:"" name:"module" help:"Modules to put on it, judged together."`
	Nodes   string `placeholder:"FILE|-" help:"Put the modules on every node named in FILE (- for stdin), one a line, judged together: all or nothing."`
}

// Run assigns.
func (c *AssignCmd) Run(env *Env, md *app.Modules) error {
	nodes, modules, err := manyArgs(c.Node, c.Modules, c.Nodes)
	if err != nil {
		return err
	}
	p := newProgress(env, "assign")
	r, err := md.AssignMany(env.Ctx, app.ManyRequest{Nodes: nodes, Modules: modules, Progress: p.tell})
	p.done()
	if err != nil {
		return err
	}
	if len(r.Nodes) > manyLines {
		fmt.Fprintf(env.Stdout, "%s assigned to %d nodes\n", strings.Join(modules, " "), len(r.Nodes))
	}
	for _, a := range r.Nodes {
		for _, m := range a.Modules {
			if len(r.Nodes) <= 20 {
				fmt.Fprintf(env.Stdout, "%s %s assigned to %s\n", m.Module, m.Version, a.Node)
			}
			if len(m.Unverified) > 0 {
				fmt.Fprintf(env.Stderr, "%s: not verified yet (%s has not reported those facts): %s\n", m.Module, a.Node, strings.Join(m.Unverified, ", "))
			}
			for _, l := range m.LicencesNotHeld {
				fmt.Fprintf(env.Stderr, "%s: needs licence %s, not held yet: it waits until 'mesh-controller licence use %s %s/%s --key OPERATOR-KEY'\n", m.Module, l, l, a.Node, m.Module)
			}
			if len(m.Unmet) > 0 {
				fmt.Fprintf(env.Stderr, "%s: optional %s not provided by anything in the mesh\n", m.Module, strings.Join(m.Unmet, ", "))
			}
		}
	}
	printPushed(env, r.Pushed)
	return nil
}

// manyArgs are the nodes and modules of assign and unassign: NODE MODULE…,
// or --nodes FILE MODULE… (the first argument is then a module).
func manyArgs(first Name, rest []Name, file string) (nodes, modules []string, err error) {
	args := names(rest)
	if first != "" {
		args = append([]string{string(first)}, args...)
	}
	if file != "" {
		if len(args) == 0 {
			return nil, nil, clirun.UsageError{Msg: "give the modules after --nodes FILE"}
		}
		nodes, err := readNodes(file)
		if err != nil {
			return nil, nil, err
		}
		if len(nodes) == 0 {
			return nil, nil, fmt.Errorf("%s names no node: give one node name a line", file)
		}
		return nodes, args, nil
	}
	if len(args) < 2 {
		return nil, nil, clirun.UsageError{Msg: "give a node and its modules, or --nodes FILE and the modules"}
	}
	return args[:1], args[1:], nil
}

func names(ns []Name) []string {
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = string(n)
	}
	return out
}

// UnassignCmd is unassign.
type UnassignCmd struct {
	Node    Name   `arg:"" predictor:"node" optional:"" help:"The node (or, with --nodes, the first module)."`
	Modules []Name `arg:"" predictor:"module" optional:"" name:"module" help:"Modules to take off it."`
	Nodes   string `placeholder:"FILE|-" help:"Take the modules off every node named in FILE (- for stdin), one a line, judged together: all or nothing."`
}

// Run unassigns, and says what happened to each data set.
func (c *UnassignCmd) Run(env *Env, md *app.Modules) error {
	nodes, modules, err := manyArgs(c.Node, c.Modules, c.Nodes)
	if err != nil {
		return err
	}
	p := newProgress(env, "unassign")
	r, err := md.UnassignMany(env.Ctx, app.ManyRequest{Nodes: nodes, Modules: modules, Progress: p.tell})
	p.done()
	if err != nil {
		return err
	}
	for _, u := range r.Nodes {
		printUnassigned(env, u)
	}
	printPushed(env, r.Pushed)
	return nil
}

// printUnassigned says what became of each data set of the modules taken
// off a node: nothing leaves its disk until 'cleanup delete'.
func printUnassigned(env *Env, r app.Unassigned) {
	for _, m := range r.Modules {
		fmt.Fprintf(env.Stdout, "%s taken off %s\n", m, r.Node)
	}
	for _, rt := range r.Retirements {
		where := rt.Node + "/" + rt.Module + " " + rt.DataSet
		if rt.Consumer != "" {
			where = fmt.Sprintf("%s/%s's %s data for %s", rt.Node, rt.Module, rt.DataSet, rt.Consumer)
		} else if rt.Path != "" {
			where += " (" + rt.Path + ")"
		}
		if rt.State == "dropped" {
			fmt.Fprintf(env.Stdout, "  %s: %s, dropped: stays on %s until 'cleanup delete'\n", where, rt.Precious, rt.Node)
		} else {
			fmt.Fprintf(env.Stdout, "  %s: %s, retired and remembered: access off, data kept; deleted only by a person\n", where, rt.Precious)
		}
	}
	for _, w := range r.Waiting {
		fmt.Fprintf(env.Stdout, "  %s keeps %s data for %s: kept, waiting for a person to retire it ('mesh-controller retire')\n", w.Provider, w.Provision, w.Consumer)
	}
	for _, l := range r.Licences {
		fmt.Fprintf(env.Stdout, "  licence %s taken away: its copy on %s is dropped\n", l, r.Node)
	}
	for _, e := range r.Empty {
		fmt.Fprintf(env.Stdout, "  moved: %s (data.empty-replacement is raised until a person records it)\n", e)
	}
}

// PlanCmd is plan.
type PlanCmd struct {
	Node  Name `arg:"" predictor:"node" help:"The node."`
	Files bool `xor:"form" help:"List the files its host would write."`
	JSON  bool `name:"json" xor:"form" help:"Print the declaration body it would be sent, with a reasons map."`
}

// Run shows the plan.
func (c *PlanCmd) Run(env *Env, md *app.Modules) error {
	v, err := md.PlanShow(env.Ctx, string(c.Node))
	if err != nil {
		return err
	}
	switch {
	case c.JSON:
		fmt.Fprintf(env.Stdout, "%s\n", v.JSON)
		return nil
	case c.Files:
		for _, f := range v.Files {
			fmt.Fprintln(env.Stdout, f)
		}
		return nil
	}
	p := v.Plan
	fmt.Fprintf(env.Stdout, "node %s (%s)\n", p.Node, p.Body.Mode)
	if p.Body.PublicDomain != "" {
		fmt.Fprintf(env.Stdout, "  public domain: %s\n", p.Body.PublicDomain)
	}
	if len(p.Body.Networks) > 0 {
		fmt.Fprintf(env.Stdout, "  networks: %s\n", strings.Join(p.Body.Networks, ", "))
	}
	if o := p.Body.Overlay; o != nil {
		fmt.Fprintf(env.Stdout, "  overlay: %s %s, %s, listens on udp %d\n", o.Interface, o.Address4, o.Address6, o.ListenPort)
		for _, pr := range o.Peers {
			fmt.Fprintf(env.Stdout, "    %s\n", peerLine(pr))
		}
	} else {
		fmt.Fprintln(env.Stdout, "  overlay: none yet (its host has reported no WireGuard key)")
	}
	if len(p.Body.Modules) == 0 {
		fmt.Fprintln(env.Stdout, "  runs nothing from the mesh")
	}
	for _, m := range p.Body.Modules {
		fmt.Fprintf(env.Stdout, "\n%s %s\n", m.Module, m.Version)
		for _, r := range p.Reasons[m.Module] {
			fmt.Fprintf(env.Stdout, "  why: %s\n", r)
		}
		fmt.Fprintf(env.Stdout, "  settings: %s\n", m.Settings)
		if m.Run != nil {
			fmt.Fprintf(env.Stdout, "  run: %s\n", strings.Join(m.Run.Command, " "))
		}
		if s, ok := v.States[m.Module]; ok {
			printModuleStates(env.Stdout, []health.ModuleState{s}, "  state: ")
		} else {
			fmt.Fprintf(env.Stdout, "  state: %s (its host has not reported it)\n", app.StateUnreported)
		}
		for _, d := range m.Data {
			fmt.Fprintf(env.Stdout, "  data: %s %s (%s)\n", d.Name, d.Path, d.Precious)
		}
		for _, r := range v.Routed {
			switch {
			case r.Module != m.Module:
			case r.Name != "":
				fmt.Fprintf(env.Stdout, "  public: %s (port %d) routed as %s\n", r.Port, r.Number, r.Name)
			default:
				fmt.Fprintf(env.Stdout, "  public: %s (port %d) not reachable until a domain is set ('mesh-controller node public-domain %s DOMAIN')\n", r.Port, r.Number, p.Node)
			}
		}
	}
	for _, pr := range p.Problems {
		fmt.Fprintf(env.Stderr, "problem: %s\n", pr)
	}
	return nil
}

// PushCmd is push.
type PushCmd struct {
	Node   Name   `arg:"" predictor:"node" optional:"" help:"The node."`
	All    bool   `help:"Every node."`
	Behind bool   `help:"Only nodes whose declaration is behind their plan, or not yet applied (of every node, or of the one named)."`
	Why    string `help:"Record this push as a hand act, with why."`
}

// Run pushes.
func (c *PushCmd) Run(env *Env, md *app.Modules) error {
	switch {
	case c.Node != "" && c.All:
		return clirun.UsageError{Msg: "give a node or --all, not both"}
	case c.Node == "" && !c.All && !c.Behind:
		return clirun.UsageError{Msg: "give a node, --all for every node, or --behind for those behind"}
	}
	p := newProgress(env, "push")
	pushed, err := md.Push(env.Ctx, app.PushRequest{Node: string(c.Node), Behind: c.Behind, Why: c.Why, Progress: p.tell})
	p.done()
	if err != nil {
		return err
	}
	if len(pushed) == 0 {
		fmt.Fprintln(env.Stderr, "no node to push")
	}
	printPushed(env, pushed)
	return nil
}

// UpgradeCmd is upgrade.
type UpgradeCmd struct {
	Module          Name          `arg:"" optional:"" predictor:"module" help:"The module; none: every module's nodes that run an older version, and its last roll-out."`
	Action          string        `arg:"" optional:"" enum:"show,roll-out,rollback,record" default:"show" help:"show (default): what a roll-out would send, and the last roll-out; roll-out: move the nodes, canary first, then batches, each waited for ready and through the soak, all rolled back past --max-failures; rollback: return the nodes the last roll-out moved (--why); record: record those nodes behind, send nothing."`
	Together        bool          `help:"With roll-out: every node at once (the same as --canary 0 --batch 100%)."`
	Canary          int           `default:"1" help:"With roll-out: how many nodes move first, on their own."`
	Batch           string        `default:"1" help:"With roll-out: how many nodes move together after the canary: N nodes or P% of the nodes to move."`
	Wait            time.Duration `default:"2m" help:"With roll-out: how long to wait for each batch to report ready (and a rollback for its nodes to be back)."`
	Soak            time.Duration `default:"10s" help:"With roll-out: how long a batch must stay ready before the next moves."`
	MaxFailures     int           `default:"0" help:"With roll-out: how many nodes may fail before the roll-out stops and every node it moved goes back."`
	WithoutSnapshot bool          `name:"without-snapshot" help:"With roll-out: let its nodes prepare the new version where the module's irreplaceable data cannot be snapshotted first (no backup holder, no access, holder unreachable); needs --why."`
	Why             string        `help:"With rollback, and roll-out --without-snapshot: why (required)."`
	JSON            bool          `name:"json" help:"Print the upgrade (and the last roll-out's state) as JSON."`
	Verbose         bool          `short:"v" help:"With roll-out and rollback: a line a node as it goes, on a terminal too (elsewhere always so), in place of one running line."`
}

// Run previews, rolls out, rolls back or records.
func (c *UpgradeCmd) Run(env *Env, md *app.Modules) error {
	if c.Module == "" {
		return c.showAll(env, md)
	}
	if c.Together && c.Action != "roll-out" {
		return clirun.UsageError{Msg: "--together goes with roll-out"}
	}
	if c.Action == "rollback" && strings.TrimSpace(c.Why) == "" {
		return clirun.UsageError{Msg: "rollback needs --why: say why the nodes go back"}
	}
	if c.WithoutSnapshot && c.Action != "roll-out" {
		return clirun.UsageError{Msg: "--without-snapshot goes with roll-out"}
	}
	r := app.UpgradeRequest{Module: string(c.Module), Action: c.Action, Together: c.Together, Canary: c.Canary, Batch: c.Batch,
		Wait: c.Wait, Soak: c.Soak, MaxFailures: c.MaxFailures, WithoutSnapshot: c.WithoutSnapshot, Why: c.Why}
	end := func() {}
	if !c.JSON {
		r.Progress, r.Tally, end = followRollOut(env, string(c.Module), c.Verbose)
	}
	if c.Action == "roll-out" {
		if err := app.CheckRollOut(r); err != nil {
			return clirun.UsageError{Msg: err.Error()}
		}
	}
	v, err := md.Upgrade(env.Ctx, r)
	end()
	if c.JSON {
		if perr := printJSON(env.Stdout, v); perr != nil {
			return perr
		}
		return err
	}
	if err != nil {
		return err
	}
	if c.Action == "rollback" {
		fmt.Fprintf(env.Stdout, "the roll-out of %s to %s was rolled back\n", v.Module, v.RollOut.To)
		return nil
	}
	if len(v.Steps) == 0 {
		fmt.Fprintf(env.Stdout, "every node runs %s %s; nothing to do\n", v.Module, v.Current)
		if c.Action == "show" && v.RollOut != nil {
			showRollOut(env, v.RollOut)
		}
		return nil
	}
	switch c.Action {
	case "show":
		fmt.Fprintf(env.Stdout, "%s is at %s; these nodes run an older version:\n", v.Module, v.Current)
		for _, s := range v.Steps {
			recorded := ""
			if s.Recorded {
				recorded = " (recorded, not sent)"
			}
			fmt.Fprintf(env.Stdout, "  %s: %s -> %s%s\n", s.Node, s.From, s.To, recorded)
		}
		if v.RollOut != nil {
			showRollOut(env, v.RollOut)
		}
		fmt.Fprintf(env.Stderr, "a roll-out sends them %s %s, a canary node first, then one at a time: 'mesh-controller upgrade %s roll-out'\n", v.Module, v.Current, v.Module)
	case "record":
		for _, s := range v.Steps {
			fmt.Fprintf(env.Stdout, "%s: recorded behind (%s -> %s); nothing sent\n", s.Node, s.From, s.To)
		}
		fmt.Fprintln(env.Stderr, "send them later with 'mesh-controller push --behind'")
	default:
		var failed []string
		for _, s := range v.Steps {
			if s.Error != "" {
				failed = append(failed, s.Node)
			}
		}
		fmt.Fprintf(env.Stdout, "%s %s rolled out to %s of %d\n", v.Module, v.Current, app.Plural(len(v.Steps)-len(failed), "node"), len(v.Steps))
		if len(failed) > 0 {
			fmt.Fprintf(env.Stdout, "failed, within --max-failures (left on %s; 'mesh-controller upgrade %s rollback --why ...' returns every node moved): %s\n",
				v.Current, v.Module, strings.Join(failed, ", "))
		}
	}
	return nil
}

// showAll says, for every module, the nodes that run an older version
// than its current one, and its last roll-out unless it ended well.
func (c *UpgradeCmd) showAll(env *Env, md *app.Modules) error {
	if c.Together || c.WithoutSnapshot || c.Why != "" || c.Verbose {
		return clirun.UsageError{Msg: "with no module, upgrade shows every module's upgrade: roll-out, rollback and record name the module ('mesh-controller upgrade MODULE roll-out')"}
	}
	vs, err := md.UpgradeAll(env.Ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, vs)
	}
	said := false
	for _, v := range vs {
		underWay := v.RollOut != nil && !v.RollOut.Ended()
		if len(v.Steps) == 0 && !underWay {
			continue
		}
		said = true
		if len(v.Steps) > 0 {
			fmt.Fprintf(env.Stdout, "%s is at %s; behind: ", v.Module, v.Current)
			for i, s := range v.Steps {
				if i > 0 {
					fmt.Fprint(env.Stdout, ", ")
				}
				fmt.Fprintf(env.Stdout, "%s (%s)", s.Node, s.From)
			}
			fmt.Fprintln(env.Stdout)
		}
		if underWay {
			fmt.Fprintf(env.Stdout, "%s: a roll-out to %s is under way (%s)\n", v.Module, v.RollOut.To, v.RollOut.Phase)
		}
	}
	if !said {
		fmt.Fprintln(env.Stdout, "every node runs the current version of its modules; nothing to do")
		return nil
	}
	fmt.Fprintln(env.Stderr, "'mesh-controller upgrade MODULE' shows one module's, and its last roll-out node by node")
	return nil
}

// showRollOut says the module's last roll-out, node by node.
func showRollOut(env *Env, r *inventory.RollOut) {
	without := ""
	if r.WithoutSnapshot {
		without = ", allowed without a snapshot"
	}
	fmt.Fprintf(env.Stdout, "last roll-out: to %s, %s (started %s by %s%s)\n", r.To, r.Phase, r.StartedAt.Format(time.RFC3339), r.Who, without)
	if r.Why != "" {
		fmt.Fprintf(env.Stdout, "  why: %s\n", r.Why)
	}
	for _, n := range r.Nodes {
		line := fmt.Sprintf("  %s (batch %d, from %s): %s", n.Node, n.Batch, n.From, n.Result)
		if n.Error != "" {
			line += ": " + n.Error
		}
		if n.Prepared != "" {
			line += " (" + n.Prepared + ")"
		}
		if n.Back != "" {
			line += "; back: " + n.Back
			if n.BackError != "" {
				line += ": " + n.BackError
			}
		}
		if n.Detail != "" {
			line += " (" + n.Detail + ")"
		}
		fmt.Fprintln(env.Stdout, line)
	}
}
