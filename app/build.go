package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"mesh-controller/app/archive"
	"mesh-controller/app/builder"
	"mesh-controller/app/daemon"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/builds"
	"mesh-controller/contexts/health"
	"mesh-controller/contexts/identity"
	"mesh-controller/contexts/inventory"
	"mesh-controller/embedded/broker"
)

// BuildKickSubject is where a person's command tells the serving
// controller that an ask is waiting: it asks a builder at once rather than
// at its next round.
const BuildKickSubject = daemon.BuildKickSubject

// Bounds of the build queue. An ask nobody takes within askWaitBound is
// dead; one taken and not answered within its try's bound goes back to
// waiting, and is dead after maxBuildTries.
const (
	askWaitBound   = 15 * time.Minute
	maxBuildTries  = 3
	buildTryMargin = 5 * time.Minute
)

// buildSeat is the seat whose holders build.
const buildSeat = "build"

// ErrNoBuilder means no module holds the build seat.
var ErrNoBuilder = errors.New("no module holds the build seat")

// ErrBuildFailed means a build ended without a registered version; the
// error says why.
var ErrBuildFailed = errors.New("the build did not register a version")

// builders are the holders of the build seat, as node/module, that are not
// paused.
func builders(snap *inventory.Snapshot, paused []builds.Pause) []inventory.Holder {
	var out []inventory.Holder
	for _, h := range buildSeatHolders(snap) {
		if _, ok := builds.PausedFor(paused, h.Node); !ok {
			out = append(out, h)
		}
	}
	return out
}

// buildSeatHolders are the holders of the build seat, paused or not.
func buildSeatHolders(snap *inventory.Snapshot) []inventory.Holder {
	return snap.Seats.Holders[snap.Seats.SeatName(buildSeat)]
}

// noBuildSeatHolder says no module holds the build seat, so an ask (or a
// plan's) can only wait; a mesh that cannot be read is not said to lack one.
func (c uses) noBuildSeatHolder(ctx context.Context, st *Stores) bool {
	snap, err := st.Inventory.Snapshot(ctx)
	return err == nil && len(buildSeatHolders(snap)) == 0
}

// DispatchBuilds is the serving controller's round of the build queue: asks
// in flight past their bound go back to waiting (dead after their tries),
// asks nobody took for too long die, build plans are carried on (a step
// whose bases are built is asked), and each waiting ask is offered to the
// unpaused holders of the build seat in turn until one takes it. It
// returns a line for each thing it did.
func (c *Builds) DispatchBuilds(ctx context.Context, nc *nats.Conn) ([]string, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return nil, err
	}
	bs, now := st.Builds, c.Now()
	var lines []string
	requeued, dead, err := bs.ExpireInFlight(ctx, inventory.DefaultBuildTimeout+buildTryMargin, maxBuildTries, now)
	if err != nil {
		return nil, err
	}
	for _, a := range requeued {
		lines = append(lines, fmt.Sprintf("build %s: no outcome from %s in time; asked again", a.ID, a.Builder))
	}
	for _, a := range dead {
		lines = append(lines, fmt.Sprintf("build %s: dead after %d tries", a.ID, a.Tries))
	}
	died, err := bs.ExpireWaiting(ctx, askWaitBound, now)
	if err != nil {
		return lines, err
	}
	for _, a := range died {
		lines = append(lines, fmt.Sprintf("build %s: no builder took it within %s: dead", a.ID, askWaitBound))
	}
	// Plans next: a step whose base was just built is asked in this round.
	advanced, err := bs.AdvancePlans(ctx, now)
	lines = append(lines, advanced...)
	if err != nil {
		return lines, err
	}
	waiting, err := bs.Waiting(ctx, 50)
	if err != nil || len(waiting) == 0 {
		return lines, err
	}
	// The mesh is read only when an ask waits: this runs every few
	// seconds, and a snapshot of thousands of nodes is not free.
	snap, err := st.Inventory.Snapshot(ctx)
	if err != nil {
		return lines, err
	}
	paused, err := bs.Paused(ctx)
	if err != nil {
		return lines, err
	}
	hs := builders(snap, paused)
	for _, a := range waiting {
		for _, h := range hs {
			// Redacted: an ask kept before credentials were refused may hold
			// one, which the builder then refuses rather than uses.
			body, _ := json.Marshal(builder.Ask{ID: a.ID, Repository: inventory.RedactRepository(a.Repository), Ref: a.Ref, DryRun: a.DryRun})
			m, err := nc.Request(protocol.BuildAskSubject(h.Node), body, protocol.AnswerTimeout)
			if err != nil {
				continue // not running, or not answering: the next holder
			}
			var t protocol.BuildTaken
			if json.Unmarshal(m.Data, &t) != nil || !t.Taken {
				continue
			}
			if _, err := bs.Take(ctx, a.ID, h.String(), c.Now()); err != nil {
				lines = append(lines, fmt.Sprintf("build %s: taken by %s but not recorded: %v", a.ID, h, err))
				continue
			}
			lines = append(lines, fmt.Sprintf("build %s: taken by %s", a.ID, h))
			break
		}
	}
	return lines, nil
}

