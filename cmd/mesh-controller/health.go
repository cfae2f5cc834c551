package main

import (
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"mesh-controller/app"
	"mesh-controller/contexts/health"
)

// StatusCmd is status.
type StatusCmd struct {
	JSON bool `name:"json" help:"Print {\"wrong\", \"quiet\", \"out_of_date\"}."`
}

// Run answers three questions; it exits 0 whatever it finds.
func (c *StatusCmd) Run(env *Env, hl *app.Health) error {
	v, err := hl.Status(env.Ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, v)
	}
	w := env.Stdout
	fmt.Fprintf(w, "What is wrong (%d):\n", len(v.Wrong)+len(v.NotReady))
	for _, cd := range v.Wrong {
		fmt.Fprintf(w, "  %-7s %s: %s%s\n", cd.Severity, cd.Key, cd.Summary, silenced(cd))
	}
	for _, m := range v.NotReady {
		fmt.Fprintf(w, "  %-7s %s/%s: %s\n", "module", m.Node, m.Module, notReadyLine(m))
	}
	fmt.Fprintf(w, "What is quiet (%d):\n", len(v.Quiet))
	for _, s := range v.Quiet {
		fmt.Fprintf(w, "  %s: %s (bound %s)\n", s.Name, age(s), time.Duration(s.BoundS*float64(time.Second)))
	}
	fmt.Fprintf(w, "What is out of date (%d):\n", len(v.OutOfDate))
	for _, o := range v.OutOfDate {
		fmt.Fprintf(w, "  %s %s: %s\n", o.Kind, o.Name, o.Why)
	}
	if v.Checked == nil {
		fmt.Fprintln(env.Stderr, "the self-check has not run yet: 'mesh-controller doctor run' (serve runs it every 30 s)")
	} else {
		fmt.Fprintf(env.Stderr, "conditions as the self-check found them at %s\n", v.Checked.Format(timeShown))
	}
	return nil
}

func silenced(cd health.Condition) string {
	if cd.SilencedUntil != nil && cd.SilencedUntil.After(time.Now()) {
		return " (silenced until " + cd.SilencedUntil.Format(timeShown) + ")"
	}
	return ""
}

func age(s app.Signal) string {
	if s.Last == nil {
		return "never heard"
	}
	return "last heard " + time.Duration(s.AgeS*float64(time.Second)).Round(time.Second).String() + " ago"
}

// ConditionsCmd groups conditions commands; alone it lists them.
type ConditionsCmd struct {
	List    ConditionsListCmd    `cmd:"" default:"withargs" help:"Every open condition, urgent first."`
	Show    ConditionsShowCmd    `cmd:"" help:"One condition whole, with its evidence and history."`
	Silence ConditionsSilenceCmd `cmd:"" help:"Send no message for it a while; a hand act."`
	History ConditionsHistoryCmd `cmd:"" help:"Every raising, change and clearing lately."`
}

// ConditionsListCmd is conditions.
type ConditionsListCmd struct {
	Scope    string `enum:",mesh,machine,module" default:"" help:"Only this scope: mesh, machine or module."`
	Severity string `enum:",urgent,warning,notice" default:"" help:"Only this severity."`
	Machine  string `help:"Only conditions of this machine."`
	JSON     bool   `name:"json" help:"Print one JSON array."`
}

// Run lists conditions.
func (c *ConditionsListCmd) Run(env *Env, hl *app.Health) error {
	cs, err := hl.Conditions(env.Ctx, app.ConditionFilter{Scope: c.Scope, Severity: c.Severity, Machine: c.Machine})
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, cs)
	}
	if len(cs) == 0 {
		fmt.Fprintln(env.Stderr, "no open conditions")
		return nil
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SEVERITY\tKEY\tSINCE\tSUMMARY")
	for _, cd := range cs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s%s\n", cd.Severity, cd.Key, cd.RaisedAt.Format(timeShown), cd.Summary, silenced(cd))
	}
	return tw.Flush()
}

