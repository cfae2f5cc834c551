package app

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"mesh-controller/app/protocol"
	"mesh-controller/contexts/health"
	"mesh-controller/contexts/identity"
	"mesh-controller/contexts/inventory"
	"mesh-controller/contexts/licences"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func ptr[T any](v T) *T { return &v }

func ruleOf(t *testing.T, kind string) rule {
	t.Helper()
	for _, r := range rules {
		if r.kind == kind {
			return r
		}
	}
	t.Fatalf("no rule %s", kind)
	return rule{}
}

func emptySnap() *inventory.Snapshot {
	return &inventory.Snapshot{Manifests: map[string]map[string]inventory.Manifest{}}
}

func inputs(mut func(in *checkInputs)) *checkInputs {
	in := &checkInputs{now: t0, bounds: DefaultBounds(), snap: emptySnap(), declared: map[string]time.Time{}, data: map[string][]inventory.DataSet{}}
	mut(in)
	return in
}

// raiseChangeClear judges a rule on three states of the mesh: it must raise
// a condition on the first, change it (same key, other summary or severity
// or evidence) on the second, and find nothing on the third.
func raiseChangeClear(t *testing.T, kind, key string, raise, change, clear *checkInputs) {
	t.Helper()
	r := ruleOf(t, kind)
	first := r.eval(raise)
	if len(first) != 1 || first[0].Key != key || first[0].Kind != kind || first[0].Summary == "" {
		t.Fatalf("raise: %+v", first)
	}
	second := r.eval(change)
	if len(second) != 1 || second[0].Key != key {
		t.Fatalf("change: %+v", second)
	}
	a, _ := evidenceText(first[0])
	b, _ := evidenceText(second[0])
	if first[0].Summary == second[0].Summary && first[0].Severity == second[0].Severity && a == b {
		t.Fatalf("change: nothing changed: %+v", second[0])
	}
	if got := r.eval(clear); len(got) != 0 {
		t.Fatalf("clear: %+v", got)
	}
	// Judging the same state twice finds the same thing: a check changes nothing by itself.
	again := r.eval(raise)
	x, _ := evidenceText(again[0])
	if again[0].Summary != first[0].Summary || x != a {
		t.Fatalf("not stable: %+v vs %+v", first[0], again[0])
	}
}

func evidenceText(c health.Condition) (string, error) {
	s := ""
	for _, k := range []string{"last_heard", "serial", "serial_declared", "count", "error", "moved_commit", "only_older_keys", "secrets", "backup_holder", "last_backup", "retired_at", "why", "detail", "bound_s", "expires", "waiting"} {
		if v, ok := c.Evidence[k]; ok {
			s += k + "=" + toString(v) + ";"
		}
	}
	return s, nil
}

func toString(v any) string { return fmtAny(v) }

func joined(name string, heard time.Time, interval float64) inventory.Node {
	return inventory.Node{Name: name, JoinedAt: ptr(t0.Add(-time.Hour)), LastHeard: &heard, HeartbeatIntervalS: interval}
}

func TestRule_NodeSilent(t *testing.T) {
	raiseChangeClear(t, "node.silent", "node.silent/web1",
		inputs(func(in *checkInputs) { in.nodes = []inventory.Node{joined("web1", t0.Add(-31*time.Second), 10)} }),
		inputs(func(in *checkInputs) { in.nodes = []inventory.Node{joined("web1", t0.Add(-50*time.Second), 10)} }),
		inputs(func(in *checkInputs) { in.nodes = []inventory.Node{joined("web1", t0.Add(-29*time.Second), 10)} }))
}

func TestRule_NodeBehind(t *testing.T) {
	behind := func(applied, declared int64, issued time.Time) *checkInputs {
		return inputs(func(in *checkInputs) {
			n := joined("web1", t0, 10)
			n.SerialApplied, n.SerialDeclared = applied, declared
			in.nodes = []inventory.Node{n}
			in.declared["web1"] = issued
		})
	}
	raiseChangeClear(t, "node.behind", "node.behind/web1",
		behind(1, 2, t0.Add(-3*time.Minute)), behind(1, 3, t0.Add(-5*time.Minute)), behind(3, 3, t0.Add(-5*time.Minute)))
	if got := ruleOf(t, "node.behind").eval(behind(1, 2, t0.Add(-time.Minute))); len(got) != 0 {
		t.Fatalf("raised within the apply bound: %+v", got)
	}
}