// TakeIn records a builder's outcome and, for a build that succeeded and is
// not a dry run, registers the version it built with its archive (as module
// add does, with source, commit and build): the daemon calls it for every
// outcome, whoever waits. A version older than the module's current one is
// recorded and not registered (superseded).
//
// Only a builder's own connection can have sent it: the answer it asks for
// goes to the inbox beneath the node of the builder that took the ask (or,
// for one no builder holds now, of a holder of the build seat). Whoever may
// use the broker's JetStream API can make the server publish stored bytes
// on any subject, mesh.build.result included, but never with such a reply.
func (c *Builds) TakeIn(ctx context.Context, data []byte, from string) (string, error) {
	var o builder.Outcome
	if err := json.Unmarshal(data, &o); err != nil {
		return "", fmt.Errorf("an outcome that is not JSON: %w", err)
	}
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return "", err
	}
	asked, err := st.Builds.Get(ctx, o.ID)
	if err != nil {
		return "", err
	}
	if !fromBuilder(from, asked, snap) {
		return "", fmt.Errorf("%w: an outcome for %s that no builder's connection sent", ErrNotFromBuilder, o.ID)
	}
	now := c.Now()
	commitAt, _ := time.Parse(time.RFC3339, o.CommitAt) // unknown when the builder did not say
	// What a builder says is kept and printed: a URL's credential in a git
	// message (from a builder of its own) is not.
	a, err := st.Builds.Finish(ctx, o.ID, builds.Outcome{Failed: o.Failed, Module: o.Module, Commit: o.Commit, CommitAt: commitAt, Version: o.Version,
		Digest: o.Digest, Bytes: o.Bytes, UnpackedBytes: o.UnpackedBytes, DurationMS: o.DurationMS, Why: inventory.RedactText(o.Why), Problems: redactAll(o.Problems),
		LogTail: redactAll(o.LogTail), Manifest: redactManifest(o.Manifest)}, now)
	if err != nil {
		return "", err
	}
	shown := inventory.RedactRepository(a.Repository)
	if a.DryRun {
		// Looked at, never taken in: nothing registered, and its time is
		// not a build's.
		return fmt.Sprintf("build %s of %s: a dry run, %s %s; looked at, nothing registered", a.ID, shown, a.State, a.Why), nil
	}
	if o.Module != "" && !a.AskedAt.IsZero() {
		// What a person waits for: from the ask to its outcome heard, not
		// the builder's own part of it.
		_ = st.Health.RecordDurations(ctx, []health.Duration{{Kind: "build", Subject: o.Module, MS: max(float64(now.Sub(a.AskedAt).Milliseconds()), o.DurationMS), At: now}})
	}
	if a.State != builds.Done {
		return fmt.Sprintf("build %s of %s: %s %s (taken in by serve)", a.ID, shown, a.State, a.Why), nil
	}
	m, problems := inventory.ParseManifest(o.Manifest)
	if len(problems) > 0 {
		_, err := st.Builds.MarkSuperseded(ctx, a.ID, "its manifest does not stand: "+problems[0].String())
		return "", err
	}
	if cur, ok := snap.Current[m.Module]; ok && inventory.CompareVersions(m.Version, cur) < 0 && !a.AllowOlder {
		_, err := st.Builds.MarkSuperseded(ctx, a.ID, fmt.Sprintf("%s %s is older than the registered %s", m.Module, m.Version, cur))
		return fmt.Sprintf("build %s: superseded: %s %s is older than %s (taken in by serve)", a.ID, m.Module, m.Version, cur), err
	}
	if why, err := c.newerBuildOfVersion(ctx, st, a, m); err != nil || why != "" {
		if err != nil {
			return "", err
		}
		_, err := st.Builds.MarkSuperseded(ctx, a.ID, why)
		return fmt.Sprintf("build %s: superseded: %s (taken in by serve)", a.ID, why), err
	}
	canon, err := protocol.Canonical(m)
	if err != nil {
		return "", err
	}
	added, err := st.Inventory.AddBuilt(ctx, m, canon, inventory.Origin{Source: a.Repository, Commit: o.Commit, BuildID: a.ID,
		Archive: inventory.Archive{Digest: o.Digest, Bytes: o.Bytes, UnpackedBytes: o.UnpackedBytes}}, now)
	if err != nil {
		_, merr := st.Builds.MarkSuperseded(ctx, a.ID, err.Error())
		return fmt.Sprintf("build %s: not registered: %v (taken in by serve)", a.ID, err), merr
	}
	if _, err := st.Builds.MarkRegistered(ctx, a.ID); err != nil {
		return "", err
	}
	again := ""
	if added.Rebuilt {
		again = ", its archive replaced (push --behind sends it to the nodes that run it)"
	}
	return fmt.Sprintf("build %s: %s %s registered from %s at %s%s (taken in by serve)", a.ID, m.Module, m.Version, shown, ShortID(o.Commit), again), nil
}