// ConditionsShowCmd is conditions show.
type ConditionsShowCmd struct {
	Key  string `arg:"" help:"The condition's key."`
	JSON bool   `name:"json" help:"Print one JSON object."`
}

// Run shows one condition.
func (c *ConditionsShowCmd) Run(env *Env, hl *app.Health) error {
	d, err := hl.ConditionShow(env.Ctx, c.Key)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, d)
	}
	w := env.Stdout
	fmt.Fprintf(w, "key       %s\nkind      %s\nseverity  %s\nscope     %s %s%s\nsummary   %s\nraised    %s\nchanged   %s\n",
		d.Key, d.Kind, d.Severity, d.Scope, d.Machine, prefixed("/", d.Module), d.Summary, d.RaisedAt.Format(timeShown), d.ChangedAt.Format(timeShown))
	if d.SilencedUntil != nil {
		fmt.Fprintf(w, "silenced  until %s: %s\n", d.SilencedUntil.Format(timeShown), d.SilenceWhy)
	}
	fmt.Fprintln(w, "evidence:")
	for _, k := range sortedKeys(d.Evidence) {
		fmt.Fprintf(w, "  %s: %v\n", k, d.Evidence[k])
	}
	fmt.Fprintln(w, "history:")
	for _, h := range d.History {
		fmt.Fprintf(w, "  %s %-8s %s\n", h.At.Format(timeShown), h.Event, h.Condition.Summary)
	}
	return nil
}

func prefixed(p, s string) string {
	if s == "" {
		return ""
	}
	return p + s
}

// ConditionsSilenceCmd is conditions silence.
type ConditionsSilenceCmd struct {
	Key string        `arg:"" help:"The condition's key."`
	For time.Duration `required:"" help:"How long to send no message for it."`
	Why string        `required:"" help:"Why; recorded in the hand-act log."`
}

// Run silences.
func (c *ConditionsSilenceCmd) Run(env *Env, hl *app.Health) error {
	cd, err := hl.ConditionSilence(env.Ctx, c.Key, c.For, c.Why)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "%s silenced until %s; it stays listed\n", cd.Key, cd.SilencedUntil.Format(timeShown))
	return nil
}

// ConditionsHistoryCmd is conditions history.
type ConditionsHistoryCmd struct {
	Days int    `default:"7" help:"How many days back."`
	Key  string `help:"Only this condition."`
	JSON bool   `name:"json" help:"Print one JSON array."`
}

// Run lists the history.
func (c *ConditionsHistoryCmd) Run(env *Env, hl *app.Health) error {
	h, err := hl.ConditionsHistory(env.Ctx, c.Days, c.Key)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, h)
	}
	for _, ch := range h {
		fmt.Fprintf(env.Stdout, "%s %-8s %-7s %s: %s\n", ch.At.Format(timeShown), ch.Event, ch.Condition.Severity, ch.Condition.Key, ch.Condition.Summary)
	}
	return nil
}

// DoctorCmd groups doctor commands; alone it prints the last verdict.
type DoctorCmd struct {
	Last    DoctorLastCmd    `cmd:"" default:"withargs" hidden:"" help:"The self-check's last verdict."`
	Run     DoctorRunCmd     `cmd:"" help:"Run the self-check now: every probe, every rule; raise and clear conditions."`
	Probes  DoctorProbesCmd  `cmd:"" help:"Each probe of the last run, and its result."`
	Signals DoctorSignalsCmd `cmd:"" help:"Each signal's age against its bound."`
}

// DoctorLastCmd is doctor.
type DoctorLastCmd struct {
	JSON bool `name:"json" help:"Print one JSON object."`
}

// Run prints the last verdict.
func (c *DoctorLastCmd) Run(env *Env, hl *app.Health) error {
	v, err := hl.DoctorLast(env.Ctx)
	if err != nil {
		return err
	}
	return printVerdict(env, v, c.JSON, hl)
}