func TestRule_NodeApplyFailed(t *testing.T) {
	failed := func(serial, applied int64, msg string, ok bool) *checkInputs {
		return inputs(func(in *checkInputs) {
			n := joined("web1", t0, 10)
			n.SerialApplied = applied
			n.LastOutcome = &inventory.Outcome{Serial: serial, OK: ok, Error: msg, At: t0}
			in.nodes = []inventory.Node{n}
		})
	}
	raiseChangeClear(t, "node.apply-failed", "node.apply-failed/web1",
		failed(2, 1, "disk full", false), failed(3, 1, "disk still full", false), failed(3, 3, "", true))
}

func TestRule_NodeFilterRolledBack(t *testing.T) {
	filter := func(state, why string) *checkInputs {
		return inputs(func(in *checkInputs) {
			in.nodes = []inventory.Node{joined("web1", t0, 10)}
			in.filterFacts = map[string]inventory.Fact{"web1": {Name: "filter", Value: state, Why: why}, "gone": {Name: "filter", Value: "rolled-back"}}
		})
	}
	raiseChangeClear(t, "node.filter-rolled-back", "node.filter-rolled-back/web1",
		filter("rolled-back", "declaration 3's filter rolled back"), filter("rolled-back", "declaration 4's filter rolled back"),
		filter("kept", "declaration 5's filter applied and kept"))
	if got := ruleOf(t, "node.filter-rolled-back").eval(filter("removed", "")); len(got) != 0 {
		t.Fatalf("raised with the filter removed: %+v", got)
	}
}

func TestRule_NodeOverlayPeerSilent(t *testing.T) {
	heard := t0.Add(-10 * time.Minute)
	silent := func(last *time.Time, gone bool) *checkInputs {
		return inputs(func(in *checkInputs) {
			in.nodes = []inventory.Node{joined("web1", t0, 10)}
			if !gone {
				in.silentPeers = []inventory.SilentPeer{{Node: "web1", Peer: "relay1", Since: t0, LastHandshake: last}}
			}
		})
	}
	raiseChangeClear(t, "node.overlay-peer-silent", "node.overlay-peer-silent/web1/relay1",
		silent(nil, false), silent(&heard, false), silent(nil, true))
	got := ruleOf(t, "node.overlay-peer-silent").eval(silent(&heard, false))
	if got[0].Severity != health.Warning || got[0].Machine != "web1" || !strings.Contains(got[0].Summary, "for over 3m0s (last at ") {
		t.Errorf("%+v", got[0])
	}
}

// overlay.key-conflict: a key refused when reported names the node and
// the holder; so do two nodes recorded with one key (the later left out);
// gone once the node reports a key of its own.
func TestRule_OverlayKeyConflict(t *testing.T) {
	refused := func(holder string, gone bool) *checkInputs {
		return inputs(func(in *checkInputs) {
			in.nodes = []inventory.Node{joined("c1", t0, 10)}
			if !gone {
				in.keyRefusals = []inventory.KeyRefusal{{Node: "c1", Holder: holder, Key: wgKey(holder), Since: t0}}
			}
		})
	}
	raiseChangeClear(t, "overlay.key-conflict", "overlay.key-conflict/c1", refused("a1", false), refused("b1", false), refused("a1", true))
	got := ruleOf(t, "overlay.key-conflict").eval(refused("a1", false))
	if c := got[0]; c.Severity != health.Urgent || c.Machine != "c1" || c.Evidence["holder"] != "a1" ||
		!strings.HasPrefix(c.Summary, "c1's host reported the WireGuard key a1 holds: a1 keeps it, and c1 is out of the overlay") {
		t.Errorf("%+v", c)
	}
	recorded := inputs(func(in *checkInputs) {
		in.snap.Overlay = inventory.Overlay{Prefix6: "fd12:3456:789a::/48", Nodes: []inventory.OverlayNode{
			{Name: "a1", Index: 2, Key: wgKey("a1")}, {Name: "b1", Index: 1, Key: wgKey("a1")}, {Name: "c1", Index: 3, Key: wgKey("c1")}}}
	})
	if got := ruleOf(t, "overlay.key-conflict").eval(recorded); len(got) != 1 || got[0].Key != "overlay.key-conflict/a1" || got[0].Evidence["holder"] != "b1" {
		t.Errorf("two recorded with one key: %+v", got)
	}
}

