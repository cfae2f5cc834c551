package app

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"mesh-controller/app/plan"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/health"
	"mesh-controller/contexts/inventory"
)

// Signal is something heard regularly, with its age against its bound.
type Signal struct {
	Name    string     `json:"name"`
	Kind    string     `json:"kind"` // heartbeat, data, backup
	Subject string     `json:"subject"`
	Last    *time.Time `json:"last"`
	AgeS    float64    `json:"age_s"`
	BoundS  float64    `json:"bound_s"`
	Quiet   bool       `json:"quiet"`
}

// signals computes every signal's age against its bound from the inventory.
func signals(snap *inventory.Snapshot, data map[string][]inventory.DataSet, b Bounds, now time.Time) []Signal {
	nodes := make([]inventory.NodeState, 0, len(snap.NodeNames))
	for _, name := range snap.NodeNames {
		nodes = append(nodes, snap.Nodes[name])
	}
	return append(nodeSignals(nodes, data, b, now), backupSignals(snap, data, now)...)
}

// signal is one signal's age against its bound.
func signal(kind, subject string, last *time.Time, bound time.Duration, now time.Time) Signal {
	s := Signal{Name: kind + "/" + subject, Kind: kind, Subject: subject, Last: last, BoundS: bound.Seconds(), Quiet: true}
	if last != nil {
		age := now.Sub(*last)
		s.AgeS, s.Quiet = age.Seconds(), age > bound
	}
	return s
}

// nodeSignals are the heartbeat and data signals of the joined nodes among
// nodes, in their order.
func nodeSignals(nodes []inventory.NodeState, data map[string][]inventory.DataSet, b Bounds, now time.Time) []Signal {
	out := []Signal{}
	for _, n := range nodes {
		if !n.Joined {
			continue
		}
		out = append(out, signal("heartbeat", n.Name, n.LastHeard, b.heartbeat(n.Name, n.HeartbeatIntervalS), now))
		if sets := data[n.Name]; len(sets) > 0 {
			last := sets[0].ReportedAt
			out = append(out, signal("data", n.Name, &last, b.DataReport, now))
		}
	}
	return out
}

// backupSignals are the backup signals of every data set the mesh backs
// up (plan.BackupSets: assigned or retired, precious), each read as data
// and cleanup read it (lastBackupHeard: its host's report or the holder's,
// the later), so every view says the same last backup.
func backupSignals(snap *inventory.Snapshot, data map[string][]inventory.DataSet, now time.Time) []Signal {
	out := []Signal{}
	for _, b := range plan.BackupSets(snap) {
		last := lastBackupHeard(snap, data, b.Node, b.Module, b.Data.Name)
		out = append(out, signal("backup", b.Key(), last, 2*plan.BackupCadence(b.Data), now))
	}
	return out
}

// readSignals reads what signals are computed from (a snapshot and the data
// reports), and only that: doctor signals reads it on every call.
func (c uses) readSignals(ctx context.Context, inv *inventory.Store) (*inventory.Snapshot, []Signal, error) {
	snap, err := inv.Snapshot(ctx)
	if err != nil {
		return nil, nil, err
	}
	data, err := inv.AllDataSets(ctx)
	if err != nil {
		return nil, nil, err
	}
	return snap, signals(snap, data, DefaultBounds(), c.Now()), nil
}

// OutOfDate is a node behind its plan or a module behind its source.
type OutOfDate struct {
	Kind string `json:"kind"` // node or module
	Name string `json:"name"`
	Why  string `json:"why"`
}

// StatusView answers three questions: what is wrong, what is quiet, what is out of date.
type StatusView struct {
	Wrong []health.Condition `json:"wrong"`
	// NotReady are the assigned modules whose host reports them not ready
	// now, before any bound has made them a condition.
	NotReady  []health.ModuleState `json:"not_ready"`
	Quiet     []Signal             `json:"quiet"`
	OutOfDate []OutOfDate          `json:"out_of_date"`
	// Checked is when the self-check last ran (nil if never).
	Checked *time.Time `json:"checked"`
}

// Status reads the stores afresh: open conditions (as the last self-check
// found them), signals past their bound, nodes and modules out of date. Of
// the nodes it reads only those the store finds near or past a bound
// (inventory's NodesToJudge) and judges each as the self-check's signals
// do: the same answer as judging every node, without reading every node of
// a well mesh (BenchmarkStatus10000).
func (c *Health) Status(ctx context.Context) (StatusView, error) {
	v, _, err := c.status(ctx)
	return v, err
}

// statusRead is what status read to answer, which the board draws from too.
type statusRead struct {
	snap   *inventory.Snapshot // without nodes
	states []health.ModuleState
}