func printVerdict(env *Env, v health.Verdict, asJSON bool, hl *app.Health) error {
	if asJSON {
		return printJSON(env.Stdout, v)
	}
	state := "every probe passed"
	if !v.OK {
		state = "a probe failed"
	}
	fmt.Fprintf(env.Stdout, "self-check at %s: %s; %s (%d raised, %d changed, %d cleared) in %.1f ms\n",
		v.At.Format(timeShown), state, app.Plural(v.Open, "open condition"), v.Raised, v.Changed, v.Cleared, v.TookMS)
	// Which controller serves is said as it is now, not as at the check.
	if cv, err := hl.Controllers(env.Ctx); err == nil {
		fmt.Fprintf(env.Stdout, "  now: %s\n", cv)
	}
	for _, p := range v.Probes {
		mark := "ok  "
		if !p.OK {
			mark = "FAIL"
		}
		fmt.Fprintf(env.Stdout, "  %s %s: %s\n", mark, p.Name, p.Detail)
	}
	return nil
}

// DoctorRunCmd is doctor run.
type DoctorRunCmd struct {
	JSON bool `name:"json" help:"Print the verdict and what changed as one JSON object."`
}

// Run runs the self-check.
func (c *DoctorRunCmd) Run(env *Env, hl *app.Health) error {
	r, err := hl.SelfCheck(env.Ctx, app.CheckOptions{Log: func(line string) { fmt.Fprintln(env.Stderr, line) }})
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, r)
	}
	return printVerdict(env, r.Verdict, false, hl)
}

// DoctorProbesCmd is doctor probes.
type DoctorProbesCmd struct {
	JSON bool `name:"json" help:"Print one JSON array."`
}

// Run lists the last run's probes.
func (c *DoctorProbesCmd) Run(env *Env, hl *app.Health) error {
	v, err := hl.DoctorLast(env.Ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, v.Probes)
	}
	for _, p := range v.Probes {
		fmt.Fprintf(env.Stdout, "%-14s %-4v %s\n", p.Name, p.OK, p.Detail)
	}
	return nil
}

// DoctorSignalsCmd is doctor signals.
type DoctorSignalsCmd struct {
	JSON bool `name:"json" help:"Print one JSON array."`
}

// Run lists signals.
func (c *DoctorSignalsCmd) Run(env *Env, hl *app.Health) error {
	sigs, err := hl.DoctorSignals(env.Ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, sigs)
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SIGNAL\tLAST\tBOUND\tQUIET")
	for _, s := range sigs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", s.Name, age(s), time.Duration(s.BoundS*float64(time.Second)), yesNo(s.Quiet))
	}
	return tw.Flush()
}

// HandActsCmd groups the hand-act commands; alone it lists them.
type HandActsCmd struct {
	List   HandActsListCmd  `cmd:"" default:"withargs" hidden:"" help:"What was done by hand lately, and which causes repeat."`
	Record HandActRecordCmd `cmd:"" help:"Record an act done by hand outside the mesh."`
}

// HandActCmd is hand-act, the former group of hand-acts record.
type HandActCmd struct {
	Record HandActRecordCmd `cmd:"" help:"The former spelling of hand-acts record."`
}

// HandActRecordCmd is hand-acts record.
type HandActRecordCmd struct {
	What      string `arg:"" help:"What was done."`
	Why       string `required:"" help:"Why it was done."`
	Cause     string `required:"" help:"One word naming the cause, so that repeating causes show."`
	Condition string `help:"The condition it answers."`
}

// Run records it.
func (c *HandActRecordCmd) Run(env *Env, hl *app.Health) error {
	a, err := hl.HandActRecord(env.Ctx, c.What, c.Why, c.Cause, c.Condition)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "hand act %d recorded: %s (cause %s)\n", a.ID, shown(a.What), shown(a.Cause))
	return nil
}

// HandActsListCmd is hand-acts.
type HandActsListCmd struct {
	Days int  `default:"30" help:"How many days back."`
	JSON bool `name:"json" help:"Print one JSON object."`
}

