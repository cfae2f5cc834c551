package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"mesh-controller/app/archive"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/health"
	"mesh-controller/contexts/identity"
	"mesh-controller/contexts/inventory"
	"mesh-controller/embedded/broker"
)

// What one report may carry: a host sending more is refused and counted,
// so no report can grow a store by more than these.
const (
	maxTiers    = 16
	maxFacts    = 256
	maxFound    = 1024
	maxDataSets = 10000
	maxDeleted  = 10000
	maxTextLen  = 1024
)

// How joins wait. The broker keeps the way back for a join's answer for
// protocol.JoinAnswerWithin (embedded/broker.JoinUser.AnswerWithin): a request
// unanswered holds that much of the broker's memory for that long, so under
// a flood it is kept short. A join that waited in the queue longer than
// joinStale is answered busy rather than admitted, so no host is admitted
// (its token used) once its answer might no longer reach it; joinQueue holds
// about as many as the worker admits in that time, and past it a request is
// answered busy at once. A host that is answered busy asks again.
const (
	joinStale = protocol.JoinAnswerWithin * 3 / 5
	joinQueue = 2048
)

// queued is a request (a join, an ask) and when it arrived.
type queued struct {
	m  *nats.Msg
	at time.Time
}

// busyReply is the answer to a join the worker has no room or time for,
// made once: under a flood it is the answer most requests get.
var busyReply, _ = json.Marshal(protocol.JoinReply{Error: protocol.JoinBusy, Protocol: protocol.Version})

// answerBusy answers a join busy, through the admit account's service only.
func (d *daemon) answerBusy(m *nats.Msg) {
	d.o.Counters.Dropped.Add(1)
	d.o.Metrics.Drop("join busy")
	if strings.HasPrefix(m.Reply, joinReplyPrefix) {
		m.Respond(busyReply)
	}
}

// RevokedSubject is where a person's command tells the serving controller
// that users were revoked; only controller users may publish under mesh.control.
const RevokedSubject = "mesh.control.revoked"

func (d *daemon) subscribe(ctx context.Context) error {
	subs := map[string]nats.MsgHandler{
		protocol.NodeWildcard(protocol.Heartbeat):   d.onHeartbeat,
		protocol.NodeWildcard(protocol.FactsReport): d.onFacts,
		protocol.NodeWildcard(protocol.Applied):     d.onApplied,
		protocol.NodeWildcard(protocol.DataReport):  d.onData,
		// Asks wait in a bounded queue for the ask workers: ten thousand
		// hosts back at once ask together (see askStale).
		protocol.NodeWildcard(protocol.DeclarationAsk): func(m *nats.Msg) {
			select {
			case d.asks <- queued{m: m, at: time.Now()}:
			default:
				d.o.Counters.Dropped.Add(1) // its host asks again
				d.o.Metrics.Drop("asks queue full")
			}
		},
		protocol.NodeWildcard(protocol.BackupReport): d.onBackup,
		RevokedSubject: d.onRevoked,
		// A rotation and what hosts say of keys and credentials (keys.go).
		RotatedSubject: d.onRotated,
		protocol.NodeWildcard(protocol.KeyChainAsk):      d.onKeyChainAsk,
		protocol.NodeWildcard(protocol.KeyRefusedReport): d.onKeyRefused,
		protocol.NodeWildcard(protocol.CredsRenew):       d.onCredsRenew,
	}
	if d.u.Archives != nil {
		// The archives hosts read are copied out of the bucket once, beside
		// the broker's own files; without a data dir, into a temporary one.
		cache := filepath.Join(d.o.DataDir, "archive-cache")
		if d.o.DataDir == "" {
			tmp, err := os.MkdirTemp("", "mesh-archive-cache-")
			if err != nil {
				return err
			}
			cache = tmp
		}
		var asked func(ctx context.Context, node, id string) error // nil: no builder uploads
		if d.u.Builds != nil {
			asked = d.u.Builds.BuildAsked
		}
		d.archives = archive.NewServer(d.nc, archive.ServerOptions{Declared: d.u.Archives.ArchiveDeclared, Asked: asked, CacheDir: cache,
			Refused: func(node, reason string) { d.dropAnswer("an archive's piece", node, reason) }})
		d.archives.Start(ctx)
		subs[protocol.NodeWildcard(protocol.ArchiveRead)] = d.archives.OnRead
		if d.u.Builds != nil {
			subs[protocol.ArchiveUploadSubject("*")] = d.archives.OnUpload
		}
	}
	d.subscribeBackups(subs)
	if d.u.Builds != nil {
		subs[protocol.BuildResultSubject("*")] = d.onBuildResult
		subs[BuildKickSubject] = func(*nats.Msg) { d.kickBuilds() }
	}
	for subject, h := range subs {
		if _, err := d.nc.QueueSubscribe(subject, "controller", h); err != nil {
			return fmt.Errorf("subscribe %s: %w", subject, err)
		}
	}
	// Apply reports are checked on as many goroutines as there are cores:
	// after a change to every node they all come at once, and each
	// subscription's messages are handled one after another. The broker
	// hands each report to one member of the queue group; a host sends its
	// next report once this one is answered (or its answer waited for in
	// vain), so a host's reports keep their order.
	for range runtime.GOMAXPROCS(0) - 1 {
		if _, err := d.nc.QueueSubscribe(protocol.NodeWildcard(protocol.Applied), "controller", d.onApplied); err != nil {
			return fmt.Errorf("subscribe %s: %w", protocol.NodeWildcard(protocol.Applied), err)
		}
	}
	if err := d.nc.Flush(); err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	// Joins arrive on their own connection and wait in a bounded queue for
	// one worker: a flood of them can neither starve heartbeats nor close
	// the connection they arrive on.
	sub, err := d.jc.QueueSubscribe(protocol.JoinSubject, "controller", func(m *nats.Msg) {
		select {
		case d.joins <- queued{m: m, at: time.Now()}:
		default:
			d.answerBusy(m)
		}
	})
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", protocol.JoinSubject, err)
	}
	// What the client holds for the join subscription is bounded too; past
	// it the broker's messages are dropped here, not queued without end.
	if err := sub.SetPendingLimits(joinQueue, 16<<20); err != nil {
		return err
	}
	return d.jc.Flush()
}