// newerBuildOfVersion says why a build of a version the mesh registered
// already from another build must not replace it: that build's commit is
// newer ("" when this one may: a newer or the same commit, built again).
// Two builds of one module at once are both recorded; the newer commit
// wins whatever order they finish in.
func (c uses) newerBuildOfVersion(ctx context.Context, st *Stores, a builds.Ask, m inventory.Manifest) (string, error) {
	if a.AllowOlder || a.CommitAt == nil {
		return "", nil
	}
	vs, err := st.Inventory.BuiltVersions(ctx, m.Module)
	if err != nil {
		return "", err
	}
	for _, v := range vs {
		if v.Version != m.Version || v.BuildID == "" || v.BuildID == a.ID {
			continue
		}
		held, err := st.Builds.Get(ctx, v.BuildID)
		if errors.Is(err, builds.ErrNotFound) {
			return "", nil // its build is no longer recorded: nothing to judge by
		}
		if err != nil {
			return "", err
		}
		if held.CommitAt != nil && a.CommitAt.Before(*held.CommitAt) {
			return fmt.Sprintf("%s %s is registered from a newer commit (%s, build %s) than %s", m.Module, m.Version,
				ShortID(held.Commit), held.ID, ShortID(a.Commit)), nil
		}
	}
	return "", nil
}

// ErrNotFromBuilder means a build outcome did not come from a builder.
var ErrNotFromBuilder = errors.New("refused")

// fromBuilder says the outcome came from the builder that took the ask
// (the node the broker says sent it), or, for an ask no builder holds,
// from a holder of the build seat.
func fromBuilder(from string, a builds.Ask, snap *inventory.Snapshot) bool {
	if from == "" {
		return false
	}
	if node, _, _ := strings.Cut(a.Builder, "/"); node != "" && a.State == builds.InFlight {
		return node == from
	}
	for _, h := range buildSeatHolders(snap) {
		if h.Node == from {
			return true
		}
	}
	return false
}

// BuildAsked says whether build id is in flight on builder node: only then
// may it hand the controller an archive (app/archive's Server), so that no
// builder fills the bucket with archives no build of its made.
func (c *Builds) BuildAsked(ctx context.Context, node, id string) error {
	st, err := c.stores(ctx)
	if err != nil {
		return err
	}
	a, err := st.Builds.Get(ctx, id)
	if errors.Is(err, builds.ErrNotFound) {
		return fmt.Errorf("build %q: %w", id, archive.ErrNotAsked)
	}
	if err != nil {
		return err
	}
	if n, _, _ := strings.Cut(a.Builder, "/"); a.State != builds.InFlight || n != node {
		return fmt.Errorf("build %s is %s on %q, not in flight on %s: %w", a.ID, a.State, a.Builder, node, archive.ErrNotAsked)
	}
	return nil
}