// overlay.peer-refused: a record its host's rules refuse (an endpoint
// written behind overlay place's check) leaves the peer out of the other
// node's part, and says so; a sound record clears it.
func TestRule_OverlayPeerRefused(t *testing.T) {
	placed := func(endpoint string) *checkInputs {
		return inputs(func(in *checkInputs) {
			in.snap.Overlay = inventory.Overlay{Prefix6: "fd12:3456:789a::/48", Nodes: []inventory.OverlayNode{
				{Name: "pub1", Index: 1, Key: wgKey("pub1"), Placement: inventory.Placement{Endpoint: "203.0.113.1:51820", Reach: inventory.Public}},
				{Name: "pub3", Index: 3, Key: wgKey("pub3"), Placement: inventory.Placement{Endpoint: endpoint, Reach: inventory.Public}}}}
		})
	}
	raiseChangeClear(t, "overlay.peer-refused", "overlay.peer-refused/pub1/pub3", placed("nowhere"), placed("elsewhere"), placed("203.0.113.3:51820"))
	got := ruleOf(t, "overlay.peer-refused").eval(placed("nowhere"))
	if c := got[0]; c.Severity != health.Warning || c.Machine != "pub1" || c.Evidence["peer"] != "pub3" || !strings.Contains(c.Summary, `endpoint "nowhere" is not host:port`) {
		t.Errorf("%+v", c)
	}
}

func TestRule_NodeBadSignature(t *testing.T) {
	drops := func(n int64, last time.Time) *checkInputs {
		return inputs(func(in *checkInputs) {
			in.drops = []health.Drop{{Node: "web1", Reason: "bad signature", Count: n, LastAt: last}, {Node: "web2", Reason: "unknown sender", Count: 9, LastAt: t0}}
		})
	}
	raiseChangeClear(t, "node.bad-signature", "node.bad-signature/web1", drops(1, t0), drops(4, t0), drops(4, t0.Add(-25*time.Hour)))
}