// verify checks a host message against the key its node presented at join,
// within the node's report budget, and its protocol against the ones this
// controller speaks; one that does not verify is dropped and counted. A
// request in a protocol this controller does not speak (the declaration
// ask, an apply report) is answered with why, in one line naming both.
func (d *daemon) verify(m *nats.Msg, what string, v any) (string, bool) {
	node := protocol.NodeOfSubject(m.Subject)
	reason := ""
	var mismatch error
	if !d.limits.allow(node, what, d.u.Now()) {
		reason = "too many " + what + " reports"
	} else if key := d.keys.get(node); key == nil {
		reason = "unknown sender"
	} else if spoken, err := protocol.OpenVersioned(m.Data, key, v); err != nil {
		reason = "bad signature"
		if !errors.Is(err, protocol.ErrBadSignature) {
			reason = "malformed"
		}
	} else {
		d.heardProtocol(node, spoken)
		if mismatch = protocol.Speaks(spoken); mismatch != nil {
			reason = protocolMismatch
		}
	}
	if reason == "" {
		return node, true
	}
	d.o.Counters.Dropped.Add(1)
	d.o.Metrics.Drop(reason)
	if mismatch != nil {
		d.log.Warn("dropped", "subject", m.Subject, "node", node, "reason", reason, "err", mismatch)
		d.respondTo(m, node, protocol.OKReply{Error: mismatch.Error()})
	} else {
		d.log.Warn("dropped", "subject", m.Subject, "node", node, "reason", reason)
	}
	d.handOver(event{kind: evDrop, node: node, reason: reason})
	return node, false
}

// protocolMismatch is the reason a message in a protocol this controller
// does not speak is dropped (counted as the other drops are); the
// self-check raises node.protocol-mismatch from what the node was last
// heard speaking.
const protocolMismatch = "protocol mismatch"

// heardProtocol keeps what protocol a node's host was heard speaking,
// written only when it changed (at join, or when the host or this
// controller was upgraded): node show says it, and the self-check judges it.
func (d *daemon) heardProtocol(node, spoken string) {
	if !d.keys.heard(node, spoken) {
		return
	}
	if err := d.st.Identity.HeardProtocol(d.bg, node, spoken); err != nil {
		d.deposed(err)
		d.log.Error("record the protocol a host speaks", "node", node, "protocol", spoken, "err", err)
	}
}

// refuse drops a verified report that carries more than a report may, and
// counts it.
func (d *daemon) refuse(m *nats.Msg, node, why string) {
	d.o.Counters.Dropped.Add(1)
	d.o.Metrics.Drop("too large")
	d.log.Warn("dropped", "subject", m.Subject, "node", node, "reason", why)
	d.handOver(event{kind: evDrop, node: node, reason: "too large"})
}

// joinReplyPrefix is where the broker maps the reply of a request that came
// through the join account's service import (embedded/broker.JoinUser): a
// join arrives only that way, so it is answered only there (and the
// connection that answers, in the admit account, may publish nowhere else).
const joinReplyPrefix = "_R_."