// ArchiveDeclared says whether node's latest declaration names the archive:
// only then may its host read it.
func (c *Builds) ArchiveDeclared(ctx context.Context, node, digest string) (bool, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return false, err
	}
	d, err := st.Inventory.LatestDeclaration(ctx, node)
	if err != nil || d == nil {
		return false, err
	}
	var body protocol.Declaration
	if err := json.Unmarshal([]byte(d.Body), &body); err != nil {
		return false, fmt.Errorf("read the declaration of %s: %w", node, err)
	}
	if h := body.Host; h != nil && h.Archive != nil && h.Archive.Digest == digest {
		return true, nil // its host release
	}
	return slices.ContainsFunc(body.Modules, func(m protocol.DeclaredModule) bool { return m.Archive != nil && m.Archive.Digest == digest }), nil
}

// shownAsk is an ask as the mesh prints it: its repository, why and
// outcome redacted. An ask kept before credentials were refused in
// repository URLs may hold one.
func shownAsk(a builds.Ask) builds.Ask {
	a.Repository, a.Why = inventory.RedactRepository(a.Repository), inventory.RedactText(a.Why)
	if a.Details != nil {
		d := *a.Details
		d.Problems, d.LogTail, d.Manifest = redactAll(d.Problems), redactAll(d.LogTail), redactManifest(d.Manifest)
		a.Details = &d
	}
	return a
}

// shownAsks are asks as the mesh prints them (shownAsk).
func shownAsks(as []builds.Ask) []builds.Ask {
	for i := range as {
		as[i] = shownAsk(as[i])
	}
	return as
}

// redactAll is lines with every URL in them redacted.
func redactAll(lines []string) []string {
	if lines == nil {
		return nil
	}
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = inventory.RedactText(l)
	}
	return out
}

// redactManifest is a manifest as built with every URL in it redacted (its
// source, say): the one registered is judged from the builder's own copy.
func redactManifest(m json.RawMessage) json.RawMessage {
	if r := inventory.RedactText(string(m)); r != string(m) {
		return json.RawMessage(r)
	}
	return m
}

// ShortID is a commit or a digest as shown: its first 12 characters.
func ShortID(commit string) string {
	if len(commit) > 12 {
		return commit[:12]
	}
	return commit
}

// BuildRequest asks for a build.
type BuildRequest struct {
	Repository, Ref string
	// Module and AgainOf are known for a rebuild: the module asked for, and
	// the build asked again.
	Module, AgainOf string
	// DryRun is looked at, never taken in; AllowOlder may register a version
	// older than the current one.
	DryRun, AllowOlder bool
	// NoWait returns once the ask is queued.
	NoWait bool
	// Progress is told each step and each line of the build's log.
	Progress func(string)
}

// Build queues an ask, tells the serving controller, and (unless NoWait)
// follows it — waiting, taken by a builder, its log, its outcome — until
// it ends: nil only when a version was registered.
func (c *Builds) Build(ctx context.Context, r BuildRequest) (builds.Ask, error) {
	if strings.TrimSpace(r.Repository) == "" || strings.HasPrefix(r.Repository, "-") || strings.HasPrefix(r.Ref, "-") {
		return builds.Ask{}, fmt.Errorf("%w: give a repository URL or path, and a ref that is not an option", builds.ErrNoRepository)
	}
	// Never kept: the builds store, the daemon's log and every listing
	// would hold the credential.
	if err := inventory.CheckRepository(r.Repository); err != nil {
		return builds.Ask{}, err
	}
	if r.Progress == nil {
		r.Progress = func(string) {}
	}
	st, err := c.stores(ctx)
	if err != nil {
		return builds.Ask{}, err
	}
	now := c.Now()
	a, err := st.Builds.Enqueue(ctx, builds.Ask{ID: builds.NewID(now), Repository: r.Repository, Ref: r.Ref, Module: r.Module, AgainOf: r.AgainOf,
		DryRun: r.DryRun, AllowOlder: r.AllowOlder}, now)
	if err != nil {
		return builds.Ask{}, err
	}
	a, err = c.followBuild(ctx, st, a, r)
	return shownAsk(a), err
}

