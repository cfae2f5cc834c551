package app

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"mesh-controller/app/protocol"
	"mesh-controller/contexts/health"
	"mesh-controller/contexts/identity"
	"mesh-controller/contexts/inventory"
)

// AlertSubject is where every raising and clearing that is not silenced is
// published, signed (protocol.Alert).
const AlertSubject = protocol.AlertSubject

// CheckOptions shape one run of the self-check.
type CheckOptions struct {
	// Bounds; nil means the defaults.
	Bounds *Bounds
	// FromDurations sets each node's heartbeat bound from its measured intervals.
	FromDurations bool
	// Holder is the serving controller's lease holder, to probe it still holds the lease.
	Holder string
	// NC is the serving controller's broker connection; nil dials the broker.
	NC *nats.Conn
	// Log, if set, receives a line per raising and clearing (doctor run).
	Log func(string)
	// Logger, if set, receives a record per raising and clearing instead,
	// its condition key and severity as attributes (serve's log).
	Logger *slog.Logger
	// Notify, if set, receives each raising and clearing mesh.alert carries,
	// as the JSON of its body (protocol.Alert, unsigned): serve
	// --alert-webhook posts it. It must not wait.
	Notify func(body []byte)
}

// CheckResult is a self-check's verdict and what it changed.
type CheckResult struct {
	Verdict health.Verdict  `json:"verdict"`
	Changes []health.Change `json:"changes"`
	// Open are the conditions open after the check, read for the verdict:
	// the serving controller's healers act on them without reading them
	// again. Not in the JSON, whose verdict counts them.
	Open []health.Condition `json:"-"`
}

// freeFloor is the data dir's free space below which the probe fails.
const freeFloor = 1 << 30