// Run lists hand acts and the causes that repeat.
func (c *HandActsListCmd) Run(env *Env, hl *app.Health) error {
	v, err := hl.HandActs(env.Ctx, c.Days)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, v)
	}
	for _, a := range v.Acts {
		fmt.Fprintf(env.Stdout, "%s %s (%s) by %s: %s\n", a.At.Format(timeShown), shown(a.What), shown(a.Cause), shown(a.Who), shown(a.Why))
	}
	var repeats []string
	for _, cc := range v.Causes {
		if cc.Count > 1 {
			repeats = append(repeats, fmt.Sprintf("%s %d times", cc.Cause, cc.Count))
		}
	}
	if len(repeats) > 0 {
		fmt.Fprintf(env.Stdout, "causes that repeat: %s\n", strings.Join(repeats, ", "))
	}
	return nil
}

// DurationsCmd is durations.
type DurationsCmd struct {
	Kind string `enum:",apply,heartbeat,tier,build,start,declare" default:"" help:"Only this kind: apply, heartbeat, tier, build, start (a module declared → ready, per node/module) or declare (the parts of a declare to 100 nodes or more: plan, sign, store, send)."`
	Days int    `default:"7" help:"How many days back."`
	JSON bool   `name:"json" help:"Print one JSON array."`
}

// Run prints count, p50, p90, p99, max per machine or module.
func (c *DurationsCmd) Run(env *Env, hl *app.Health) error {
	ds, err := hl.Durations(env.Ctx, c.Kind, c.Days)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, ds)
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "KIND\tSUBJECT\tNAME\tCOUNT\tP50 MS\tP90 MS\tP99 MS\tMAX MS\t")
	for _, d := range ds {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t\n", d.Kind, d.Subject, dash(d.Name), d.Count, d.P50, d.P90, d.P99, d.Max)
	}
	return tw.Flush()
}

// HealersCmd groups healers commands; alone it lists them.
type HealersCmd struct {
	List    HealersListCmd    `cmd:"" default:"withargs" hidden:"" help:"The healers, what they did lately, and the brake."`
	Release HealersReleaseCmd `cmd:"" help:"Release an engaged brake; a hand act."`
}

// HealersListCmd is healers.
type HealersListCmd struct {
	Days int  `default:"7" help:"How many days back."`
	JSON bool `name:"json" help:"Print one JSON object."`
}

// Run lists healers, their acts and the brake.
func (c *HealersListCmd) Run(env *Env, hl *app.Health) error {
	v, err := hl.Healers(env.Ctx, c.Days)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, v)
	}
	for _, h := range v.Healers {
		on := "on " + h.Kind
		if h.Kind == "" {
			on = "on a clock" // a timed healer: no condition makes its acts due
		}
		fmt.Fprintf(env.Stdout, "%s (%s): %s\n", h.Name, on, h.What)
	}
	if v.Brake.Engaged {
		fmt.Fprintf(env.Stdout, "brake: ENGAGED since %s: %s\n", v.Brake.EngagedAt.Format(timeShown), v.Brake.Why)
	} else {
		fmt.Fprintln(env.Stdout, "brake: released")
	}
	for _, a := range v.Acts {
		fmt.Fprintf(env.Stdout, "  %s %s on %s (%s): %s\n", a.At.Format(timeShown), a.Healer, a.Subject, a.Detail, a.Outcome)
	}
	return nil
}

// HealersReleaseCmd is healers release.
type HealersReleaseCmd struct {
	Why string `required:"" help:"Why the healers may act again; recorded in the hand-act log."`
}

// Run releases the brake.
func (c *HealersReleaseCmd) Run(env *Env, hl *app.Health) error {
	if err := hl.HealersRelease(env.Ctx, c.Why); err != nil {
		return err
	}
	fmt.Fprintln(env.Stdout, "the healers' brake is released: healers act again")
	return nil
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// notReadyLine says what a module that is not ready is doing, and since when.
func notReadyLine(m health.ModuleState) string {
	s := fmt.Sprintf("%s %s since %s", m.Version, m.State, m.Since.Format(timeShown))
	if m.LastExit != "" {
		s += ", last exit: " + m.LastExit
	}
	if m.Detail != "" {
		s += " (" + m.Detail + ")"
	}
	return s
}