// respondTo answers a request, but only into the asker's own inbox
// namespace (a node's under its inbox prefix, a joining host's through the
// join account's service): a reply subject is the asker's word, not a
// permission, and the controller's own user may publish anywhere under
// mesh. Anything else is dropped and counted.
func (d *daemon) respondTo(m *nats.Msg, node string, v any) {
	if m.Reply == "" {
		return
	}
	prefix := joinReplyPrefix
	if node != "" {
		prefix = protocol.HostInboxPrefix(node) + "."
	}
	if !strings.HasPrefix(m.Reply, prefix) || len(m.Reply) == len(prefix) {
		d.dropAnswer(m.Subject, node, "answer outside its inbox")
		return
	}
	d.respond(m, v)
}

// dropAnswer counts and logs a request left unanswered, and raises it
// against its node.
func (d *daemon) dropAnswer(what, node, reason string) {
	d.o.Counters.Dropped.Add(1)
	d.o.Metrics.Drop(reason)
	d.log.Warn("not answering", "what", what, "node", node, "reason", reason)
	if node != "" {
		d.handOver(event{kind: evDrop, node: node, reason: reason})
	}
}

func (d *daemon) onHeartbeat(m *nats.Msg) {
	var hb protocol.HeartbeatBody
	node, ok := d.verify(m, protocol.Heartbeat, &hb)
	if !ok {
		return
	}
	d.o.Counters.Beats.Add(1)
	d.o.Metrics.Beat()
	d.handOver(event{kind: evBeat, node: node, at: d.u.Now(), beat: hb})
}

func (d *daemon) onFacts(m *nats.Msg) {
	var f protocol.FactsBody
	node, ok := d.verify(m, protocol.FactsReport, &f)
	if !ok {
		return
	}
	if len(f.Facts) > maxFacts || len(f.Found) > maxFound {
		d.refuse(m, node, fmt.Sprintf("%d facts and %d found, over %d and %d", len(f.Facts), len(f.Found), maxFacts, maxFound))
		return
	}
	facts := make([]inventory.Fact, 0, len(f.Facts))
	for _, x := range f.Facts {
		facts = append(facts, inventory.Fact{Name: clip(x.Name), Value: clip(x.Value), Why: clip(x.Why)})
	}
	found := make([]inventory.Found, 0, len(f.Found))
	for _, x := range f.Found {
		fd := inventory.Found{Kind: clip(x.Kind), Name: clip(x.Name), Detail: clip(x.Detail)}
		if x.Kind == "port" {
			fd.Addresses, fd.Commands = []string{word(x.Address)}, []string{word(x.Command)}
		}
		found = append(found, fd)
	}
	select {
	case d.facts <- inventory.FactsReport{Node: node, Facts: facts, Found: found, At: d.u.Now()}:
	default:
		// Its host reports again when it connects again, or when they
		// change.
		d.o.Counters.Dropped.Add(1)
		d.o.Metrics.Drop("facts queue full")
	}
}

// How facts reports wait for the facts writer: a rack joining or coming
// back at once reports ten thousand times within seconds; kept one
// transaction each, the reports held the inventory's writer from the
// joins, kept up to factsBatch at once they take a few commits.
const (
	factsQueue = 1 << 13
	factsBatch = 512
)

// factsWriter keeps facts reports until ctx ends: whatever waits is taken
// together (up to factsBatch) and kept in one transaction. As every
// writer's, its writes are on the handlers' context: a stop does not
// cancel a batch already taken.
func (d *daemon) factsWriter(ctx context.Context) {
	inBatches(ctx, d.facts, factsBatch, func(batch []inventory.FactsReport) { d.keepFacts(d.bg, batch) })
}

// keepFacts keeps a batch of facts reports and says what each refused.
func (d *daemon) keepFacts(ctx context.Context, batch []inventory.FactsReport) {
	kept, err := d.st.Inventory.RecordFactsMany(ctx, batch)
	if err != nil {
		d.deposed(err)
		d.log.Error("record facts", "nodes", len(batch), "err", err)
		return
	}
	for i, k := range kept {
		node := batch[i].Node
		switch {
		case k.Err != nil:
			d.log.Error("record facts", "node", node, "err", k.Err)
		case k.Refused != nil:
			// The rest of the report is kept; the self-check raises
			// overlay.key-conflict from what the store keeps of it.
			d.log.Warn("facts: WireGuard key refused: another node holds it, and keeps it", "node", node, "holder", k.Refused.Holder)
		}
	}
}

// word is a text a host reports that is kept as one word of a list: bounded,
// its spaces made underscores.
func word(s string) string {
	return strings.Join(strings.Fields(clip(s)), "_")
}

// clip bounds a text a host reports.
func clip(s string) string {
	if len(s) > maxTextLen {
		return s[:maxTextLen]
	}
	return s
}

// applied is one host's verified apply report, waiting to be kept.
type applied struct {
	m    *nats.Msg
	node string
	body protocol.AppliedBody
	at   time.Time
}