// SelfCheck runs every probe, judges every rule from what the stores and
// signals say, raises and clears conditions accordingly, sends a message for
// each raising and clearing that is not silenced, and records the verdict.
func (c *Health) SelfCheck(ctx context.Context, o CheckOptions) (CheckResult, error) {
	start := time.Now()
	now := c.Now()
	in := &checkInputs{now: now, bounds: DefaultBounds(), declared: map[string]time.Time{}, data: map[string][]inventory.DataSet{}}
	if o.Bounds != nil {
		in.bounds = *o.Bounds
	}
	probe := func(name string, err error, ok string) {
		p := health.Probe{Name: name, OK: err == nil, Detail: ok}
		if err != nil {
			p.Detail = err.Error()
		}
		in.probes = append(in.probes, p)
	}
	st, release := c.checkStores(ctx)
	defer release()
	// failed says why a context's store could not be read: the rules that
	// need it are not judged, and the reason is in the verdict as a probe.
	failed := map[string]error{}
	fail := func(context, what string, err error) {
		if err != nil && failed[context] == nil {
			failed[context] = fmt.Errorf("%s: %w", what, err)
			probe("read "+context, failed[context], "")
		}
	}
	for _, name := range Contexts {
		err := st.Failed(name)
		if err == nil {
			// The open handle is asked, never a second one (sqlite.ErrOpenTwice).
			_, err = st.DB(name).Version(ctx, migrationsOf()[name])
		}
		probe("store "+name, err, "opens, schema current")
		if err != nil {
			failed[name] = err
		}
	}
	if st.Health == nil {
		return CheckResult{}, fmt.Errorf("self-check: the health store: %w", st.Failed("health"))
	}
	hs := st.Health

	// signer signs the alerts; without it none is published.
	var signer *identity.SigningKey
	if ids := st.Identity; ids != nil {
		key, err := ids.SigningKey(ctx)
		if err == nil && !ed25519.Verify(key.Public, []byte("self-check"), key.Sign([]byte("self-check"))) {
			err = errors.New("the signing key does not verify its own signature")
		}
		if err == nil {
			signer = &key
		}
		probe("identity key", err, "present, signs and verifies")
		if o.Holder != "" {
			l, err := ids.Lease(ctx)
			if err == nil && (l == nil || l.Holder != o.Holder) {
				err = errors.New("this process does not hold the lease")
			}
			probe("lease", err, "held by this process")
		}
		cv, err := controllersOf(ctx, ids, now)
		probe("controllers", err, cv.String())
		probe("broker", c.probeBroker(ctx, ids, o.NC), "answers a round trip")
		in.reuses, err = ids.TokenReuses(ctx)
		fail("identity", "read reused tokens", err)
		// A key whose overlap ended is let go here, on serve's timer.
		lines, err := retireKeys(ctx, st, now)
		fail("identity", "retire signing keys", err)
		for _, line := range lines {
			switch {
			case o.Logger != nil:
				o.Logger.Info(line)
			case o.Log != nil:
				o.Log(line)
			}
		}
		in.keyChain, err = ids.KeyChain(ctx)
		fail("identity", "read the chain of signing keys", err)
		in.keyAcks, err = ids.KeyAcks(ctx)
		fail("identity", "read the keys hosts verify with", err)
		in.hostVersions, err = ids.HostVersions(ctx)
		fail("identity", "read the hosts' versions", err)
	}
	var fs syscall.Statfs_t
	err := syscall.Statfs(c.DataDir, &fs)
	free := int64(fs.Bavail) * fs.Bsize
	if err == nil && free < freeFloor {
		err = fmt.Errorf("%d MiB free under %s, below the 1 GiB floor", free>>20, c.DataDir)
	}
	probe("free space", err, fmt.Sprintf("%d MiB free under %s", free>>20, c.DataDir))

	var currentKey string
	if sec := st.Secrets; sec != nil {
		k, kerr := sec.OperatorKey(ctx)
		currentKey = k.Recipient
		in.operatorKey = kerr == nil
		probe("operator key", kerr, "set: keep its private half off the mesh and backed up, with a 'secret export' beside it; without it no secret can be recovered when the mesh is lost")
		var cur int
		cur, in.onlyOlder, err = sec.Recoverable(ctx)
		in.secretCount = cur + in.onlyOlder
		fail("secrets", "count recoverable secrets", err)
	}
	if st.Inventory != nil {
		fail("inventory", "read the inventory", c.readInventory(ctx, st.Inventory, in))
	}
	if lic := st.Licences; lic != nil {
		in.licences, err = lic.List(ctx)
		fail("licences", "read the licences", err)
		in.refreshFailed, err = lic.Failing(ctx)
		fail("licences", "read failed refreshes", err)
		if currentKey != "" {
			_, in.licenceOnlyOlder, err = licenceCopiesSealedTo(ctx, st, currentKey)
			fail("licences", "count licence copies", err)
		}
	}
	in.refusals, err = hs.JoinRefusalsSince(ctx, now.Add(-joinRefusedWindow))
	fail("health", "read refused joins", err)
	in.drops, err = hs.Drops(ctx, "")
	fail("health", "read dropped messages", err)
	in.moduleStates, err = hs.ModuleStates(ctx, "")
	fail("health", "read module states", err)
	if bs := st.Builds; bs != nil {
		// As shown: a condition's summary and evidence are kept and printed.
		in.queue, err = bs.Queue(ctx)
		in.queue = shownAsks(in.queue)
		fail("builds", "read the build queue", err)
		in.latestBuilds, err = bs.LatestByModule(ctx)
		in.latestBuilds = shownAsks(in.latestBuilds)
		fail("builds", "read the latest builds", err)
		in.pausedBuilders, err = bs.Paused(ctx)
		fail("builds", "read paused builders", err)
		in.askedAgain, err = bs.AskedAgain(ctx)
		fail("builds", "read the asks asked again", err)
		ds, err := hs.Durations(ctx, "build", now.Add(-30*24*time.Hour))
		fail("health", "read build durations", err)
		in.buildP99 = map[string]time.Duration{}
		byModule := map[string][]float64{}
		for _, d := range ds {
			byModule[d.Subject] = append(byModule[d.Subject], d.MS)
		}
		for mod, ms := range byModule {
			sort.Float64s(ms)
			in.buildP99[mod] = time.Duration(percentile(ms, 0.99) * float64(time.Millisecond))
		}
	}
	in.brake, err = hs.Brake(ctx)
	fail("health", "read the brake", err)
	in.handActFor = map[string]bool{}
	acts, err := hs.HandActs(ctx, time.Time{})
	fail("health", "read hand acts", err)
	for _, a := range acts {
		if a.Condition != "" {
			in.handActFor[a.Condition] = true
		}
	}
	if o.FromDurations && failed["inventory"] == nil {
		if err := boundsFromDurations(ctx, hs, in); err != nil {
			return CheckResult{}, err
		}
	}

	var found []health.Condition
	evaluated := map[string]bool{}
	for _, r := range rules {
		skip := false
		for _, need := range r.needs {
			skip = skip || failed[need] != nil
		}
		if skip {
			continue
		}
		evaluated[r.kind] = true
		found = append(found, r.eval(in)...)
	}
	changes, err := hs.Reconcile(ctx, found, evaluated, now)
	if err != nil {
		return CheckResult{}, err
	}
	c.alert(o, signer, changes, now)
	open, err := hs.Conditions(ctx)
	if err != nil {
		return CheckResult{}, err
	}
	v := health.Verdict{At: now, OK: true, Probes: in.probes, Open: len(open), TookMS: float64(time.Since(start).Microseconds()) / 1000}
	for _, p := range in.probes {
		v.OK = v.OK && p.OK
	}
	for _, ch := range changes {
		switch ch.Event {
		case "raised":
			v.Raised++
		case "changed":
			v.Changed++
		case "cleared":
			v.Cleared++
		}
	}
	if err := hs.RecordVerdict(ctx, v); err != nil {
		return CheckResult{}, err
	}
	// Measurements and history are kept for a window: whatever is older goes,
	// in small batches, until none is left.
	if _, err := hs.PruneMeasurements(ctx, now.Add(-measurementWindow), now.Add(-heartbeatWindow), pruneBatch); err != nil {
		return CheckResult{Verdict: v, Changes: changes, Open: open}, err
	}
	if _, err := hs.PruneHistory(ctx, now.Add(-historyWindow), pruneBatch); err != nil {
		return CheckResult{Verdict: v, Changes: changes, Open: open}, err
	}
	return CheckResult{Verdict: v, Changes: changes, Open: open}, nil
}