// followBuild tells the serving controller of a queued ask and, unless
// NoWait, follows it until it ends, as Build says.
func (c uses) followBuild(ctx context.Context, st *Stores, a builds.Ask, r BuildRequest) (builds.Ask, error) {
	r.Progress(fmt.Sprintf("%s: waiting for a builder (%s%s)", a.ID, a.Repository, map[bool]string{true: " at " + a.Ref, false: ""}[a.Ref != ""]))
	if c.noBuildSeatHolder(ctx, st) {
		if r.NoWait {
			r.Progress("no module holds the build seat yet: the ask waits until one does")
			return a, nil
		}
		return a, fmt.Errorf("%s is queued, and %w", a.ID, ErrNoBuilder)
	}
	nc, err := c.dialBroker(ctx, st.Identity)
	if err != nil {
		if r.NoWait {
			return a, nil // a controller asks a builder when it serves
		}
		return a, fmt.Errorf("%s is queued, and %w", a.ID, err)
	}
	defer nc.Close()
	lines := make(chan string, 256)
	if !r.NoWait {
		id := a.ID // the handler runs beside the loop below, which reads a afresh
		sub, err := nc.Subscribe(protocol.BuildProgressSubject("*"), func(m *nats.Msg) {
			var l protocol.BuildLine
			if json.Unmarshal(m.Data, &l) == nil && l.ID == id {
				select {
				case lines <- l.Line:
				default: // a slow terminal drops lines, never the build
				}
			}
		})
		if err != nil {
			return a, err
		}
		defer sub.Unsubscribe()
	}
	_ = nc.Publish(BuildKickSubject, []byte(a.ID))
	_ = nc.FlushTimeout(protocol.AnswerTimeout)
	if r.NoWait {
		return a, nil
	}
	state := a.State
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return a, fmt.Errorf("%s goes on without you: see 'mesh-controller build list'", a.ID)
		case l := <-lines:
			r.Progress("  | " + inventory.RedactText(l))
			continue
		case <-tick.C:
		}
		if a, err = st.Builds.Get(ctx, a.ID); err != nil {
			return a, err
		}
		if a.State != state {
			state = a.State
			if a.State == builds.InFlight {
				r.Progress(fmt.Sprintf("%s: taken by %s, building", a.ID, a.Builder))
			}
		}
		if a.State.Open() && a.State != builds.Dead || a.State == builds.Done && !a.Registered && a.Why == "" && !a.DryRun {
			continue
		}
		for len(lines) > 0 {
			r.Progress("  | " + inventory.RedactText(<-lines))
		}
		if a.Registered || a.DryRun && a.State == builds.Done {
			return a, nil
		}
		why := a.Why
		if a.Details != nil && len(a.Details.Problems) > 0 {
			why += ": " + strings.Join(a.Details.Problems, "; ")
		}
		return a, fmt.Errorf("%w: %s %s: %s", ErrBuildFailed, a.ID, a.State, why)
	}
}

// BuildsList is what builds shows: the latest asks, newest first.
func (c *Builds) BuildsList(ctx context.Context, module string) ([]builds.Ask, error) {
	if module != "" {
		if err := CheckName(module); err != nil {
			return nil, err
		}
	}
	st, err := c.stores(ctx)
	if err != nil {
		return nil, err
	}
	as, err := st.Builds.List(ctx, builds.Filter{Module: module})
	return shownAsks(as), err
}

// BuildQueue is what queue shows: asks waiting, in flight and dead.
func (c *Builds) BuildQueue(ctx context.Context) ([]builds.Ask, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return nil, err
	}
	as, err := st.Builds.Queue(ctx)
	return shownAsks(as), err
}

// errBuildWhy: every by-hand act on the build queue is recorded with why.
var errBuildWhy = fmt.Errorf("a by-hand act on the build queue is recorded with why: %w", health.ErrNoWhy)