// How apply reports wait for the outcome writer: a roll-out to ten
// thousand nodes is answered by ten thousand reports within a second or
// two, each an update of its node; kept one transaction each they took
// ten seconds, kept up to appliedBatch at once they take a few commits.
const (
	appliedQueue = 1 << 14
	appliedBatch = 1024
)

func (d *daemon) onApplied(m *nats.Msg) {
	var a protocol.AppliedBody
	node, ok := d.verify(m, protocol.Applied, &a)
	if !ok {
		return
	}
	if len(a.Tiers) > maxTiers {
		d.refuse(m, node, fmt.Sprintf("%d tiers, over %d", len(a.Tiers), maxTiers))
		d.respondTo(m, node, protocol.OKReply{Error: "too many tiers"})
		return
	}
	select {
	case d.applied <- applied{m: m, node: node, body: a, at: d.u.Now()}:
	default:
		// Past the queue's bound the host is told, and reports again.
		d.o.Counters.Dropped.Add(1)
		d.o.Metrics.Drop("applied queue full")
		d.respondTo(m, node, protocol.OKReply{Error: "not recorded: the controller is busy"})
	}
}

// outcomeWriter keeps apply reports until ctx ends: whatever waits is taken
// together (up to appliedBatch), kept in one transaction, then answered,
// so the hosts hear "recorded" only once it is.
func (d *daemon) outcomeWriter(ctx context.Context) {
	inBatches(ctx, d.applied, appliedBatch, func(batch []applied) { d.keepOutcomes(d.bg, batch) })
}

// inBatches hands keep what waits in ch, as it comes, until ctx ends: all
// that waits at once (up to most) in one batch, so that a crowd of reports
// is kept in a few transactions rather than one each. The batch is keep's
// only until it returns.
func inBatches[T any](ctx context.Context, ch <-chan T, most int, keep func([]T)) {
	batch := make([]T, 0, most)
	for {
		select {
		case <-ctx.Done():
			return
		case x := <-ch:
			batch = append(batch[:0], x)
		}
	more:
		for len(batch) < most {
			select {
			case x := <-ch:
				batch = append(batch, x)
			default:
				break more
			}
		}
		keep(batch)
	}
}

// keepOutcomes keeps a batch of apply reports in one transaction, hands
// their durations and module states to the loop, and answers each host.
func (d *daemon) keepOutcomes(ctx context.Context, batch []applied) {
	outcomes := make([]inventory.NodeOutcome, len(batch))
	for i, a := range batch {
		outcomes[i] = inventory.NodeOutcome{Node: a.node, Outcome: inventory.Outcome{Serial: a.body.Serial, OK: a.body.OK, Error: clip(a.body.Error), TotalMS: a.body.TotalMS, At: a.at}}
	}
	if err := d.st.Inventory.RecordOutcomes(ctx, outcomes); err != nil {
		d.deposed(err)
		d.log.Error("record apply outcomes", "nodes", len(batch), "err", err)
		for _, a := range batch {
			d.respondTo(a.m, a.node, protocol.OKReply{Error: "not recorded"})
		}
		return
	}
	failed := false
	for _, x := range batch {
		a, node, now := x.body, x.node, x.at
		d.handOver(event{kind: evDuration, duration: health.Duration{Kind: "apply", Subject: node, MS: a.TotalMS, At: now}})
		d.o.Metrics.Applied(a.TotalMS)
		if a.Modules != nil {
			d.handOver(event{kind: evModules, node: node, at: now, hostAt: a.StatesAt, modules: a.Modules})
		}
		for _, t := range a.Tiers {
			d.handOver(event{kind: evDuration, duration: health.Duration{Kind: "tier", Subject: node, Name: clip(t.Tier), MS: t.MS, At: now}})
		}
		if a.OK {
			d.log.Info("applied declaration", "node", node, "serial", a.Serial, "ms", a.TotalMS)
		} else {
			d.log.Warn("declaration refused or failed", "node", node, "serial", a.Serial, "error", clip(a.Error))
			failed = true
		}
		d.respondTo(x.m, node, protocol.OKReply{OK: true})
	}
	if failed {
		d.kick()
	}
}

func (d *daemon) onData(m *nats.Msg) {
	var b protocol.DataBody
	node, ok := d.verify(m, protocol.DataReport, &b)
	if !ok {
		return
	}
	if len(b.Sets) > maxDataSets || len(b.Deleted) > maxDeleted {
		d.refuse(m, node, fmt.Sprintf("%d data sets and %d deletions, over %d", len(b.Sets), len(b.Deleted), maxDataSets))
		return
	}
	r := dataReport{report: inventory.DataReport{Node: node, Sets: make([]inventory.DataSet, 0, len(b.Sets)), At: d.u.Now()}}
	for _, s := range b.Sets {
		r.report.Sets = append(r.report.Sets, inventory.DataSet{Module: clip(s.Module), Name: clip(s.Name), Path: clip(s.Path), Bytes: s.Bytes, Precious: clip(s.Precious), LastBackup: s.LastBackup})
	}
	for _, del := range b.Deleted {
		r.deleted = append(r.deleted, inventory.Deletion{Module: del.Module, Kind: del.Kind, Target: del.Target})
	}
	select {
	case d.data <- r:
	default:
		// Past the queue's bound the report is kept here, in turn.
		d.keepData(d.bg, []dataReport{r})
	}
}