// How long what grows with time is kept, and how much goes per write.
const (
	// measurementWindow: apply and tier durations.
	measurementWindow = 14 * 24 * time.Hour
	// heartbeatWindow: heartbeat aggregates, a row per node and hour (what
	// bounds are set from reads a week).
	heartbeatWindow = 7 * 24 * time.Hour
	// historyWindow: condition history and healer acts.
	historyWindow = 90 * 24 * time.Hour
	pruneBatch    = 1000
)

func (c uses) readInventory(ctx context.Context, inv *inventory.Store, in *checkInputs) error {
	var err error
	if in.nodes, err = inv.Nodes(ctx); err != nil {
		return err
	}
	if in.modules, err = inv.Modules(ctx); err != nil {
		return err
	}
	if in.snap, err = inv.Snapshot(ctx); err != nil {
		return err
	}
	if in.retirements, err = inv.Retirements(ctx, ""); err != nil {
		return err
	}
	if in.declared, err = inv.DeclaredAt(ctx); err != nil {
		return err
	}
	if in.data, err = inv.AllDataSets(ctx); err != nil {
		return err
	}
	if in.resticFacts, err = inv.FactNamed(ctx, protocol.FactRestic); err != nil {
		return err
	}
	if in.filterFacts, err = inv.FactNamed(ctx, protocol.FilterFact); err != nil {
		return err
	}
	if in.silentPeers, err = inv.SilentPeers(ctx); err != nil {
		return err
	}
	if in.keyRefusals, err = inv.KeyRefusals(ctx); err != nil {
		return err
	}
	if in.sshPorts, err = sshPorts(ctx, inv); err != nil {
		return err
	}
	var converged []string
	for _, n := range in.nodes {
		if n.Mode == inventory.Converged {
			converged = append(converged, n.Name)
		}
	}
	if in.listeners, err = inv.ListenersOf(ctx, converged); err != nil {
		return err
	}
	return nil
}