func (c *Health) status(ctx context.Context) (StatusView, statusRead, error) {
	var read statusRead
	st, err := c.stores(ctx)
	if err != nil {
		return StatusView{}, read, err
	}
	inv, hs := st.Inventory, st.Health
	v := StatusView{Quiet: []Signal{}, OutOfDate: []OutOfDate{}, NotReady: []health.ModuleState{}}
	if v.Wrong, err = hs.Conditions(ctx); err != nil {
		return v, read, err
	}
	states, err := hs.ModuleStates(ctx, "")
	if err != nil {
		return v, read, err
	}
	if last, err := hs.LastVerdict(ctx); err == nil {
		v.Checked = &last.At
	}
	now, b := c.Now(), DefaultBounds()
	judged, err := inv.NodesToJudge(ctx, inventory.Watch{Now: now, HeartbeatFactor: b.HeartbeatFactor,
		DefaultInterval: protocol.DefaultHeartbeat, DataReport: b.DataReport})
	if err != nil {
		return v, read, err
	}
	snap, err := inv.SnapshotWithoutNodes(ctx)
	if err != nil {
		return v, read, err
	}
	read = statusRead{snap: snap, states: states}
	data, err := inv.AllDataSets(ctx)
	if err != nil {
		return v, read, err
	}
	for _, s := range append(nodeSignals(judged, data, b, now), backupSignals(snap, data, now)...) {
		if s.Quiet {
			v.Quiet = append(v.Quiet, s)
		}
	}
	for _, m := range states {
		if m.State != protocol.StateReady && snap.VersionOn(m.Node, m.Module) != "" {
			v.NotReady = append(v.NotReady, m)
		}
	}
	for _, n := range judged {
		switch {
		case n.PlanVersion > n.DeclaredPlanVersion:
			v.OutOfDate = append(v.OutOfDate, OutOfDate{Kind: "node", Name: n.Name, Why: "its declaration is older than its plan"})
		case n.SerialApplied < n.SerialDeclared:
			v.OutOfDate = append(v.OutOfDate, OutOfDate{Kind: "node", Name: n.Name,
				Why: fmt.Sprintf("applied %d of declaration %d", n.SerialApplied, n.SerialDeclared)})
		case n.Pending > 0:
			// Recorded by upgrade record: nothing was sent, and it is out
			// of date until push --behind sends it.
			v.OutOfDate = append(v.OutOfDate, OutOfDate{Kind: "node", Name: n.Name, Why: behindWhy(n)})
		}
	}
	keys, err := keyStatus(ctx, st.Identity, now)
	if err != nil {
		return v, read, err
	}
	v.OutOfDate = append(v.OutOfDate, keys...)
	mods, err := inv.Modules(ctx)
	if err != nil {
		return v, read, err
	}
	for _, m := range mods {
		if m.BehindSource() {
			v.OutOfDate = append(v.OutOfDate, OutOfDate{Kind: "module", Name: m.Name, Why: "its source moved to " + m.MovedCommit})
		}
	}
	return v, read, nil
}

// ConditionFilter narrows conditions.
type ConditionFilter struct {
	Scope, Severity, Machine string
}

// Conditions lists the open conditions, urgent first.
func (c *Health) Conditions(ctx context.Context, f ConditionFilter) ([]health.Condition, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return nil, err
	}
	all, err := st.Health.Conditions(ctx)
	if err != nil {
		return nil, err
	}
	out := []health.Condition{}
	for _, cd := range all {
		if (f.Scope == "" || cd.Scope == f.Scope) && (f.Severity == "" || cd.Severity == f.Severity) && (f.Machine == "" || cd.Machine == f.Machine) {
			out = append(out, cd)
		}
	}
	return out, nil
}

// ConditionDetail is one condition whole, with its history.
type ConditionDetail struct {
	health.Condition
	History []health.Change `json:"history"`
}

// ConditionShow shows one open condition with its evidence and history.
func (c *Health) ConditionShow(ctx context.Context, key string) (ConditionDetail, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return ConditionDetail{}, err
	}
	hs := st.Health
	cd, err := hs.Condition(ctx, key)
	if err != nil {
		return ConditionDetail{}, err
	}
	h, err := hs.History(ctx, key, time.Time{})
	return ConditionDetail{Condition: cd, History: h}, err
}

// ConditionSilence stops a condition's messages for a while: a hand act.
func (c *Health) ConditionSilence(ctx context.Context, key string, d time.Duration, why string) (health.Condition, error) {
	if why == "" {
		return health.Condition{}, health.ErrNoWhy
	}
	if d <= 0 {
		return health.Condition{}, ErrBadSilence
	}
	st, err := c.stores(ctx)
	if err != nil {
		return health.Condition{}, err
	}
	hs := st.Health
	cd, err := hs.Silence(ctx, key, c.Now().Add(d), why, c.Now())
	if err != nil {
		return cd, err
	}
	_, err = hs.RecordHandAct(ctx, health.HandAct{At: c.Now(), What: fmt.Sprintf("silence %s for %s", key, d), Why: why, Cause: "silence", Who: who(), Condition: key})
	return cd, err
}

// ErrBadSilence means a silence's length is not positive.
var ErrBadSilence = fmt.Errorf("a silence must last a positive time")