// dataReport is one host's verified data report, waiting to be kept.
type dataReport struct {
	report  inventory.DataReport
	deleted []inventory.Deletion
}

// How data reports wait for the data writer: after a change to every node
// each host reports its data once it applied it; kept one transaction each
// they kept the store's writer (and a core) busy for seconds beside the
// apply reports, kept up to dataBatch at once they take a few commits.
const (
	dataQueue = 1 << 14
	dataBatch = 1024
)

// dataWriter keeps data reports until ctx ends, whatever waits taken
// together (up to dataBatch); what is still queued then is kept as the
// daemon stops (stop).
func (d *daemon) dataWriter(ctx context.Context) {
	inBatches(ctx, d.data, dataBatch, func(batch []dataReport) { d.keepData(d.bg, batch) })
}

// keepData keeps data reports in the order they came: their data sets
// many to a transaction, and a report's deletions once its data sets (and
// those before it) are kept, as each report was kept on its own.
func (d *daemon) keepData(ctx context.Context, batch []dataReport) {
	var sets []inventory.DataReport
	keep := func() {
		if len(sets) == 0 {
			return
		}
		if err := d.st.Inventory.RecordDataReports(ctx, sets); err != nil {
			d.deposed(err)
			d.log.Error("record data sets", "nodes", len(sets), "err", err)
		}
		sets = sets[:0]
	}
	for _, r := range batch {
		sets = append(sets, r.report)
		if len(r.deleted) == 0 {
			continue
		}
		keep()
		if err := d.st.Inventory.DeletionsDone(ctx, r.report.Node, r.deleted, r.report.At); err != nil {
			d.deposed(err)
			d.log.Error("record deletions", "node", r.report.Node, "err", err)
		}
		d.kick()
	}
	keep()
}

// onBackup records a backup line done, said by a host whose node holds the
// backup seat.
func (d *daemon) onBackup(m *nats.Msg) {
	var b protocol.BackupBody
	node, ok := d.verify(m, protocol.BackupReport, &b)
	if !ok {
		return
	}
	ctx := d.bg
	holds, err := d.st.Inventory.HoldsSeat(ctx, node, "backup")
	if err != nil {
		d.log.Error("who holds the backup seat", "err", err)
		d.respondTo(m, node, protocol.OKReply{Error: "not recorded"})
		return
	}
	if !holds {
		d.log.Warn("backup reported by a node not holding the backup seat: ignored", "node", clip(b.Node), "module", clip(b.Module), "data", clip(b.Data), "reported_by", node)
		d.respondTo(m, node, protocol.OKReply{Error: node + " does not hold the backup seat"})
		return
	}
	if err := d.st.Inventory.RecordBackup(ctx, b.Node, b.Module, b.Data, b.At); err != nil {
		d.deposed(err)
		d.log.Error("record a backup", "node", clip(b.Node), "module", clip(b.Module), "data", clip(b.Data), "err", err)
		d.respondTo(m, node, protocol.OKReply{Error: "not recorded"})
		return
	}
	d.log.Info("backup done", "node", b.Node, "module", b.Module, "data", b.Data, "at", b.At.UTC().Format(time.RFC3339), "reported_by", node)
	d.respondTo(m, node, protocol.OKReply{OK: true})
	d.kick()
}

// How hosts' asks for their latest declaration wait. A host waits
// protocol.AnswerTimeout for its answer and then asks again: an ask that
// waited in the queue longer than askStale is not answered (its answer
// would likely reach no one, and answering it would delay the asks still
// waited for), so that ten thousand hosts back at once cannot keep the
// workers answering asks nobody waits for. askWorkers answer at once, each
// a signature check and a read.
const (
	askStale   = protocol.AnswerTimeout * 3 / 5
	askQueue   = 1 << 15
	askWorkers = 4
)

// askWorker answers asks for the latest declaration until ctx ends.
func (d *daemon) askWorker(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case a := <-d.asks:
			if time.Since(a.at) > askStale {
				d.o.Counters.Dropped.Add(1) // its host asks again
				d.o.Metrics.Drop("stale ask")
				continue
			}
			d.onDeclarationAsk(a.m)
		}
	}
}