// BuildCancel drops a waiting or dead ask (never one in flight: kill ends
// that), recorded as a hand act.
func (c *Builds) BuildCancel(ctx context.Context, id, why string) (builds.Ask, error) {
	if strings.TrimSpace(why) == "" {
		return builds.Ask{}, errBuildWhy
	}
	st, err := c.stores(ctx)
	if err != nil {
		return builds.Ask{}, err
	}
	a, err := st.Builds.Cancel(ctx, id, c.Now())
	a = shownAsk(a)
	if err != nil {
		return a, err
	}
	return a, c.recordHand(ctx, fmt.Sprintf("cancel build %s (%s)", a.ID, a.Repository), why, "build", "")
}

// BuildClear cancels every waiting ask, and the dead ones with dead; never
// one in flight. It is recorded as a hand act when it cancelled any.
func (c *Builds) BuildClear(ctx context.Context, dead bool, why string) (int, error) {
	if strings.TrimSpace(why) == "" {
		return 0, errBuildWhy
	}
	st, err := c.stores(ctx)
	if err != nil {
		return 0, err
	}
	n, err := st.Builds.Clear(ctx, dead, c.Now())
	if err != nil || n == 0 {
		return n, err
	}
	what := "waiting"
	if dead {
		what = "waiting and dead"
	}
	return n, c.recordHand(ctx, fmt.Sprintf("clear the build queue: %s cancelled (%s)", Plural(n, "ask"), what), why, "build", "")
}

// ErrNoSource means a module names no source to build it from.
var ErrNoSource = errors.New("names no source")

// Rebuild asks again: a module's source (its default branch), or a build's
// repository and ref, under a new id; then as Build.
func (c *Builds) Rebuild(ctx context.Context, target string, r BuildRequest) (builds.Ask, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return builds.Ask{}, err
	}
	if strings.HasPrefix(target, "b-") {
		old, err := st.Builds.Get(ctx, target)
		if err != nil {
			return builds.Ask{}, err
		}
		r.Repository, r.Ref, r.Module, r.AgainOf = old.Repository, old.Ref, old.Module, old.ID
		return c.Build(ctx, r)
	}
	if err := CheckName(target); err != nil {
		return builds.Ask{}, err
	}
	m, err := st.Inventory.Module(ctx, target)
	if err != nil {
		return builds.Ask{}, err
	}
	if m.Source == "" {
		return builds.Ask{}, fmt.Errorf("module %s %w to build it from", target, ErrNoSource)
	}
	r.Repository, r.Module = m.Source, target
	return c.Build(ctx, r)
}

// BuildKill ends a build where it runs (its builder kills its process
// group) and records it killed by hand.
func (c *Builds) BuildKill(ctx context.Context, id, why string) (a builds.Ask, told bool, err error) {
	if strings.TrimSpace(why) == "" {
		return builds.Ask{}, false, errBuildWhy
	}
	st, err := c.stores(ctx)
	if err != nil {
		return builds.Ask{}, false, err
	}
	a, err = st.Builds.Kill(ctx, id, c.Now())
	if a = shownAsk(a); err != nil {
		return a, false, err
	}
	if err := c.recordHand(ctx, fmt.Sprintf("kill build %s on %s (%s)", a.ID, a.Builder, a.Repository), why, "build", ""); err != nil {
		return a, false, err
	}
	node, _, _ := strings.Cut(a.Builder, "/")
	if nc, err := c.dialBroker(ctx, st.Identity); err == nil {
		defer nc.Close()
		body, _ := json.Marshal(protocol.BuildKill{ID: a.ID})
		told = nc.Publish(protocol.BuildKillSubject(node), body) == nil && nc.FlushTimeout(protocol.AnswerTimeout) == nil
	}
	return a, told, nil
}

// BuildPause stops the build seat's holder on a node (every holder with
// node "") from being offered new asks, recorded as a hand act; what it
// builds now goes on.
func (c *Builds) BuildPause(ctx context.Context, node, why string) (builds.Pause, bool, error) {
	if strings.TrimSpace(why) == "" {
		return builds.Pause{}, false, errBuildWhy
	}
	holder := builds.Every
	st, err := c.stores(ctx)
	if err != nil {
		return builds.Pause{}, false, err
	}
	if node != "" {
		if err := CheckName(node); err != nil {
			return builds.Pause{}, false, err
		}
		if _, err := st.Inventory.Node(ctx, node); err != nil {
			return builds.Pause{}, false, err
		}
		holder = node
	}
	p, added, err := st.Builds.Pause(ctx, holder, why, c.Now())
	if err != nil || !added {
		return p, added, err
	}
	what := "every builder"
	if node != "" {
		what = "the builder on " + node
	}
	return p, added, c.recordHand(ctx, "pause "+what, why, "build", "")
}

