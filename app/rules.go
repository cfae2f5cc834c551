package app

import (
	"fmt"
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"mesh-controller/app/nftables"
	"mesh-controller/app/overlay"
	"mesh-controller/app/plan"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/builds"
	"mesh-controller/contexts/health"
	"mesh-controller/contexts/identity"
	"mesh-controller/contexts/inventory"
	"mesh-controller/contexts/licences"
)

// Bounds are how old a signal may grow, and how long a state may last,
// before it is a condition. Defaults are conditions.md's; they are meant to
// be set from measured durations.
type Bounds struct {
	// HeartbeatFactor times a node's heartbeat interval is its silence bound.
	HeartbeatFactor float64 `json:"heartbeat_factor"`
	// Heartbeat, if set, is a node's silence bound measured from durations.
	Heartbeat map[string]time.Duration `json:"heartbeat,omitempty"`
	// Apply is how long a node may stay behind its latest declaration.
	Apply time.Duration `json:"apply"`
	// DataReport is how old a node's data report may grow.
	DataReport time.Duration `json:"data_report"`
	// RetiredWaiting is how long retired data may wait for a person.
	RetiredWaiting time.Duration `json:"retired_waiting"`
	// Memory is how long a one-off event (a bad signature, a reused token) stays a condition.
	Memory time.Duration `json:"memory"`
	// Start is how long a declared module may stay not ready.
	Start time.Duration `json:"start"`
}

// DefaultBounds are conditions.md's values.
func DefaultBounds() Bounds {
	return Bounds{HeartbeatFactor: 3, Apply: 2 * time.Minute, DataReport: 15 * time.Minute, RetiredWaiting: 30 * 24 * time.Hour, Memory: 24 * time.Hour,
		Start: 2 * time.Minute}
}

// checkInputs is everything the rules judge, read once per self-check.
type checkInputs struct {
	now      time.Time
	bounds   Bounds
	nodes    []inventory.Node
	modules  []inventory.Module
	snap     *inventory.Snapshot
	declared map[string]time.Time // node -> latest declaration issued at
	data     map[string][]inventory.DataSet
	// filterFacts are the nodes' reports of the mesh's packet filter
	// (protocol.FilterFact), by node.
	filterFacts map[string]inventory.Fact
	// resticFacts are the nodes' reports of the restic they have
	// (protocol.FactRestic), by node.
	resticFacts map[string]inventory.Fact
	// silentPeers are the overlay pairs the daemon found silent.
	silentPeers []inventory.SilentPeer
	// keyRefusals are the WireGuard keys refused as another node's when
	// reported; mesh is the overlay computed from the snapshot, on first
	// need.
	keyRefusals []inventory.KeyRefusal
	mesh        *overlay.Mesh
	// listeners are what the converged nodes' hosts found listening, by
	// node; sshPorts the SSH ports they reported.
	listeners map[string][]inventory.Found
	sshPorts  map[string]int
	// portsDeclared are the listener names (tcp/N, udp/N) the modules
	// assigned on each node declare: made once, on first need.
	portsDeclared map[string]map[string]bool
	retirements   []inventory.Retirement
	drops         []health.Drop
	// moduleStates are the supervised modules as their hosts report them.
	moduleStates []health.ModuleState
	// queue is the open build asks, latestBuilds each module's latest
	// ended build, pausedBuilders the pauses, buildP99 each module's p99
	// build duration (30 days).
	queue          []builds.Ask
	latestBuilds   []builds.Ask
	pausedBuilders []builds.Pause
	askedAgain     map[string]builds.State
	buildP99       map[string]time.Duration
	reuses         []identity.TokenReuse
	// keyChain is the signing key's chain of rotations, keyAcks the key
	// each host says it verifies with.
	keyChain []identity.KeyLink
	keyAcks  []identity.KeyAck
	// hostVersions are the protocol each joined host was last heard
	// speaking, and its build.
	hostVersions []identity.HostVersion
	// refusals are the joins refused within joinRefusedWindow.
	refusals []health.JoinRefusals
	brake    health.Brake
	// licences are every licence with its holders.
	licences []licences.Licence
	// refreshFailed are the licences whose last refresh failed, and when.
	refreshFailed map[string]time.Time
	secretCount   int
	operatorKey   bool
	onlyOlder     int
	// licenceOnlyOlder counts the licence copies only a replaced operator
	// key opens.
	licenceOnlyOlder int
	probes           []health.Probe
	// handActFor says a person recorded a hand act for a condition key.
	handActFor map[string]bool
}

// join.refused: more than joinRefusedOver joins refused from one source
// within joinRefusedWindow. A person mistyping a token a few times stays
// under it; someone trying tokens or probing names, or a rack joining with
// an old token file, does not.
const (
	joinRefusedOver   = 10
	joinRefusedWindow = 10 * time.Minute
)

// rule is one condition kind: its catalogue entry and how it is judged.
type rule struct {
	kind string
	// needs names the stores it reads; it is not judged when one failed.
	needs []string
	eval  func(in *checkInputs) []health.Condition
}

func machineCondition(kind, node, severity, summary string, evidence map[string]any) health.Condition {
	return health.Condition{Key: kind + "/" + node, Kind: kind, Scope: "machine", Machine: node, Severity: severity, Summary: summary, Evidence: evidence}
}

// licenceExpiringWithin is how near its expiry a licence that cannot be
// refreshed is said to be expiring.
const licenceExpiringWithin = 7 * 24 * time.Hour

func doesOrDo(n int) string {
	if n == 1 {
		return "does"
	}
	return "do"
}

// overlayMesh is the overlay computed from the snapshot, once a check.
func (in *checkInputs) overlayMesh() *overlay.Mesh {
	if in.mesh == nil {
		m := overlay.Compute(in.snap.Overlay)
		in.mesh = &m
	}
	return in.mesh
}

// heartbeatBound is a node's silence bound.
func (in *checkInputs) heartbeatBound(n inventory.Node) time.Duration {
	return in.bounds.heartbeat(n.Name, n.HeartbeatIntervalS)
}