func (d *daemon) onDeclarationAsk(m *nats.Msg) {
	var ask protocol.DeclarationAskBody
	node, ok := d.verify(m, protocol.DeclarationAsk, &ask)
	if !ok {
		return
	}
	decl, err := d.st.Inventory.LatestDeclaration(d.bg, node)
	if err != nil {
		d.log.Error("read the declaration", "node", node, "err", err)
		return
	}
	if decl == nil {
		d.respondTo(m, node, protocol.None{None: true})
		return
	}
	d.respondTo(m, node, EnvelopeOf(*decl))
	d.o.Metrics.Declared(1)
	if d.log.Enabled(d.bg, slog.LevelDebug) {
		d.log.Debug("asked: latest declaration sent", "node", node, "serial", decl.Serial)
	}
}

// joinWorker admits hosts off the heartbeat path, in batches of what is
// waiting (up to joinBatch): a rack powered on at once is admitted a batch
// per write, not a write per machine.
func (d *daemon) joinWorker(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case j := <-d.joins:
			batch := []queued{j}
		more:
			for len(batch) < joinBatch {
				select {
				case j := <-d.joins:
					batch = append(batch, j)
				default:
					break more
				}
			}
			fresh := batch[:0]
			for _, j := range batch {
				if time.Since(j.at) > joinStale {
					d.answerBusy(j.m)
					continue
				}
				fresh = append(fresh, j)
			}
			if len(fresh) > 0 {
				d.onJoins(ctx, fresh)
			}
		}
	}
}

// joinBatch is how many waiting joins are admitted together.
const joinBatch = 128

// onJoins judges a batch of joins and answers each.
func (d *daemon) onJoins(ctx context.Context, batch []queued) {
	reqs := make([]protocol.JoinRequest, len(batch))
	results := make([]JoinResult, len(batch))
	var asks []protocol.JoinRequest
	var asked []int
	renewals := map[int]bool{}
	for i, j := range batch {
		if err := json.Unmarshal(j.m.Data, &reqs[i]); err != nil {
			results[i].Err = &Refusal{Reason: "malformed request", Err: err}
			continue
		}
		// A host this controller does not speak to is refused before its
		// token is looked at (it stays unused), and told why.
		if err := protocol.Speaks(reqs[i].Protocol); err != nil {
			results[i].Err = &Refusal{Reason: protocolMismatch, Err: err}
			continue
		}
		if len(reqs[i].Renew) > 0 {
			// A host whose credential expired renews it (keys.go).
			renewals[i] = true
			d.renewByJoin(ctx, j.m, reqs[i])
			continue
		}
		asks = append(asks, reqs[i])
		asked = append(asked, i)
	}
	if len(asks) > 0 {
		for k, r := range d.u.Hosts.Join(ctx, asks, d.urls) {
			results[asked[k]] = r
		}
	}
	revoked := 0
	var admitted, rejoined []string
	for i, j := range batch {
		if renewals[i] || !d.answerJoin(j.m, reqs[i], results[i]) {
			continue
		}
		admitted = append(admitted, reqs[i].Node)
		if results[i].Revoked > 0 {
			revoked += results[i].Revoked
			rejoined = append(rejoined, reqs[i].Node)
		}
	}
	switch {
	// The machines that were these nodes before are not them any more:
	// their users no longer connect, nor hear the nodes' declarations.
	case len(rejoined) == 1:
		d.disconnectRevoked(fmt.Sprintf("re-joined: its earlier host users revoked (%d)", revoked), "node", rejoined[0])
	case len(rejoined) > 1:
		d.disconnectRevoked(fmt.Sprintf("re-joined: their earlier host users revoked (%d)", revoked), "nodes", strings.Join(rejoined, ","))
	}
	d.afterJoins(ctx, admitted)
}

// afterJoins hands the nodes just admitted that have something assigned
// to the loop, whose catch-up makes the secrets sealed to them that they
// waited for. Most nodes join with nothing assigned, and are asked about
// here, a batch in one query, rather than on the loop, which absorbs
// heartbeats. A query that failed hands them all over: the catch-up finds
// out itself.
func (d *daemon) afterJoins(ctx context.Context, nodes []string) {
	if len(nodes) == 0 {
		return
	}
	assigned, err := d.st.Inventory.Assigned(ctx, nodes)
	if err != nil && ctx.Err() == nil {
		d.log.Error("after joins: read which have assignments", "nodes", len(nodes), "err", err)
	}
	for _, node := range nodes {
		if assigned[node] || err != nil {
			d.handOver(event{kind: evJoined, node: node})
		}
	}
}