// BuildResume lets a paused builder (every one with node "") take asks again.
func (c *Builds) BuildResume(ctx context.Context, node string) ([]builds.Pause, error) {
	holder := builds.Every
	if node != "" {
		if err := CheckName(node); err != nil {
			return nil, err
		}
		holder = node
	}
	st, err := c.stores(ctx)
	if err != nil {
		return nil, err
	}
	ps, err := st.Builds.Resume(ctx, holder)
	if err == nil {
		c.kickBuilds(ctx, st)
	}
	return ps, err
}

// kickBuilds tells a serving controller to offer the queue now.
func (c uses) kickBuilds(ctx context.Context, st *Stores) {
	if nc, err := c.dialBroker(ctx, st.Identity); err == nil {
		_ = nc.Publish(BuildKickSubject, []byte("{}"))
		_ = nc.FlushTimeout(protocol.AnswerTimeout)
		nc.Close()
	}
}

// BuilderIssue makes a broker user for a build machine on node whose host
// is not the reference host (or to replace the builder module's own): it
// may take the asks addressed to node, report on them and hand the
// controller their archives, nothing else. It returns a .creds document.
func (c *Builds) BuilderIssue(ctx context.Context, node string) (string, error) {
	if err := CheckName(node); err != nil {
		return "", err
	}
	st, err := c.stores(ctx)
	if err != nil {
		return "", err
	}
	if _, err := st.Inventory.Node(ctx, node); err != nil {
		return "", err
	}
	keys, err := brokerKeys(ctx, st.Identity)
	if err != nil {
		return "", err
	}
	userJWT, seed, err := keys.NewUser("builder on "+node, mergePermissions(broker.Permissions{Publish: []string{answerInboxes}, MaxPayload: memberMaxPayload}, builderPermissions(node)))
	if err != nil {
		return "", err
	}
	pub, err := broker.PublicOfSeed(seed)
	if err != nil {
		return "", err
	}
	// Kept, so that removing the node revokes it.
	if err := st.Identity.RecordIssuedUser(ctx, identity.IssuedUser{Pub: pub, Kind: "builder", Node: node}, c.Now()); err != nil {
		return "", err
	}
	return broker.Creds(userJWT, seed)
}

// ErrNoCommit means a build recorded no commit to replay.
var ErrNoCommit = errors.New("recorded no commit to build again")

// Replay builds a build's commit again: a dry run (built and looked at,
// never registered) unless register; with older, a version older than the
// current one may be registered. A registering replay is a hand act.
func (c *Builds) Replay(ctx context.Context, id string, register, older bool, why string, r BuildRequest) (builds.Ask, error) {
	if older && !register {
		return builds.Ask{}, errors.New("--older goes with --register")
	}
	if register && strings.TrimSpace(why) == "" {
		return builds.Ask{}, errBuildWhy
	}
	st, err := c.stores(ctx)
	if err != nil {
		return builds.Ask{}, err
	}
	old, err := st.Builds.Get(ctx, id)
	if err != nil {
		return builds.Ask{}, err
	}
	if old.Commit == "" {
		return builds.Ask{}, fmt.Errorf("build %s %w: replay one that got as far as its checkout", id, ErrNoCommit)
	}
	if register {
		if err := c.recordHand(ctx, fmt.Sprintf("replay build %s (%s at %s) to register it%s", id, inventory.RedactRepository(old.Repository), ShortID(old.Commit),
			map[bool]string{true: ", older allowed", false: ""}[older]), why, "build", ""); err != nil {
			return builds.Ask{}, err
		}
	}
	r.Repository, r.Ref, r.Module, r.AgainOf, r.DryRun, r.AllowOlder = old.Repository, old.Commit, old.Module, old.ID, !register, older
	return c.Build(ctx, r)
}