// heartbeat is a node's silence bound: measured, or a factor of its interval.
func (b Bounds) heartbeat(node string, intervalS float64) time.Duration {
	if bound, ok := b.Heartbeat[node]; ok {
		return bound
	}
	interval := time.Duration(intervalS * float64(time.Second))
	if interval <= 0 {
		interval = protocol.DefaultHeartbeat
	}
	return time.Duration(b.HeartbeatFactor * float64(interval))
}

var rules = []rule{
	{kind: "node.silent", needs: []string{"inventory"}, eval: func(in *checkInputs) []health.Condition {
		var out []health.Condition
		for _, n := range in.nodes {
			if n.JoinedAt == nil || n.LastHeard == nil {
				continue
			}
			if bound := in.heartbeatBound(n); in.now.Sub(*n.LastHeard) > bound {
				// The summary names stable facts only: a check that finds the
				// same silence changes nothing.
				out = append(out, machineCondition("node.silent", n.Name, health.Urgent,
					fmt.Sprintf("%s not heard since %s (bound %s)", n.Name, n.LastHeard.UTC().Format(time.RFC3339), bound),
					map[string]any{"last_heard": n.LastHeard.UTC().Format(time.RFC3339), "bound_s": bound.Seconds()}))
			}
		}
		return out
	}},
	{kind: "node.behind", needs: []string{"inventory"}, eval: func(in *checkInputs) []health.Condition {
		var out []health.Condition
		for _, n := range in.nodes {
			issued, ok := in.declared[n.Name]
			if !ok || n.JoinedAt == nil || n.SerialApplied >= n.SerialDeclared || in.now.Sub(issued) <= in.bounds.Apply {
				continue
			}
			out = append(out, machineCondition("node.behind", n.Name, health.Warning,
				fmt.Sprintf("%s has applied %d, not its declaration %d of %s (bound %s)", n.Name, n.SerialApplied, n.SerialDeclared, issued.UTC().Format(time.RFC3339), in.bounds.Apply),
				map[string]any{"serial_applied": n.SerialApplied, "serial_declared": n.SerialDeclared, "declared_at": issued.UTC().Format(time.RFC3339)}))
		}
		return out
	}},
	{kind: "node.apply-failed", needs: []string{"inventory"}, eval: func(in *checkInputs) []health.Condition {
		var out []health.Condition
		for _, n := range in.nodes {
			o := n.LastOutcome
			if o == nil || o.OK || o.Serial <= n.SerialApplied {
				continue
			}
			out = append(out, machineCondition("node.apply-failed", n.Name, health.Urgent,
				fmt.Sprintf("%s failed to apply declaration %d: %s", n.Name, o.Serial, o.Error),
				map[string]any{"serial": o.Serial, "error": o.Error, "at": o.At.UTC().Format(time.RFC3339)}))
		}
		return out
	}},
	{kind: "node.filter-rolled-back", needs: []string{"inventory"}, eval: func(in *checkInputs) []health.Condition {
		// Raised while the host says it rolled the filter back; cleared
		// when it reports a filter applied and kept (or none owned).
		var out []health.Condition
		for _, n := range in.nodes {
			f, ok := in.filterFacts[n.Name]
			if !ok || f.Value != protocol.FilterRolledBack {
				continue
			}
			out = append(out, machineCondition("node.filter-rolled-back", n.Name, health.Urgent,
				fmt.Sprintf("%s rolled the mesh's packet filter back: %s", n.Name, f.Why), map[string]any{"why": f.Why}))
		}
		return out
	}},
	{kind: "node.overlay-peer-silent", needs: []string{"inventory"}, eval: func(in *checkInputs) []health.Condition {
		// What the store says: the daemon writes a pair when it turns
		// silent and takes it away when a handshake is heard.
		var out []health.Condition
		for _, p := range in.silentPeers {
			last, heard := "never", any(nil)
			if p.LastHandshake != nil {
				last = fmt.Sprintf("last at %s", p.LastHandshake.UTC().Format(time.RFC3339))
				heard = p.LastHandshake.UTC().Format(time.RFC3339)
			}
			out = append(out, health.Condition{Key: "node.overlay-peer-silent/" + p.Node + "/" + p.Peer, Kind: "node.overlay-peer-silent", Scope: "machine",
				Machine: p.Node, Severity: health.Warning,
				Summary: fmt.Sprintf("%s has heard no WireGuard handshake from its overlay peer %s for over %s (%s): is %s up, and its endpoint reachable?",
					p.Node, p.Peer, protocol.OverlayPeerSilentAfter, last, p.Peer),
				Evidence: map[string]any{"peer": p.Peer, "last_handshake": heard, "silent_since": p.Since.UTC().Format(time.RFC3339)}})
		}
		return out
	}},
	{kind: "overlay.key-conflict", needs: []string{"inventory"}, eval: func(in *checkInputs) []health.Condition {
		// Refused when reported (the store keeps the refusal), or two
		// nodes recorded with one key behind that (the overlay leaves the
		// later out): either way the node named is out of the overlay.
		var out []health.Condition
		seen := map[string]bool{}
		conflict := func(node, holder, key string, since *time.Time) {
			if seen[node] {
				return
			}
			seen[node] = true
			ev := map[string]any{"holder": holder, "key": key}
			if since != nil {
				ev["since"] = since.UTC().Format(time.RFC3339)
			}
			out = append(out, machineCondition("overlay.key-conflict", node, health.Urgent,
				fmt.Sprintf("%s's host reported the WireGuard key %s holds: %s keeps it, and %s is out of the overlay until its host reports a key of its own "+
					"(move wireguard.key out of its state dir and restart mesh-host there; or, if %s is not to be trusted, node remove %s)",
					node, holder, holder, node, node, node), ev))
		}
		for _, r := range in.keyRefusals {
			conflict(r.Node, r.Holder, r.Key, &r.Since)
		}
		for _, c := range in.overlayMesh().Conflicts {
			conflict(c.Node, c.Holder, c.Key, nil)
		}
		return out
	}},
	{kind: "overlay.peer-refused", needs: []string{"inventory"}, eval: func(in *checkInputs) []health.Condition {
		// What the planner leaves out of an overlay part because its host
		// would refuse it: none while the records are sound.
		m := in.overlayMesh()
		var out []health.Condition
		for _, n := range m.Nodes {
			_, refused := m.Accepted(n.Node)
			for _, r := range refused {
				c := health.Condition{Key: "overlay.peer-refused/" + r.Node, Kind: "overlay.peer-refused", Scope: "machine", Machine: r.Node, Severity: health.Warning,
					Summary:  fmt.Sprintf("%s is declared no overlay: its host would refuse it (%s)", r.Node, r.Why),
					Evidence: map[string]any{"why": r.Why}}
				if r.Peer != "" {
					c.Key += "/" + r.Peer
					c.Summary = fmt.Sprintf("%s is declared its overlay without its peer %s: its host would refuse the peer (%s); see overlay show", r.Node, r.Peer, r.Why)
					c.Evidence["peer"] = r.Peer
				}
				out = append(out, c)
			}
		}
		return out
	}},
	{kind: "node.unmanaged-listener", needs: []string{"inventory"}, eval: func(in *checkInputs) []health.Condition {
		var out []health.Condition
		for _, n := range in.nodes {
			if ls := unmanagedListeners(in, n); len(ls) > 0 {
				out = append(out, unmanagedCondition(n.Name, ls))
			}
		}
		return out
	}},
	{kind: "node.bad-signature", needs: []string{"health"}, eval: func(in *checkInputs) []health.Condition {
		var out []health.Condition
		for _, d := range in.drops {
			if d.Reason != "bad signature" || in.now.Sub(d.LastAt) > in.bounds.Memory {
				continue
			}
			out = append(out, machineCondition("node.bad-signature", d.Node, health.Urgent,
				fmt.Sprintf("%s claiming to be from %s did not verify", Plural(d.Count, "message"), d.Node),
				map[string]any{"count": d.Count, "last_at": d.LastAt.UTC().Format(time.RFC3339)}))
		}
		return out
	}},
	{kind: "node.protocol-mismatch", needs: []string{"identity"}, eval: func(in *checkInputs) []health.Condition {
		// Raised while a node's host was last heard speaking a protocol
		// this controller does not speak (every message of it dropped or
		// refused); cleared once it is heard speaking one it does (the host
		// or this controller upgraded).
		var out []health.Condition
		for _, h := range in.hostVersions {
			if h.Protocol == "" {
				continue
			}
			if err := protocol.Speaks(h.Protocol); err != nil {
				out = append(out, machineCondition("node.protocol-mismatch", h.Node, health.Urgent,
					fmt.Sprintf("%s is not heard: %v", h.Node, err),
					map[string]any{"host_protocol": h.Protocol, "controller_protocol": protocol.Version, "host_version": h.Version}))
			}
		}
		return out
	}},
	{kind: "token.reused", needs: []string{"identity"}, eval: func(in *checkInputs) []health.Condition {
		var out []health.Condition
		for _, r := range in.reuses {
			if in.now.Sub(r.LastAt) > in.bounds.Memory {
				continue
			}
			c := machineCondition("token.reused", r.Node, health.Warning,
				fmt.Sprintf("a used join token of %s was presented again (%s)", r.Node, Plural(r.Count, "time")),
				map[string]any{"count": r.Count, "last_at": r.LastAt.UTC().Format(time.RFC3339)})
			out = append(out, c)
		}
		return out
	}},
	{kind: "node.retired-key", needs: []string{"identity"}, eval: func(in *checkInputs) []health.Condition {
		return conditionsOf(keyConditions(in), "node.retired-key")
	}},
	{kind: "node.key-refused", needs: []string{"identity"}, eval: func(in *checkInputs) []health.Condition {
		return conditionsOf(keyConditions(in), "node.key-refused")
	}},
	{kind: "join.refused", needs: []string{"health"}, eval: func(in *checkInputs) []health.Condition {
		type seen struct {
			count       int64
			reasons     map[string]int64
			first, last time.Time
		}
		per := map[string]*seen{}
		var sources []string
		for _, r := range in.refusals {
			if in.now.Sub(r.LastAt) > joinRefusedWindow {
				continue
			}
			s := per[r.Source]
			if s == nil {
				s = &seen{reasons: map[string]int64{}, first: r.FirstAt, last: r.LastAt}
				per[r.Source] = s
				sources = append(sources, r.Source)
			}
			s.count += r.Count
			s.reasons[r.Reason] += r.Count
			s.first = minTime(s.first, r.FirstAt)
			s.last = maxTime(s.last, r.LastAt)
		}
		slices.Sort(sources)
		var out []health.Condition
		for _, source := range sources {
			s := per[source]
			if s.count <= joinRefusedOver {
				continue
			}
			reasons := make([]string, 0, len(s.reasons))
			for _, r := range slices.Sorted(maps.Keys(s.reasons)) {
				reasons = append(reasons, fmt.Sprintf("%d %s", s.reasons[r], r))
			}
			out = append(out, health.Condition{Key: "join.refused/" + source, Kind: "join.refused", Scope: "mesh", Severity: health.Warning,
				Summary: fmt.Sprintf("%d joins from %s refused within %s (%s)", s.count, source, joinRefusedWindow, strings.Join(reasons, ", ")),
				Evidence: map[string]any{"source": source, "count": s.count, "reasons": s.reasons, "first_at": s.first.UTC().Format(time.RFC3339),
					"last_at": s.last.UTC().Format(time.RFC3339), "window_s": joinRefusedWindow.Seconds(), "over": joinRefusedOver}})
		}
		return out
	}},
	{kind: "module.behind-source", needs: []string{"inventory"}, eval: func(in *checkInputs) []health.Condition {
		var out []health.Condition
		for _, m := range in.modules {
			if m.BehindSource() {
				out = append(out, health.Condition{Key: "module.behind-source/" + m.Name, Kind: "module.behind-source", Scope: "module", Module: m.Name,
					Severity: health.Notice, Summary: fmt.Sprintf("%s's source moved to %s past what the mesh built", m.Name, m.MovedCommit),
					Evidence: map[string]any{"moved_commit": m.MovedCommit, "commit": m.Commit, "version": m.CurrentVersion}})
			}
		}
		return out
	}},
	{kind: "secret.no-operator-key", needs: []string{"secrets"}, eval: func(in *checkInputs) []health.Condition {
		if in.secretCount == 0 || in.operatorKey {
			return nil
		}
		they := "they cannot"
		if in.secretCount == 1 {
			they = "it cannot"
		}
		return []health.Condition{{Key: "secret.no-operator-key", Kind: "secret.no-operator-key", Scope: "mesh", Severity: health.Urgent,
			Summary:  fmt.Sprintf("%s and no operator key set: %s be recovered off the mesh", Plural(in.secretCount, "secret"), they),
			Evidence: map[string]any{"secrets": in.secretCount}}}
	}},
	{kind: "secret.old-operator-key", needs: []string{"secrets", "licences"}, eval: func(in *checkInputs) []health.Condition {
		if in.onlyOlder == 0 && in.licenceOnlyOlder == 0 {
			return nil
		}
		summary := fmt.Sprintf("%s sealed only to a replaced operator key", isAre(in.onlyOlder, "secret"))
		if in.licenceOnlyOlder > 0 {
			copies := fmt.Sprintf("%d licence copies are", in.licenceOnlyOlder)
			if in.licenceOnlyOlder == 1 {
				copies = "1 licence copy is"
			}
			summary = copies + " sealed only to a replaced operator key"
			if in.onlyOlder > 0 {
				summary = fmt.Sprintf("%s, and %s", Plural(in.onlyOlder, "secret"), summary)
			}
		}
		return []health.Condition{{Key: "secret.old-operator-key", Kind: "secret.old-operator-key", Scope: "mesh", Severity: health.Warning,
			Summary:  summary,
			Evidence: map[string]any{"only_older_keys": in.onlyOlder, "licence_copies_only_older": in.licenceOnlyOlder}}}
	}},
	{kind: "licence.expiring", needs: []string{"licences"}, eval: func(in *checkInputs) []health.Condition {
		var out []health.Condition
		for _, l := range in.licences {
			if l.Refreshable || l.Expires == nil || l.Expires.Sub(in.now) > licenceExpiringWithin {
				continue
			}
			when := "expires " + l.Expires.UTC().Format(time.RFC3339)
			if !l.Expires.After(in.now) {
				when = "expired " + l.Expires.UTC().Format(time.RFC3339)
			}
			out = append(out, health.Condition{Key: "licence.expiring/" + l.Name, Kind: "licence.expiring", Scope: "mesh", Severity: health.Warning,
				Summary:  fmt.Sprintf("licence %s (%s) %s and cannot be refreshed: add its replacement ('mesh-controller licence add')", l.Name, l.Provider, when),
				Evidence: map[string]any{"expires": l.Expires.UTC().Format(time.RFC3339), "version": l.Version, "holders": len(l.Holders)}})
		}
		return out
	}},
	{kind: "licence.refresh-failed", needs: []string{"licences"}, eval: func(in *checkInputs) []health.Condition {
		var out []health.Condition
		for _, l := range in.licences {
			at, ok := in.refreshFailed[l.Name]
			if !ok {
				continue
			}
			manager := "no manager"
			if l.ManagerNode != "" {
				manager = "its manager " + l.ManagerNode + "/" + l.ManagerModule
			}
			out = append(out, health.Condition{Key: "licence.refresh-failed/" + l.Name, Kind: "licence.refresh-failed", Scope: "mesh", Severity: health.Urgent,
				Summary: fmt.Sprintf("refreshing licence %s through %s failed at %s: its holders keep version %d; 'mesh-controller licence refresh %s' says why",
					l.Name, manager, at.UTC().Format(time.RFC3339), l.Version, l.Name),
				Evidence: map[string]any{"failed_at": at.UTC().Format(time.RFC3339), "manager": strings.TrimPrefix(manager, "its manager "), "version": l.Version}})
		}
		return out
	}},
	{kind: "licence.unheld", needs: []string{"licences", "inventory"}, eval: func(in *checkInputs) []health.Condition {
		held := map[string]bool{}
		for _, l := range in.licences {
			for _, h := range l.Holders {
				held[l.Name+" "+h.String()] = true
			}
		}
		var names []string
		waiting := map[string][]string{}
		for name, needers := range licencesNeeded(in.snap) {
			for _, n := range needers {
				if !held[name+" "+n] {
					if len(waiting[name]) == 0 {
						names = append(names, name)
					}
					waiting[name] = append(waiting[name], n)
				}
			}
		}
		sort.Strings(names)
		var out []health.Condition
		for _, name := range names {
			w := waiting[name]
			sort.Strings(w)
			out = append(out, health.Condition{Key: "licence.unheld/" + name, Kind: "licence.unheld", Scope: "mesh", Severity: health.Warning,
				Summary:  fmt.Sprintf("licence %s is needed by %s, which %s not hold it: 'mesh-controller licence use %s NODE/MODULE --key OPERATOR-KEY'", name, strings.Join(w, ", "), doesOrDo(len(w)), name),
				Evidence: map[string]any{"waiting": w, "count": len(w)}})
		}
		return out
	}},
	{kind: "build.failed", needs: []string{"builds"}, eval: func(in *checkInputs) []health.Condition {
		var out []health.Condition
		for _, a := range in.latestBuilds {
			if a.State != builds.Failed || a.Module == "" {
				continue
			}
			out = append(out, health.Condition{Key: "build.failed/" + a.Module, Kind: "build.failed", Scope: "module", Module: a.Module, Severity: health.Warning,
				Summary:  fmt.Sprintf("the latest build of %s failed: %s", a.Module, a.Why),
				Evidence: map[string]any{"build": a.ID, "repository": a.Repository, "ref": a.Ref, "commit": a.Commit, "builder": a.Builder, "why": a.Why}})
		}
		return out
	}},
	{kind: "build.dead", needs: []string{"builds"}, eval: func(in *checkInputs) []health.Condition {
		var out []health.Condition
		for _, a := range in.queue {
			if a.State != builds.Dead {
				continue
			}
			// Asked again and waiting, building or built: no longer a
			// person's to mend.
			if again := in.askedAgain[a.ID]; again == builds.Waiting || again == builds.InFlight || again == builds.Done {
				continue
			}
			out = append(out, health.Condition{Key: "build.dead/" + a.ID, Kind: "build.dead", Scope: "mesh", Module: a.Module, Severity: health.Warning,
				Summary:  fmt.Sprintf("build %s of %s found no builder that answered: %s", a.ID, a.Repository, a.Why),
				Evidence: map[string]any{"build": a.ID, "repository": a.Repository, "tries": a.Tries, "why": a.Why}})
		}
		return out
	}},
	{kind: "build.no-builder", needs: []string{"builds", "inventory"}, eval: func(in *checkInputs) []health.Condition {
		waiting := 0
		for _, a := range in.queue {
			if a.State == builds.Waiting {
				waiting++
			}
		}
		if waiting == 0 || len(builders(in.snap, in.pausedBuilders)) > 0 {
			return nil
		}
		why := "no module holds the build seat"
		if len(buildSeatHolders(in.snap)) > 0 {
			why = "every holder of the build seat is paused"
		}
		return []health.Condition{{Key: "build.no-builder", Kind: "build.no-builder", Scope: "mesh", Severity: health.Warning,
			Summary:  fmt.Sprintf("%s waiting and %s", Plural(waiting, "build ask"), why),
			Evidence: map[string]any{"waiting": waiting, "why": why}}}
	}},
	{kind: "build.stuck", needs: []string{"builds"}, eval: func(in *checkInputs) []health.Condition {
		var out []health.Condition
		for _, a := range in.queue {
			if a.State != builds.InFlight || a.TakenAt == nil {
				continue
			}
			bound := time.Hour
			if p99, ok := in.buildP99[a.Module]; ok && p99 > 0 {
				bound = 3 * p99
			}
			if in.now.Sub(*a.TakenAt) <= bound {
				continue
			}
			out = append(out, health.Condition{Key: "build.stuck/" + a.ID, Kind: "build.stuck", Scope: "mesh", Module: a.Module, Severity: health.Warning,
				Summary:  fmt.Sprintf("build %s has been in flight on %s for %s (bound %s)", a.ID, a.Builder, in.now.Sub(*a.TakenAt).Round(time.Second), bound),
				Evidence: map[string]any{"build": a.ID, "builder": a.Builder, "taken_at": a.TakenAt.UTC().Format(time.RFC3339), "bound_s": bound.Seconds()}})
		}
		return out
	}},
	{kind: "module.crash-looping", needs: []string{"inventory", "health"}, eval: func(in *checkInputs) []health.Condition {
		var out []health.Condition
		for _, m := range in.assignedStates() {
			// Raised while it loops, and kept for a minute of being ready
			// after many restarts: one lucky start is not a recovery.
			recovering := m.State == protocol.StateReady && in.now.Sub(m.ChangedAt) < crashLoopRecovery && m.Restarts1h >= crashLoopRestarts
			if m.State != protocol.StateCrashLooping && !recovering {
				continue
			}
			summary := fmt.Sprintf("%s on %s keeps exiting: %s in the last hour, last %s", m.Module, m.Node, Plural(m.Restarts1h, "restart"), orNone(m.LastExit))
			if recovering {
				summary = fmt.Sprintf("%s on %s is ready again after %s; cleared after a minute of it", m.Module, m.Node, Plural(m.Restarts1h, "restart"))
			}
			out = append(out, moduleStateCondition("module.crash-looping", health.Urgent, m, summary))
		}
		return out
	}},
	{kind: "module.not-ready", needs: []string{"inventory", "health"}, eval: func(in *checkInputs) []health.Condition {
		var out []health.Condition
		for _, m := range in.assignedStates() {
			bound := in.bounds.Start
			if bound <= 0 {
				bound = DefaultBounds().Start
			}
			if m.State == protocol.StateReady || m.State == protocol.StateCrashLooping || in.now.Sub(m.ChangedAt) <= bound {
				continue
			}
			what := m.State
			if m.Detail != "" {
				what += ": " + m.Detail
			}
			out = append(out, moduleStateCondition("module.not-ready", health.Warning, m,
				fmt.Sprintf("%s on %s is not ready for %s (%s)", m.Module, m.Node, in.now.Sub(m.ChangedAt).Round(time.Second), what)))
		}
		return out
	}},
	{kind: "data.no-backup", needs: []string{"inventory"}, eval: func(in *checkInputs) []health.Condition {
		holder := in.snap.BackupHolders()
		var out []health.Condition
		for _, b := range plan.BackupSets(in.snap) {
			d := b.Data
			if in.lastBackup(b.Node, b.Module, d.Name) != nil {
				continue
			}
			sev := health.Urgent
			if d.Precious == inventory.Costly {
				sev = health.Warning
			}
			why := "no module holds the backup seat"
			if holder != "" {
				why = "no backup of it heard yet (the backup seat is held by " + holder + ")"
			}
			what := "data"
			if b.Retired {
				what = "retired data"
			}
			out = append(out, health.Condition{Key: fmt.Sprintf("data.no-backup/%s/%s/%s", b.Node, b.Module, d.Name), Kind: "data.no-backup",
				Scope: "module", Machine: b.Node, Module: b.Module, Severity: sev,
				Summary:  fmt.Sprintf("%s %s %s on %s (%s) has no backup: %s", b.Module, what, d.Name, b.Node, d.Precious, why),
				Evidence: map[string]any{"path": d.Path, "precious": d.Precious, "backup_holder": holder, "retired": b.Retired}})
		}
		return out
	}},
	{kind: "data.backup-stale", needs: []string{"inventory"}, eval: func(in *checkInputs) []health.Condition {
		var out []health.Condition
		for _, b := range plan.BackupSets(in.snap) {
			d := b.Data
			last := in.lastBackup(b.Node, b.Module, d.Name)
			if last == nil {
				continue
			}
			cadence := plan.BackupCadence(d)
			if age := in.now.Sub(*last); age > 2*cadence {
				out = append(out, health.Condition{Key: fmt.Sprintf("data.backup-stale/%s/%s/%s", b.Node, b.Module, d.Name), Kind: "data.backup-stale",
					Scope: "module", Machine: b.Node, Module: b.Module, Severity: health.Warning,
					Summary:  fmt.Sprintf("%s data %s on %s: last backup %s, older than twice its cadence (%s)", b.Module, d.Name, b.Node, last.UTC().Format(time.RFC3339), cadence),
					Evidence: map[string]any{"last_backup": last.UTC().Format(time.RFC3339), "cadence": cadence.String()}})
			}
		}
		return out
	}},
	{kind: "data.backup-failed", needs: []string{"inventory"}, eval: func(in *checkInputs) []health.Condition {
		var out []health.Condition
		for _, b := range plan.BackupSets(in.snap) {
			st, ok := in.snap.Seats.BackupStates[b.Key()]
			if !ok || st.AttemptAt == nil || st.AttemptOK {
				continue
			}
			sev := health.Warning
			if b.Data.Precious == inventory.Irreplaceable {
				sev = health.Urgent
			}
			ev := map[string]any{"attempt_at": st.AttemptAt.UTC().Format(time.RFC3339), "why": st.AttemptWhy}
			if last := in.lastBackup(b.Node, b.Module, b.Data.Name); last != nil {
				ev["last_backup"] = last.UTC().Format(time.RFC3339)
			}
			out = append(out, health.Condition{Key: fmt.Sprintf("data.backup-failed/%s/%s/%s", b.Node, b.Module, b.Data.Name), Kind: "data.backup-failed",
				Scope: "module", Machine: b.Node, Module: b.Module, Severity: sev,
				Summary: fmt.Sprintf("the last backup of %s data %s on %s failed (%s): %s; data backup %s --why … tries again now",
					b.Module, b.Data.Name, b.Node, st.AttemptAt.UTC().Format(time.RFC3339), st.AttemptWhy, b.Key()),
				Evidence: ev})
		}
		return out
	}},
	{kind: "data.restore-unverified", needs: []string{"inventory"}, eval: func(in *checkInputs) []health.Condition {
		var out []health.Condition
		for _, b := range plan.BackupSets(in.snap) {
			st, ok := in.snap.Seats.BackupStates[b.Key()]
			if !ok || st.FirstBackup == nil {
				continue // nothing to drill yet: data.no-backup says so
			}
			bound := plan.DrillBound(b.Data)
			var why string
			switch {
			case st.DrillAt != nil && !st.DrillOK && (st.VerifiedAt == nil || st.DrillAt.After(*st.VerifiedAt)):
				why = fmt.Sprintf("the last restore drill (%s, of snapshot %s) failed: %s", st.DrillAt.UTC().Format(time.RFC3339), st.DrillSnapshot, st.DrillWhy)
			case st.VerifiedAt == nil && in.now.Sub(*st.FirstBackup) > bound:
				why = fmt.Sprintf("no restore drill has passed since its first backup (%s), more than %s ago", st.FirstBackup.UTC().Format(time.RFC3339), bound)
			case st.VerifiedAt != nil && in.now.Sub(*st.VerifiedAt) > bound:
				why = fmt.Sprintf("the last restore drill that passed was %s, more than %s ago", st.VerifiedAt.UTC().Format(time.RFC3339), bound)
			default:
				continue
			}
			sev := health.Warning
			if b.Data.Precious == inventory.Irreplaceable && st.DrillAt != nil && !st.DrillOK {
				sev = health.Urgent
			}
			out = append(out, health.Condition{Key: fmt.Sprintf("data.restore-unverified/%s/%s/%s", b.Node, b.Module, b.Data.Name), Kind: "data.restore-unverified",
				Scope: "module", Machine: b.Node, Module: b.Module, Severity: sev,
				Summary:  fmt.Sprintf("%s data %s on %s is not known to restore: %s; data verify %s drills one now", b.Module, b.Data.Name, b.Node, why, b.Key()),
				Evidence: map[string]any{"bound": bound.String(), "why": why}})
		}
		return out
	}},
	{kind: "data.no-backup-tool", needs: []string{"inventory"}, eval: func(in *checkInputs) []health.Condition {
		nodes := map[string]int{}
		for _, b := range plan.BackupSets(in.snap) {
			nodes[b.Node]++
		}
		var out []health.Condition
		for _, node := range slices.Sorted(maps.Keys(nodes)) {
			f, reported := in.resticFacts[node]
			if !reported || f.Value != "" {
				continue // a host from before the fact, or one with restic
			}
			out = append(out, health.Condition{Key: "data.no-backup-tool/" + node, Kind: "data.no-backup-tool", Scope: "machine", Machine: node, Severity: health.Urgent,
				Summary: fmt.Sprintf("%s keeps %s the mesh backs up and has no restic to back it up with: install it there (apt-get install --no-install-recommends restic)",
					node, Plural(nodes[node], "data set")),
				Evidence: map[string]any{"why": f.Why}})
		}
		return out
	}},
	{kind: "data.retired-waiting", needs: []string{"inventory"}, eval: func(in *checkInputs) []health.Condition {
		var out []health.Condition
		for _, r := range in.retirements {
			if r.State != "retired" || in.now.Sub(r.RetiredAt) <= in.bounds.RetiredWaiting {
				continue
			}
			key := fmt.Sprintf("data.retired-waiting/%s/%s/%s", r.Node, r.Module, r.DataSet)
			if r.Consumer != "" {
				key += "/" + strings.ReplaceAll(r.Consumer, "/", ":")
			}
			out = append(out, health.Condition{Key: key, Kind: "data.retired-waiting", Scope: "module", Machine: r.Node, Module: r.Module, Severity: health.Notice,
				Summary:  fmt.Sprintf("retired %s data %s on %s has waited for a person since %s", r.Module, r.DataSet, r.Node, r.RetiredAt.UTC().Format("2006-01-02")),
				Evidence: map[string]any{"retired_at": r.RetiredAt.UTC().Format(time.RFC3339), "precious": r.Precious, "why": r.Why}})
		}
		return out
	}},
	{kind: "data.empty-replacement", needs: []string{"inventory", "health"}, eval: func(in *checkInputs) []health.Condition {
		var out []health.Condition
		for _, r := range in.snap.Seats.Replacements {
			key := fmt.Sprintf("data.empty-replacement/%d", r.ID)
			if in.handActFor[key] || in.holderHasData(r.NewHolder) {
				continue
			}
			node, module, _ := strings.Cut(r.NewHolder, "/")
			out = append(out, health.Condition{Key: key, Kind: "data.empty-replacement", Scope: "module", Machine: node, Module: module, Severity: health.Warning,
				Summary:  fmt.Sprintf("%s moved to %s, which started without what %s kept: %s", r.What, r.NewHolder, r.OldHolder, r.Data),
				Evidence: map[string]any{"new_holder": r.NewHolder, "old_holder": r.OldHolder, "data": r.Data, "at": r.At.UTC().Format(time.RFC3339)}})
		}
		return out
	}},
	{kind: "retire.rejected", needs: []string{"inventory"}, eval: func(in *checkInputs) []health.Condition {
		var out []health.Condition
		for _, cs := range in.snap.Seats.Consumers {
			if cs.State != "rejected" {
				continue
			}
			key := "retire.rejected/" + cs.Provider.Node + "/" + cs.Provider.Module + "/" + strings.ReplaceAll(cs.Consumer, "/", ":")
			out = append(out, health.Condition{Key: key, Kind: "retire.rejected", Scope: "module", Machine: cs.Provider.Node, Module: cs.Provider.Module, Severity: health.Warning,
				Summary:  fmt.Sprintf("a person kept %s's %s access at %s active though it is no longer asked for: %s", cs.Consumer, cs.Provision, cs.Provider, cs.Why),
				Evidence: map[string]any{"consumer": cs.Consumer, "since": cs.Since.UTC().Format(time.RFC3339), "why": cs.Why}})
		}
		return out
	}},
	{kind: "healers.brake", needs: []string{"health"}, eval: func(in *checkInputs) []health.Condition {
		if !in.brake.Engaged {
			return nil
		}
		return []health.Condition{{Key: "healers.brake", Kind: "healers.brake", Scope: "mesh", Severity: health.Urgent,
			Summary:  "the healers' brake is engaged: no healer acts until a person releases it (" + in.brake.Why + ")",
			Evidence: map[string]any{"engaged_at": in.brake.EngagedAt.UTC().Format(time.RFC3339), "why": in.brake.Why}}}
	}},
	{kind: "controller.store", eval: func(in *checkInputs) []health.Condition {
		var out []health.Condition
		for _, p := range in.probes {
			if strings.HasPrefix(p.Name, "store ") && !p.OK {
				out = append(out, health.Condition{Key: "controller.store/" + strings.TrimPrefix(p.Name, "store "), Kind: "controller.store", Scope: "mesh",
					Severity: health.Urgent, Summary: p.Name + ": " + p.Detail, Evidence: map[string]any{"probe": p.Name, "detail": p.Detail}})
			}
		}
		return out
	}},
	{kind: "controller.broker", eval: func(in *checkInputs) []health.Condition {
		for _, p := range in.probes {
			if p.Name == "broker" && !p.OK {
				return []health.Condition{{Key: "controller.broker", Kind: "controller.broker", Scope: "mesh", Severity: health.Urgent,
					Summary: p.Detail, Evidence: map[string]any{"detail": p.Detail}}}
			}
		}
		return nil
	}},
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// lastBackup is the latest backup heard of a data set, judged as data and
// cleanup judge it.
func (in *checkInputs) lastBackup(node, module, name string) *time.Time {
	return lastBackupHeard(in.snap, in.data, node, module, name)
}

// holderHasData says a new holder (node/module) reports some data present.
func (in *checkInputs) holderHasData(holder string) bool {
	node, module, _ := strings.Cut(holder, "/")
	for _, d := range in.data[node] {
		if d.Module == module && d.Bytes > 0 {
			return true
		}
	}
	return false
}

func reportedSet(sets []inventory.DataSet, module, name string) *inventory.DataSet {
	for i := range sets {
		if sets[i].Module == module && sets[i].Name == name {
			return &sets[i]
		}
	}
	return nil
}

// A crash-looping module is cleared once ready this long, having restarted
// at least crashLoopRestarts times in the hour.
const (
	crashLoopRecovery = time.Minute
	crashLoopRestarts = 3
)

// assignedStates are the reported module states of modules still assigned
// where they run: a module being stopped on its way out is no condition.
func (in *checkInputs) assignedStates() []health.ModuleState {
	var out []health.ModuleState
	for _, m := range in.moduleStates {
		if in.snap.VersionOn(m.Node, m.Module) != "" {
			out = append(out, m)
		}
	}
	return out
}

// moduleStateCondition is a module's condition, with its state as evidence.
func moduleStateCondition(kind, severity string, m health.ModuleState, summary string) health.Condition {
	ev := map[string]any{"state": m.State, "version": m.Version, "since": m.Since.UTC().Format(time.RFC3339), "restarts_1h": m.Restarts1h}
	if m.LastExit != "" {
		ev["last_exit"] = m.LastExit
	}
	if m.Detail != "" {
		ev["detail"] = m.Detail
	}
	if len(m.LogTail) > 0 {
		ev["log_tail"] = m.LogTail
	}
	return health.Condition{Key: kind + "/" + m.Node + "/" + m.Module, Kind: kind, Scope: "module", Machine: m.Node, Module: m.Module,
		Severity: severity, Summary: summary, Evidence: ev}
}

// orNone is s, or "none".
func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// listenerName is what a host names a listener: protocol/port.
var listenerName = regexp.MustCompile(`^(tcp|udp)/[0-9]{1,5}$`)

// mesh's own programs: what they hold is the mesh's, not undeclared.
var meshCommands = []string{"mesh-controller", "mesh-host"}

// unmanagedListeners are a converged node's listeners that no module on it
// declares: reachable from elsewhere (not loopback only), not held by the
// mesh's own programs only, not its SSH port (unless the person had the
// filter close it). An adopted node runs what it runs.
func unmanagedListeners(in *checkInputs, n inventory.Node) []inventory.Found {
	if n.Mode != inventory.Converged || len(in.listeners[n.Name]) == 0 {
		return nil
	}
	if in.portsDeclared == nil {
		// Every node's at once: a check judges every converged node, and
		// reading the assignments once each would grow as their product.
		in.portsDeclared = map[string]map[string]bool{}
		for _, a := range in.snap.Assignments {
			for _, p := range in.snap.Manifests[a.Module][a.Version].Ports {
				if in.portsDeclared[a.Node] == nil {
					in.portsDeclared[a.Node] = map[string]bool{}
				}
				in.portsDeclared[a.Node][fmt.Sprintf("tcp/%d", p.Port)] = true
				in.portsDeclared[a.Node][fmt.Sprintf("udp/%d", p.Port)] = true
			}
		}
	}
	declared := in.portsDeclared[n.Name]
	sshKept := ""
	if f, ok := in.snap.Filters[n.Name]; !ok || !f.CloseSSH {
		ssh, ok := in.sshPorts[n.Name]
		if !ok {
			ssh = nftables.DefaultSSHPort
		}
		sshKept = fmt.Sprintf("tcp/%d", ssh)
	}
	var out []inventory.Found
	for _, l := range in.listeners[n.Name] {
		// A name a host sends is judged before it becomes part of a key.
		if !listenerName.MatchString(l.Name) || declared[l.Name] || l.Name == sshKept || loopbackOnly(l.Addresses) ||
			(len(l.Commands) > 0 && !slices.ContainsFunc(l.Commands, func(c string) bool { return !slices.Contains(meshCommands, c) })) {
			continue
		}
		out = append(out, l)
	}
	return out
}

// What a node's node.unmanaged-listener names of its listeners: the first
// unmanagedShown by protocol and port, each with its first wordsShown
// addresses and holders, each clipped to wordShown bytes; the rest are
// counted. A host chooses what it reports: what it can raise is one
// condition of a bounded size.
const (
	unmanagedShown = 5
	wordsShown     = 4
	wordShown      = 48
)

// unmanagedCondition is a converged node's node.unmanaged-listener: one a
// node, however many listeners, so that a host reporting a thousand raises
// one condition, and one alternating between sets changes it (a change, no
// message) rather than raising and clearing one a listener. Its evidence is
// the count and the first listeners, in a stable order and without what
// moves while the set does not (a holder's pid): the same set reported
// again changes nothing.
func unmanagedCondition(node string, ls []inventory.Found) health.Condition {
	ls = slices.Clone(ls)
	slices.SortFunc(ls, func(a, b inventory.Found) int { return compareListeners(a.Name, b.Name) })
	shown := ls[:min(len(ls), unmanagedShown)]
	said := make([]string, 0, len(shown))
	listed := make([]any, 0, len(shown))
	for _, l := range shown {
		addresses, commands := clipWords(l.Addresses), clipWords(l.Commands)
		at := ""
		if len(addresses) > 0 {
			at = " at " + strings.Join(addresses, " ") + more(len(l.Addresses)-len(addresses))
		}
		said = append(said, fmt.Sprintf("%s%s (%s%s)", l.Name, at, HeldBy(commands), more(len(l.Commands)-len(commands))))
		listed = append(listed, map[string]any{"listener": l.Name, "addresses": addresses, "commands": commands})
	}
	summary := fmt.Sprintf("%s, converged, listens on %s, which no module there declares: stop it, or declare it in a module", node, said[0])
	if len(ls) > 1 {
		summary = fmt.Sprintf("%s, converged, listens on %d ports no module there declares: %s%s: stop them, or declare them in a module",
			node, len(ls), strings.Join(said, "; "), more(len(ls)-len(shown)))
	}
	return health.Condition{Key: "node.unmanaged-listener/" + node, Kind: "node.unmanaged-listener", Scope: "machine", Machine: node,
		Severity: health.Notice, Summary: summary, Evidence: map[string]any{"count": len(ls), "listeners": listed}}
}

// compareListeners orders listener names (protocol/port, judged already)
// by protocol, then port as a number.
func compareListeners(a, b string) int {
	pa, na, _ := strings.Cut(a, "/")
	pb, nb, _ := strings.Cut(b, "/")
	if c := strings.Compare(pa, pb); c != 0 {
		return c
	}
	x, _ := strconv.Atoi(na)
	y, _ := strconv.Atoi(nb)
	return x - y
}

// clipWords is the first wordsShown of words, each cut to wordShown bytes
// (never inside a character); never nil, so that none reads back as it
// was written.
func clipWords(words []string) []string {
	out := make([]string, 0, min(len(words), wordsShown))
	for _, w := range words[:min(len(words), wordsShown)] {
		if len(w) > wordShown {
			w = strings.ToValidUTF8(w[:wordShown], "")
		}
		out = append(out, w)
	}
	return out
}

// more says how many more there are than were named, if any.
func more(n int) string {
	if n <= 0 {
		return ""
	}
	return fmt.Sprintf(" and %d more", n)
}

// loopbackOnly says every address is a loopback one (127.0.0.0/8, ::1):
// reachable from the machine only.
func loopbackOnly(addresses []string) bool {
	if len(addresses) == 0 {
		return false
	}
	for _, a := range addresses {
		ip, err := netip.ParseAddr(strings.Trim(a, "[]"))
		if err != nil || !ip.IsLoopback() {
			return false
		}
	}
	return true
}

// HeldBy names a listener's holders, as a condition and converge say them.
func HeldBy(commands []string) string {
	if len(commands) == 0 {
		return "its holder not visible to the host"
	}
	return "held by " + strings.Join(commands, ", ")
}

// conditionsOf are the conditions of one kind among cs.
func conditionsOf(cs []health.Condition, kind string) []health.Condition {
	var out []health.Condition
	for _, c := range cs {
		if c.Kind == kind {
			out = append(out, c)
		}
	}
	return out
}