// answerJoin answers one judged join and says whether it was admitted.
func (d *daemon) answerJoin(m *nats.Msg, r protocol.JoinRequest, res JoinResult) bool {
	source := sourceOf(m)
	var refusal *Refusal
	switch err := res.Err; {
	case errors.As(err, &refusal):
		// The log and join.refused keep the reason; the asker is told only
		// that it was refused.
		if d.refusalLog.allow(source, d.u.Now()) {
			d.log.Warn("join refused", "node", clip(r.Node), "source", source, "err", err)
		}
		d.handOver(event{kind: evRefused, source: source, reason: refusal.Reason})
		if errors.Is(err, identity.ErrTokenUsed) {
			d.kick()
		}
		// A host refused for its protocol is told which, and what to do:
		// it says nothing of tokens or names.
		answer := protocol.JoinRefused
		var mismatch *protocol.MismatchError
		if errors.As(err, &mismatch) {
			answer = mismatch.Error()
		}
		d.respondTo(m, "", protocol.JoinReply{Error: answer})
		return false
	case err != nil:
		d.deposed(err)
		d.log.Error("join failed", "node", clip(r.Node), "source", source, "err", err)
		d.respondTo(m, "", protocol.JoinReply{Error: protocol.JoinFailed})
		return false
	}
	d.keys.set(r.Node, res.HostKey)
	d.keys.heard(r.Node, protocol.Of(r.Protocol)) // recorded by the join itself
	if res.Again {
		d.log.Info("joined, answered again: its first answer did not reach it", "node", r.Node, "source", source)
	} else {
		d.log.Info("joined", "node", r.Node, "host_version", clip(r.HostVersion), "protocol", protocol.Of(r.Protocol), "source", source)
	}
	d.respondTo(m, "", res.Reply)
	return true
}

// refusalLog bounds how many refused joins from one source are logged a
// minute: every one is counted (join.refused), but a flood of them must
// not fill the log. Used by the join worker alone.
type refusalLog struct {
	minute time.Time
	logged map[string]int
}

// refusalsLogged is how many refused joins from one source are logged a minute.
const refusalsLogged = 20

func (l *refusalLog) allow(source string, now time.Time) bool {
	if m := now.Truncate(time.Minute); !m.Equal(l.minute) || l.logged == nil {
		l.minute, l.logged = m, map[string]int{}
	}
	l.logged[source]++
	return l.logged[source] <= refusalsLogged
}

// sourceOf is the address a join came from, as the broker put it in the
// request's Nats-Request-Info header when the request crossed from the join
// account: the server replaces a header of that name the asker sent, so the
// asker cannot choose it (a header spelt in another case is the asker's own,
// and not read). Without it the source cannot be known: "unknown".
func sourceOf(m *nats.Msg) string {
	values := m.Header[broker.ClientInfoHdr]
	if len(values) == 0 {
		return "unknown"
	}
	var ci struct {
		Host string `json:"host"`
	}
	if json.Unmarshal([]byte(values[len(values)-1]), &ci) != nil {
		return "unknown"
	}
	ip := net.ParseIP(ci.Host)
	if ip == nil {
		return "unknown"
	}
	return ip.String()
}

// onRevoked gives the embedded broker an account JWT revoking every revoked
// user, which disconnects them.
func (d *daemon) onRevoked(*nats.Msg) { d.disconnectRevoked("users were revoked") }

// disconnectRevoked gives the broker an account JWT revoking every revoked
// user: the server closes their connections and refuses them from then
// on. The embedded broker is given it directly, an external one through
// its resolver (pushAccount).
func (d *daemon) disconnectRevoked(what string, attrs ...any) {
	if d.srv == nil {
		d.pushAccount(what, attrs...)
		return
	}
	trust, err := d.u.Credentials.Trust(d.bg)
	if err == nil {
		err = d.srv.UpdateAccount(trust)
	}
	if err != nil {
		d.log.Error(what+": revoke", append(attrs, "err", err)...)
		return
	}
	d.log.Info(what+": revoked users disconnected", attrs...)
}

// pushAccount gives an external broker's servers the mesh account's JWT,
// through the full resolver each keeps it in (broker show --config): a
// server away now takes it from the others when it comes back, and serve
// pushes it again when it starts. A broker without one must be given it
// by a person, and the log says so.
func (d *daemon) pushAccount(what string, attrs ...any) {
	if d.sc == nil {
		d.log.Warn(what+": give the external broker the mesh account's JWT ('mesh-controller broker show --broker URL')", attrs...)
		return
	}
	trust, err := d.u.Credentials.Trust(context.Background())
	if err != nil {
		d.log.Error(what+": revoke", append(attrs, "err", err)...)
		return
	}
	n, err := broker.PushAccount(d.sc, trust, brokerTimeout)
	if err != nil {
		d.log.Error(what+": push the mesh account's JWT to the broker", append(attrs, "err", err)...)
		return
	}
	d.log.Info(what+": the mesh account's JWT taken by the broker's servers, revoked users disconnected", append(attrs, "servers", n)...)
}

// EnvelopeOf is a kept declaration as sent to its host.
func EnvelopeOf(d inventory.Declaration) protocol.Envelope {
	return protocol.Envelope{Declaration: d.Body, Signature: d.Signature, Key: d.Key, Protocol: protocol.Version}
}