func TestRule_NodeProtocolMismatch(t *testing.T) {
	heard := func(protocols ...string) *checkInputs {
		return inputs(func(in *checkInputs) {
			for i, p := range protocols {
				in.hostVersions = append(in.hostVersions, identity.HostVersion{Node: fmt.Sprintf("web%d", i+1), Version: "v9", Protocol: p})
			}
		})
	}
	major := fmt.Sprintf("%d.0", must(protocol.ParseVersion(protocol.Version)).Major+1)
	// web1 speaks a major this controller does not, then a later one; web2
	// was never heard by a controller that records it; then web1 is heard
	// speaking this controller's own.
	raiseChangeClear(t, "node.protocol-mismatch", "node.protocol-mismatch/web1", heard(major, ""), heard("0.1", ""), heard(protocol.Version, ""))
	c := ruleOf(t, "node.protocol-mismatch").eval(heard(major))[0]
	if want := fmt.Sprintf("the host speaks protocol %s, this controller %s", major, protocol.Version); !strings.Contains(c.Summary, want) ||
		!strings.HasSuffix(c.Summary, "upgrade the controller") || c.Severity != health.Urgent || c.Evidence["host_protocol"] != major {
		t.Errorf("%+v", c)
	}
	if got := ruleOf(t, "node.protocol-mismatch").eval(heard(protocol.Unversioned)); protocol.Version == "1.1" && len(got) != 0 {
		t.Errorf("a host heard unversioned (1.0) under 1.1: %+v", got)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestRule_TokenReused(t *testing.T) {
	reuse := func(n int, last time.Time) *checkInputs {
		return inputs(func(in *checkInputs) { in.reuses = []identity.TokenReuse{{Node: "web1", Count: n, LastAt: last}} })
	}
	raiseChangeClear(t, "token.reused", "token.reused/web1", reuse(1, t0), reuse(2, t0), reuse(2, t0.Add(-25*time.Hour)))
}

func TestRule_JoinRefused(t *testing.T) {
	refused := func(unknown, used int64, last time.Time) *checkInputs {
		return inputs(func(in *checkInputs) {
			in.refusals = []health.JoinRefusals{
				{Source: "192.0.2.7", Reason: "unknown token", Count: unknown, FirstAt: last.Add(-time.Minute), LastAt: last},
				{Source: "192.0.2.7", Reason: "used token", Count: used, FirstAt: last.Add(-time.Minute), LastAt: last},
				{Source: "192.0.2.8", Reason: "unknown token", Count: 3, FirstAt: last, LastAt: last},
			}
		})
	}
	raiseChangeClear(t, "join.refused", "join.refused/192.0.2.7",
		refused(300, 1, t0), refused(400, 1, t0), refused(400, 1, t0.Add(-11*time.Minute)))
	c := ruleOf(t, "join.refused").eval(refused(300, 1, t0))[0]
	if c.Evidence["count"] != int64(301) || c.Evidence["source"] != "192.0.2.7" || c.Severity != health.Warning ||
		c.Summary != "301 joins from 192.0.2.7 refused within 10m0s (300 unknown token, 1 used token)" {
		t.Fatalf("%+v", c)
	}
	if got := ruleOf(t, "join.refused").eval(refused(9, 1, t0)); len(got) != 0 {
		t.Fatalf("raised for 10 refusals: %+v", got)
	}
}

func TestRule_ModuleBehindSource(t *testing.T) {
	mod := func(moved, commit string) *checkInputs {
		return inputs(func(in *checkInputs) {
			in.modules = []inventory.Module{{Name: "paperless", MovedCommit: moved, Commit: commit, CurrentVersion: "1.0.0"}}
		})
	}
	raiseChangeClear(t, "module.behind-source", "module.behind-source/paperless", mod("abc", ""), mod("def", ""), mod("def", "def"))
}

func TestRule_SecretOperatorKeys(t *testing.T) {
	raiseChangeClear(t, "secret.no-operator-key", "secret.no-operator-key",
		inputs(func(in *checkInputs) { in.secretCount = 2 }),
		inputs(func(in *checkInputs) { in.secretCount = 3 }),
		inputs(func(in *checkInputs) { in.secretCount, in.operatorKey = 3, true }))
	raiseChangeClear(t, "secret.old-operator-key", "secret.old-operator-key",
		inputs(func(in *checkInputs) { in.onlyOlder = 2 }),
		inputs(func(in *checkInputs) { in.onlyOlder = 1 }),
		inputs(func(in *checkInputs) { in.onlyOlder = 0 }))
	raiseChangeClear(t, "secret.old-operator-key", "secret.old-operator-key",
		inputs(func(in *checkInputs) { in.licenceOnlyOlder = 2 }),
		inputs(func(in *checkInputs) { in.onlyOlder, in.licenceOnlyOlder = 1, 2 }),
		inputs(func(in *checkInputs) { in.licenceOnlyOlder = 0 }))
}

func meshWithData(backup *time.Time, withHolder bool, cadence string) *checkInputs {
	return inputs(func(in *checkInputs) {
		in.snap.Manifests["paperless"] = map[string]inventory.Manifest{"1.0.0": {Module: "paperless", Version: "1.0.0",
			Data: []inventory.DataSpec{{Name: "media", Path: "/m", Precious: inventory.Irreplaceable, Backup: inventory.DataBackup{Every: cadence}}, {Name: "index", Path: "/i", Precious: inventory.Rebuildable}}}}
		in.snap.Assignments = []inventory.Assignment{{Node: "web1", Module: "paperless", Version: "1.0.0"}}
		if withHolder {
			in.snap.Manifests["backup"] = map[string]inventory.Manifest{"1.0.0": {Module: "backup", Version: "1.0.0", Seats: []inventory.Seat{{Seat: "backup"}}}}
			in.snap.Assignments = append(in.snap.Assignments, inventory.Assignment{Node: "nas1", Module: "backup", Version: "1.0.0"})
			// The seat's holder, not every assignment that could hold it (issue 12, item 10).
			in.snap.Seats.Holders = map[string][]inventory.Holder{"backup": {{Node: "nas1", Module: "backup"}}}
		}
		in.data["web1"] = []inventory.DataSet{{Module: "paperless", Name: "media", Path: "/m", LastBackup: backup}}
	})
}

func TestRule_DataNoBackup(t *testing.T) {
	raiseChangeClear(t, "data.no-backup", "data.no-backup/web1/paperless/media",
		meshWithData(nil, false, "daily"), meshWithData(nil, true, "daily"), meshWithData(ptr(t0), true, "daily"))
}

func TestRule_DataBackupStale(t *testing.T) {
	raiseChangeClear(t, "data.backup-stale", "data.backup-stale/web1/paperless/media",
		meshWithData(ptr(t0.Add(-49*time.Hour)), true, "daily"), meshWithData(ptr(t0.Add(-72*time.Hour)), true, "daily"),
		meshWithData(ptr(t0.Add(-47*time.Hour)), true, "daily"))
}

func TestRule_DataRetiredWaiting(t *testing.T) {
	retired := func(state string, at time.Time) *checkInputs {
		return inputs(func(in *checkInputs) {
			in.retirements = []inventory.Retirement{{Node: "web1", Module: "paperless", DataSet: "media", State: state, RetiredAt: at, Precious: inventory.Irreplaceable}}
		})
	}
	raiseChangeClear(t, "data.retired-waiting", "data.retired-waiting/web1/paperless/media",
		retired("retired", t0.Add(-31*24*time.Hour)), retired("retired", t0.Add(-40*24*time.Hour)), retired("deleted", t0.Add(-40*24*time.Hour)))
}

func TestRule_HealersBrake(t *testing.T) {
	raiseChangeClear(t, "healers.brake", "healers.brake",
		inputs(func(in *checkInputs) { in.brake = health.Brake{Engaged: true, EngagedAt: ptr(t0), Why: "11 acts"} }),
		inputs(func(in *checkInputs) { in.brake = health.Brake{Engaged: true, EngagedAt: ptr(t0), Why: "12 acts"} }),
		inputs(func(in *checkInputs) { in.brake = health.Brake{} }))
}

func TestRule_ControllerProbes(t *testing.T) {
	probes := func(ps ...health.Probe) *checkInputs { return inputs(func(in *checkInputs) { in.probes = ps }) }
	raiseChangeClear(t, "controller.store", "controller.store/secrets",
		probes(health.Probe{Name: "store secrets", Detail: "file is not a SQLite database"}),
		probes(health.Probe{Name: "store secrets", Detail: "schema is behind"}),
		probes(health.Probe{Name: "store secrets", OK: true}))
	raiseChangeClear(t, "controller.broker", "controller.broker",
		probes(health.Probe{Name: "broker", Detail: "no controller is serving"}),
		probes(health.Probe{Name: "broker", Detail: "connection refused"}),
		probes(health.Probe{Name: "broker", OK: true}))
}

// Every kind in the catalogue whose subject exists has a rule.
func TestRules_Catalogue(t *testing.T) {
	for _, kind := range []string{"node.silent", "node.behind", "node.apply-failed", "node.filter-rolled-back", "node.overlay-peer-silent", "overlay.key-conflict", "overlay.peer-refused", "node.bad-signature", "node.protocol-mismatch", "token.reused", "module.behind-source",
		"data.no-backup", "data.backup-stale", "data.backup-failed", "data.restore-unverified", "data.no-backup-tool", "data.retired-waiting", "secret.no-operator-key", "secret.old-operator-key",
		"healers.brake", "controller.store", "controller.broker", "data.empty-replacement", "retire.rejected", "join.refused", "licence.expiring", "licence.unheld", "node.retired-key", "node.key-refused"} {
		ruleOf(t, kind)
	}
}

func fmtAny(v any) string { return fmt.Sprint(v) }

func TestRule_DataEmptyReplacement(t *testing.T) {
	repl := func(data string, acted bool, bytes int64) *checkInputs {
		return inputs(func(in *checkInputs) {
			in.snap.Seats.Replacements = []inventory.Replacement{{ID: 7, What: "seat backup", NewHolder: "nas2/backup", OldHolder: "nas1/backup", Data: data, At: t0}}
			in.handActFor = map[string]bool{"data.empty-replacement/7": acted}
			in.data["nas2"] = []inventory.DataSet{{Module: "backup", Name: "repository", Bytes: bytes}}
		})
	}
	raiseChangeClear(t, "data.empty-replacement", "data.empty-replacement/7",
		repl("repository (1 GiB)", false, 0), repl("repository (2 GiB)", false, 0), repl("repository (2 GiB)", true, 0))
	if got := ruleOf(t, "data.empty-replacement").eval(repl("x", false, 10)); len(got) != 0 {
		t.Fatalf("raised though the data is there: %+v", got)
	}
}

func TestRule_RetireRejected(t *testing.T) {
	consumer := func(state, why string) *checkInputs {
		return inputs(func(in *checkInputs) {
			in.snap.Seats.Consumers = []inventory.Consumer{{Provider: inventory.Holder{Node: "db1", Module: "postgres"}, Consumer: "web1/paperless", Provision: "postgres", State: state, Why: why, Since: t0}}
		})
	}
	raiseChangeClear(t, "retire.rejected", "retire.rejected/db1/postgres/web1:paperless",
		consumer("rejected", "still needed"), consumer("rejected", "still needed by the audit"), consumer("retired", "ok"))
}

func TestRule_LicenceExpiring(t *testing.T) {
	lic := func(expires time.Time, refreshable bool) *checkInputs {
		return inputs(func(in *checkInputs) {
			in.licences = []licences.Licence{{Name: "translation", Provider: "deepl", Version: 1, Expires: &expires, Refreshable: refreshable}}
		})
	}
	raiseChangeClear(t, "licence.expiring", "licence.expiring/translation",
		lic(t0.Add(6*24*time.Hour), false), lic(t0.Add(-time.Hour), false), lic(t0.Add(8*24*time.Hour), false))
	if got := ruleOf(t, "licence.expiring").eval(lic(t0.Add(time.Hour), true)); len(got) != 0 {
		t.Fatalf("a refreshable licence is refreshed, not said to expire: %+v", got)
	}
}

func TestRule_LicenceUnheld(t *testing.T) {
	mesh := func(needers []string, holders ...string) *checkInputs {
		return inputs(func(in *checkInputs) {
			in.snap.Manifests["app"] = map[string]inventory.Manifest{"1.0.0": {Module: "app", Version: "1.0.0", Licences: []inventory.LicenceNeed{{Name: "translation"}}}}
			for _, n := range needers {
				in.snap.Assignments = append(in.snap.Assignments, inventory.Assignment{Node: n, Module: "app", Version: "1.0.0"})
			}
			l := licences.Licence{Name: "translation", Provider: "deepl", Version: 1}
			for _, h := range holders {
				l.Holders = append(l.Holders, licences.Holder{Node: h, Module: "app"})
			}
			in.licences = []licences.Licence{l}
		})
	}
	raiseChangeClear(t, "licence.unheld", "licence.unheld/translation",
		mesh([]string{"web1", "web2"}), mesh([]string{"web1", "web2"}, "web1"), mesh([]string{"web1", "web2"}, "web1", "web2"))
}

func TestRule_LicenceRefreshFailed(t *testing.T) {
	failed := func(at time.Time, failing bool) *checkInputs {
		return inputs(func(in *checkInputs) {
			in.licences = []licences.Licence{{Name: "chat", Provider: "openai", Version: 3, Refreshable: true, ManagerNode: "web1", ManagerModule: "mgr"}}
			if failing {
				in.refreshFailed = map[string]time.Time{"chat": at}
			}
		})
	}
	raiseChangeClear(t, "licence.refresh-failed", "licence.refresh-failed/chat",
		failed(t0, true), failed(t0.Add(time.Minute), true), failed(t0, false))
}

// withState is meshWithData with web1's media's backup state.
func withState(st inventory.BackupState) *checkInputs {
	in := meshWithData(ptr(t0.Add(-time.Hour)), true, "daily")
	in.snap.Seats.BackupStates = map[string]inventory.BackupState{"web1/paperless/media": st}
	return in
}

func TestRule_DataBackupFailed(t *testing.T) {
	raiseChangeClear(t, "data.backup-failed", "data.backup-failed/web1/paperless/media",
		withState(inventory.BackupState{AttemptAt: ptr(t0), AttemptWhy: "its host did not answer: it is away"}),
		withState(inventory.BackupState{AttemptAt: ptr(t0.Add(time.Hour)), AttemptWhy: "restic backup: no space left on device"}),
		withState(inventory.BackupState{AttemptAt: ptr(t0.Add(2 * time.Hour)), AttemptOK: true}))
}

func TestRule_DataRestoreUnverified(t *testing.T) {
	day := 24 * time.Hour
	raiseChangeClear(t, "data.restore-unverified", "data.restore-unverified/web1/paperless/media",
		// never drilled, first backed up more than seven days ago
		withState(inventory.BackupState{FirstBackup: ptr(t0.Add(-8 * day))}),
		// a drill failed since the last that passed (a tampered repository)
		withState(inventory.BackupState{FirstBackup: ptr(t0.Add(-8 * day)), VerifiedAt: ptr(t0.Add(-2 * day)), DrillAt: ptr(t0.Add(-day)), DrillWhy: "pack 1f… is damaged"}),
		// a drill passed lately
		withState(inventory.BackupState{FirstBackup: ptr(t0.Add(-8 * day)), VerifiedAt: ptr(t0.Add(-day)), DrillAt: ptr(t0.Add(-day)), DrillOK: true}))
	// A first backup a day old is not yet due a drill.
	if got := ruleOf(t, "data.restore-unverified").eval(withState(inventory.BackupState{FirstBackup: ptr(t0.Add(-day))})); len(got) != 0 {
		t.Fatalf("raised a day after the first backup: %+v", got)
	}
}

func TestRule_DataNoBackupTool(t *testing.T) {
	tool := func(version, why string, precious bool) *checkInputs {
		in := meshWithData(ptr(t0), true, "daily")
		in.resticFacts = map[string]inventory.Fact{"web1": {Name: "restic", Value: version, Why: why}}
		if !precious {
			in.snap.Manifests["paperless"]["1.0.0"].Data[0].Precious = inventory.Rebuildable
		}
		return in
	}
	raiseChangeClear(t, "data.no-backup-tool", "data.no-backup-tool/web1",
		tool("", "restic not found on PATH", true), tool("", "restic version: exec format error", true), tool("0.14.0", "restic version", true))
	if got := ruleOf(t, "data.no-backup-tool").eval(tool("", "restic not found on PATH", false)); len(got) != 0 {
		t.Fatalf("raised on a node with nothing the mesh backs up: %+v", got)
	}
}

// Retired precious data keeps its line and its conditions until a person
// deletes it; the backup holder's own data sets have none.
func TestRule_DataNoBackupRetired(t *testing.T) {
	in := meshWithData(nil, true, "daily")
	in.snap.Assignments = in.snap.Assignments[1:] // paperless unassigned from web1
	in.snap.Current = map[string]string{"paperless": "1.0.0"}
	in.snap.Manifests["backup"]["1.0.0"] = inventory.Manifest{Module: "backup", Version: "1.0.0", Seats: []inventory.Seat{{Seat: "backup"}},
		Data: []inventory.DataSpec{{Name: "repository", Path: "/srv/r", Precious: inventory.Irreplaceable}}}
	in.snap.Seats.Retired = []inventory.Retirement{{Node: "web1", Module: "paperless", DataSet: "media", Path: "/m", Precious: inventory.Irreplaceable, State: "retired"}}
	got := ruleOf(t, "data.no-backup").eval(in)
	if len(got) != 1 || got[0].Key != "data.no-backup/web1/paperless/media" || !strings.Contains(got[0].Summary, "retired data") {
		t.Fatalf("retired data with no backup: %+v", got)
	}
}

// Every view reads the same last backup: a backup the holder reported (and
// no data report says) is heard by the signals status and doctor signals
// show, as by data and cleanup, and so is a retired set's.
func TestBackupSignals_ReadWhatDataReads(t *testing.T) {
	in := meshWithData(nil, true, "daily")
	in.snap.Seats.Backups = map[string]time.Time{"web1/paperless/media": t0.Add(-time.Hour)}
	sigs := backupSignals(in.snap, in.data, t0)
	if len(sigs) != 1 || sigs[0].Subject != "web1/paperless/media" || sigs[0].Last == nil || sigs[0].Quiet {
		t.Fatalf("signals %+v", sigs)
	}
	if got := lastBackupHeard(in.snap, in.data, "web1", "paperless", "media"); got == nil || !got.Equal(*sigs[0].Last) {
		t.Fatalf("data reads %v, the signal %v", got, sigs[0].Last)
	}
	in.snap.Assignments = in.snap.Assignments[1:]
	in.snap.Current = map[string]string{"paperless": "1.0.0"}
	in.snap.Seats.Retired = []inventory.Retirement{{Node: "web1", Module: "paperless", DataSet: "media", Path: "/m", Precious: inventory.Irreplaceable, State: "retired"}}
	if sigs := backupSignals(in.snap, in.data, t0); len(sigs) != 1 || sigs[0].Last == nil {
		t.Fatalf("a retired set's signal: %+v", sigs)
	}
}

// keyChainOf is a chain of n rotations whose overlaps ended at ends[i]
// (the keys are made up: the rules read ids, not signatures).
func keyChainOf(ends ...time.Time) []identity.KeyLink {
	var out []identity.KeyLink
	for i, end := range ends {
		k := func(b byte) []byte { x := make([]byte, 32); x[0] = b; return x }
		out = append(out, identity.KeyLink{Sequence: int64(i + 1), OldKey: k(byte(i)), NewKey: k(byte(i + 1)), OverlapUntil: end})
	}
	return out
}

func TestRule_NodeRetiredKey(t *testing.T) {
	chain := keyChainOf(t0.Add(-48*time.Hour), t0.Add(-time.Hour))
	on := func(link int) *checkInputs {
		return inputs(func(in *checkInputs) {
			in.keyChain = chain
			var key string
			if link == len(chain) {
				key = keyShown(chain[link-1].NewKey).Fingerprint
			} else {
				key = keyShown(chain[link].OldKey).Fingerprint
			}
			in.keyAcks = []identity.KeyAck{{Node: "web1", Key: key, AckedAt: t0.Add(-72 * time.Hour)}}
		})
	}
	raiseChangeClear(t, "node.retired-key", "node.retired-key/web1", on(0), on(1), on(2))
	// Within the overlap the key before is not retired.
	overlapping := inputs(func(in *checkInputs) {
		in.keyChain = keyChainOf(t0.Add(time.Hour))
		in.keyAcks = []identity.KeyAck{{Node: "web1", Key: keyShown(in.keyChain[0].OldKey).Fingerprint}}
	})
	if got := ruleOf(t, "node.retired-key").eval(overlapping); len(got) != 0 {
		t.Fatalf("raised within the overlap: %+v", got)
	}
}

func TestRule_NodeKeyRefused(t *testing.T) {
	refused := func(why string, at time.Time) *checkInputs {
		return inputs(func(in *checkInputs) {
			in.keyAcks = []identity.KeyAck{{Node: "web1", Key: "aaaa-bbbb-cccc-dddd", Refused: why, RefusedAt: &at}}
		})
	}
	raiseChangeClear(t, "node.key-refused", "node.key-refused/web1",
		refused("link 2 is not signed by its old key", t0.Add(-time.Hour)), refused("link 3 follows link 1", t0.Add(-time.Minute)),
		refused("link 3 follows link 1", t0.Add(-48*time.Hour)))
}