// probeBroker checks the broker answers a round trip: the serving
// controller's own connection, or a person's through the live lease.
func (c uses) probeBroker(ctx context.Context, ids *identity.Store, nc *nats.Conn) error {
	if nc != nil {
		return nc.FlushTimeout(protocol.AnswerTimeout)
	}
	own, err := c.dialBroker(ctx, ids)
	if err != nil {
		return err
	}
	defer own.Close()
	return own.FlushTimeout(protocol.AnswerTimeout)
}

// alert sends a message for each raising and clearing not silenced: on
// mesh.alert, signed with the controller's key in the declaration's
// envelope (so a reader tells the controller's alerts from anything else
// published there), and to the log. Without the key nothing is published.
func (c uses) alert(o CheckOptions, signer *identity.SigningKey, changes []health.Change, now time.Time) {
	published := false
	for _, ch := range changes {
		if (ch.Event != "raised" && ch.Event != "cleared") || ch.Condition.Silenced(now) {
			continue
		}
		switch {
		case o.Logger != nil:
			// Raised is a warning to whoever reads the log by level.
			level := slog.LevelInfo
			if ch.Event == "raised" {
				level = slog.LevelWarn
			}
			o.Logger.Log(context.Background(), level, "alert "+ch.Event, "condition", ch.Condition.Key, "severity", ch.Condition.Severity, "summary", ch.Condition.Summary)
		case o.Log != nil:
			o.Log(fmt.Sprintf("%s %s %s: %s", ch.Event, ch.Condition.Severity, ch.Condition.Key, ch.Condition.Summary))
		}
		if o.Notify != nil {
			if b, err := json.Marshal(alertBody(ch)); err == nil {
				o.Notify(b)
			}
		}
		if o.NC == nil || signer == nil {
			continue
		}
		b, err := sealAlert(ch, *signer)
		if err == nil {
			err = o.NC.Publish(AlertSubject, b)
		}
		if err != nil {
			switch {
			case o.Logger != nil:
				o.Logger.Error("alert not sent", "condition", ch.Condition.Key, "err", err)
			case o.Log != nil:
				o.Log(fmt.Sprintf("alert %s not sent: %v", ch.Condition.Key, err))
			}
			continue
		}
		published = true
	}
	// One round trip for them all, and none when nothing was sent.
	if published {
		o.NC.FlushTimeout(protocol.AnswerTimeout)
	}
}

// sealAlert is a change as mesh.alert carries it (protocol.Alert).
func sealAlert(ch health.Change, key identity.SigningKey) ([]byte, error) {
	env, err := protocol.SealBody(alertBody(ch), key.Sign, key.Fingerprint())
	if err != nil {
		return nil, err
	}
	return json.Marshal(env)
}

// alertBody is the body of a change's alert: the change's own fields and
// the type, flat. health.Change has no MarshalJSON of its own, which
// embedding would promote (dropping Type).
func alertBody(ch health.Change) any {
	return struct {
		health.Change
		Type     string `json:"type"`
		Protocol string `json:"protocol"`
	}{ch, protocol.AlertType, protocol.Version}
}

// boundsFromDurations sets each node's heartbeat bound from its measured
// intervals: three times their p99, never below the default.
func boundsFromDurations(ctx context.Context, hs *health.Store, in *checkInputs) error {
	per, err := hs.Heartbeats(ctx, in.now.Add(-7*24*time.Hour))
	if err != nil {
		return fmt.Errorf("read heartbeat intervals: %w", err)
	}
	in.bounds.Heartbeat = map[string]time.Duration{}
	for _, n := range in.nodes {
		h := per[n.Name]
		if h.Count < 10 {
			continue
		}
		measured := time.Duration(3 * h.Quantile(0.99) * float64(time.Millisecond))
		def := time.Duration(in.bounds.HeartbeatFactor * n.HeartbeatIntervalS * float64(time.Second))
		in.bounds.Heartbeat[n.Name] = max(measured, def)
	}
	return nil
}

// percentile of sorted values (nearest rank).
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.5) - 1
	i = min(max(i, 0), len(sorted)-1)
	return sorted[i]
}