// PublishDeclaration sends a node its declaration.
func PublishDeclaration(nc *nats.Conn, d inventory.Declaration) error {
	b, err := json.Marshal(EnvelopeOf(d))
	if err != nil {
		return err
	}
	return nc.Publish(protocol.DeclarationInbox(d.Node), b)
}

// SendLatest sends a node the latest declaration kept for it. serial is
// the one sent, 0 if the node has none or it could not be read: an error
// with a serial is the publish's.
func SendLatest(ctx context.Context, inv *inventory.Store, nc *nats.Conn, node string) (serial int64, err error) {
	decl, err := inv.LatestDeclaration(ctx, node)
	if err != nil || decl == nil {
		return 0, err
	}
	return decl.Serial, PublishDeclaration(nc, *decl)
}

// limiter gives each node a budget of reports of each kind: a host sending
// faster than any real one would is dropped and counted, so no host can
// make the controller write without end.
type limiter struct {
	mu      sync.Mutex
	buckets map[[2]string]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time
}

// budgets are, per report kind, how many may arrive at once and how many a
// second on average. Heartbeats: a host may beat every 100 ms; the rest
// come after applying or on change.
var budgets = map[string][2]float64{
	protocol.Heartbeat:      {50, 10},
	protocol.FactsReport:    {20, 1},
	protocol.Applied:        {50, 5},
	protocol.DataReport:     {50, 5},
	protocol.DeclarationAsk: {20, 2},
	protocol.BackupReport:   {1000, 100},
	protocol.BackedUp:       {1000, 100},
	// A host asks for the chain when it meets a key it does not know, says
	// it refused one, and renews its credential every few weeks.
	protocol.KeyChainAsk:      {10, 1},
	protocol.KeyRefusedReport: {10, 0.1},
	protocol.CredsRenew:       {5, 1.0 / 60},
}

func (l *limiter) allow(node, what string, now time.Time) bool {
	b, ok := budgets[what]
	if !ok {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	k := [2]string{node, what}
	bk := l.buckets[k]
	if bk == nil {
		bk = &bucket{tokens: b[0], at: now}
		l.buckets[k] = bk
	}
	bk.tokens = min(b[0], bk.tokens+now.Sub(bk.at).Seconds()*b[1])
	bk.at = now
	if bk.tokens < 1 {
		return false
	}
	bk.tokens--
	return true
}

// onBuildResult records a builder's outcome, whoever waits for it, and
// answers the builder once it is recorded (it reports again until then).
// The builder is the one the subject names (only its user may publish
// there), and it is answered only into its own inbox.
func (d *daemon) onBuildResult(m *nats.Msg) {
	builder := strings.TrimPrefix(m.Subject, protocol.BuildResultSubject(""))
	if prefix := protocol.BuilderInboxPrefix(builder) + "."; !protocol.ValidName(builder) || !strings.HasPrefix(m.Reply, prefix) || len(m.Reply) == len(prefix) {
		d.dropAnswer("a build's outcome", builder, "answer outside its inbox")
		return
	}
	line, err := d.u.Builds.TakeIn(d.bg, m.Data, builder)
	reply := protocol.OKReply{OK: err == nil}
	if err != nil {
		reply.Error = err.Error()
		d.log.Error("a build outcome not taken in", "err", err)
	} else {
		d.logf("%s", line)
	}
	if m.Reply != "" {
		b, _ := json.Marshal(reply)
		_ = m.Respond(b)
	}
	d.kickBuilds()
}

// kickBuilds asks the dispatcher for a round soon.
func (d *daemon) kickBuilds() {
	select {
	case d.buildKick <- struct{}{}:
	default:
	}
}

// dispatcher offers the build queue to builders every DispatchEvery and
// when kicked, off the daemon's loop: asking a builder waits for its answer.
//
// It runs the sweep too, when it is due: the sweep reads the object store
// and the stores, which the loop must not wait for.
func (d *daemon) dispatcher(ctx context.Context) {
	tick := time.NewTicker(DispatchEvery)
	defer tick.Stop()
	sweep := time.NewTimer(min(time.Minute, d.o.SweepEvery))
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-d.buildKick:
		case <-sweep.C:
			sweep.Reset(d.o.SweepEvery)
			if d.u.Archives == nil {
				continue
			}
			line, err := d.u.Archives.Sweep(ctx, d.nc)
			if err != nil && ctx.Err() == nil {
				d.log.Error("the sweep", "err", err)
			} else if line != "" {
				d.logf("%s", line)
			}
			continue
		}
		lines, err := d.u.Builds.DispatchBuilds(ctx, d.nc)
		for _, l := range lines {
			d.logf("%s", l)
		}
		if err != nil && ctx.Err() == nil {
			d.deposed(err)
			d.log.Error("the build queue", "err", err)
		}
	}
}