// ConditionsHistory lists raisings, changes, clearings and silencings lately.
func (c *Health) ConditionsHistory(ctx context.Context, days int, key string) ([]health.Change, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return nil, err
	}
	return st.Health.History(ctx, key, c.Now().Add(-time.Duration(days)*24*time.Hour))
}

// HandActRecord records an act done by hand outside the mesh.
func (c *Health) HandActRecord(ctx context.Context, what, why, cause, condition string) (health.HandAct, error) {
	if strings.TrimSpace(what) == "" {
		return health.HandAct{}, fmt.Errorf("say what was done")
	}
	if cause == "" || strings.ContainsAny(cause, " \t\n") {
		return health.HandAct{}, ErrBadCause
	}
	st, err := c.stores(ctx)
	if err != nil {
		return health.HandAct{}, err
	}
	return st.Health.RecordHandAct(ctx, health.HandAct{At: c.Now(), What: what, Why: why, Cause: cause, Who: who(), Condition: condition})
}

// ErrBadCause means a hand act's cause is not one word.
var ErrBadCause = fmt.Errorf("a cause is one word, so that repeating causes can be counted")

// HandActsView is what was done by hand lately, and which causes repeat.
type HandActsView struct {
	Acts   []health.HandAct `json:"acts"`
	Causes []CauseCount     `json:"causes"`
}

// CauseCount is how often a cause was given.
type CauseCount struct {
	Cause string `json:"cause"`
	Count int    `json:"count"`
}

// HandActs lists the hand acts of the last days, with causes counted.
func (c *Health) HandActs(ctx context.Context, days int) (HandActsView, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return HandActsView{}, err
	}
	acts, err := st.Health.HandActs(ctx, c.Now().Add(-time.Duration(days)*24*time.Hour))
	if err != nil {
		return HandActsView{}, err
	}
	counts := map[string]int{}
	for i, a := range acts {
		counts[a.Cause]++
		// An act on a build kept before credentials were refused in
		// repository URLs names its repository with them.
		acts[i].What = inventory.RedactText(a.What)
	}
	v := HandActsView{Acts: acts, Causes: []CauseCount{}}
	for cause, n := range counts {
		v.Causes = append(v.Causes, CauseCount{cause, n})
	}
	sort.Slice(v.Causes, func(i, j int) bool {
		if v.Causes[i].Count != v.Causes[j].Count {
			return v.Causes[i].Count > v.Causes[j].Count
		}
		return v.Causes[i].Cause < v.Causes[j].Cause
	})
	return v, nil
}

// DurationStats summarises one kind of duration for one machine or module.
type DurationStats struct {
	Kind    string  `json:"kind"`
	Subject string  `json:"subject"`
	Name    string  `json:"name,omitempty"`
	Count   int     `json:"count"`
	P50     float64 `json:"p50_ms"`
	P90     float64 `json:"p90_ms"`
	P99     float64 `json:"p99_ms"`
	Max     float64 `json:"max_ms"`
}

// Durations summarises measured durations of the last days.
func (c *Health) Durations(ctx context.Context, kind string, days int) ([]DurationStats, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return nil, err
	}
	since := c.Now().Add(-time.Duration(days) * 24 * time.Hour)
	ds, err := st.Health.Durations(ctx, kind, since)
	if err != nil {
		return nil, err
	}
	groups := map[[3]string][]float64{}
	for _, d := range ds {
		k := [3]string{d.Kind, d.Subject, d.Name}
		groups[k] = append(groups[k], d.MS)
	}
	out := []DurationStats{}
	for k, ms := range groups {
		sort.Float64s(ms)
		out = append(out, DurationStats{Kind: k[0], Subject: k[1], Name: k[2], Count: len(ms),
			P50: percentile(ms, 0.5), P90: percentile(ms, 0.9), P99: percentile(ms, 0.99), Max: ms[len(ms)-1]})
	}
	if kind == "" || kind == "heartbeat" {
		// Heartbeat intervals are kept as hourly aggregates per node.
		hs, err := st.Health.Heartbeats(ctx, since)
		if err != nil {
			return nil, err
		}
		for node, h := range hs {
			out = append(out, DurationStats{Kind: "heartbeat", Subject: node, Count: int(h.Count),
				P50: h.Quantile(0.5), P90: h.Quantile(0.9), P99: h.Quantile(0.99), Max: h.MaxMS})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		return a.Kind+"\x00"+a.Subject+"\x00"+a.Name < b.Kind+"\x00"+b.Subject+"\x00"+b.Name
	})
	return out, nil
}

// DoctorView is the self-check's last verdict, and each signal.
type DoctorView struct {
	Verdict health.Verdict `json:"verdict"`
}

// DoctorLast returns the last verdict.
func (c *Health) DoctorLast(ctx context.Context) (health.Verdict, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return health.Verdict{}, err
	}
	return st.Health.LastVerdict(ctx)
}

// DoctorSignals lists each signal's age against its bound.
func (c *Health) DoctorSignals(ctx context.Context) ([]Signal, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return nil, err
	}
	_, sigs, err := c.readSignals(ctx, st.Inventory)
	return sigs, err
}
