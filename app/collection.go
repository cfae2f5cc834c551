package app

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/nats-io/nats.go"

	"mesh-controller/app/archive"
	"mesh-controller/contexts/inventory"
)

// CollectAfter is how long an archive nothing holds is kept before the
// sweep may let it go: time to replay, register by hand, or look at it.
const CollectAfter = 7 * 24 * time.Hour

// leftoverAfter is how long the chunks of a put that never ended are
// kept: a put under way looks the same until it ends.
const leftoverAfter = 24 * time.Hour

// KeptArchive is one archive in the collection.
type KeptArchive struct {
	Digest   string    `json:"digest"`
	Bytes    int64     `json:"bytes"`
	StoredAt time.Time `json:"stored_at"`
	// Held are the registered versions whose archive it is, module@version.
	Held []string `json:"held"`
	// Current and Previous say it is a module's current or previous
	// version's archive.
	Current  bool `json:"current"`
	Previous bool `json:"previous"`
	// ReturnTo says a rollback of its module's last roll-out may return
	// nodes to a version it holds: kept until a later roll-out supersedes it.
	ReturnTo bool `json:"return_to,omitempty"`
	// RunOn are the nodes whose host reports running a version it holds.
	RunOn []string `json:"run_on"`
	// DeclaredTo are the nodes it is declared to as their host release
	// (held by mesh-host@VERSION).
	DeclaredTo []string `json:"declared_to,omitempty"`
	// MayGo says the sweep may let it go; Why says why it may, or why
	// it is kept.
	MayGo bool   `json:"may_go"`
	Why   string `json:"why"`
}

// Leftover is what a put that never ended left in the object store.
type Leftover struct {
	Subject string    `json:"subject"`
	Chunks  uint64    `json:"chunks"`
	LastAt  time.Time `json:"last_at"`
	MayGo   bool      `json:"may_go"`
}

// Collection is every kept archive and what the sweep may let go.
type Collection struct {
	Archives  []KeptArchive `json:"archives"`
	Leftovers []Leftover    `json:"leftovers"`
	// Bytes are all the archives'; MayGoBytes, those the sweep may let go.
	Bytes      int64 `json:"bytes"`
	MayGoBytes int64 `json:"may_go_bytes"`
	// CollectAfterHours is how old an archive nothing holds must be before
	// it may go.
	CollectAfterHours float64 `json:"collect_after_hours"`
}

// Collection reads the kept archives from the broker's object store (a
// controller must serve) and judges each: held by a registered version or
// a host release, run on a node, its age; what may go is unheld, run
// nowhere, older than CollectAfter, and never a module's current or
// previous version, nor one its last roll-out may return nodes to, nor a
// host release a node runs, is declared, or the hosts' last roll-out may
// return nodes to.
func (c *Modules) Collection(ctx context.Context) (Collection, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return Collection{}, err
	}
	nc, err := c.dialBroker(ctx, st.Identity)
	if err != nil {
		return Collection{}, fmt.Errorf("the archives are kept by the serving controller's broker, and %w", err)
	}
	defer nc.Close()
	return c.collection(ctx, nc)
}

func (c uses) collection(ctx context.Context, nc *nats.Conn) (Collection, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return Collection{}, err
	}
	stored, leftovers, err := archive.List(ctx, nc)
	if err != nil {
		return Collection{}, err
	}
	versions, err := st.Inventory.BuiltVersions(ctx, "")
	if err != nil {
		return Collection{}, err
	}
	running, err := st.Health.ModuleStates(ctx, "")
	if err != nil {
		return Collection{}, err
	}
	returnTo, err := st.Inventory.RollOutFromVersions(ctx)
	if err != nil {
		return Collection{}, err
	}
	releases, err := st.Inventory.HostReleases(ctx)
	if err != nil {
		return Collection{}, err
	}
	nodes, err := st.Inventory.Nodes(ctx)
	if err != nil {
		return Collection{}, err
	}
	// What runs where is what hosts report: the archive each runs from
	// (a rebuild replaces a version's archive while hosts still run the
	// old one), or, from a host that does not say, its version's.
	runOn := map[string][]string{}      // module@version → nodes
	runsDigest := map[string][]string{} // archive digest → nodes
	for _, m := range running {
		if m.Archive != "" {
			runsDigest[m.Archive] = append(runsDigest[m.Archive], m.Node)
			continue
		}
		runOn[m.Module+"@"+m.Version] = append(runOn[m.Module+"@"+m.Version], m.Node)
	}
	byDigest := map[string]*KeptArchive{}
	now := c.Now()
	out := Collection{Archives: []KeptArchive{}, Leftovers: []Leftover{}, CollectAfterHours: CollectAfter.Hours()}
	for _, s := range stored {
		out.Archives = append(out.Archives, KeptArchive{Digest: s.Digest, Bytes: s.Bytes, StoredAt: s.StoredAt, Held: []string{}, RunOn: []string{}})
	}
	for i := range out.Archives {
		byDigest[out.Archives[i].Digest] = &out.Archives[i]
	}
	for _, v := range versions {
		k := byDigest[v.Archive.Digest]
		if k == nil {
			continue // registered, its archive gone: the host says so if declared it
		}
		mv := v.Module + "@" + v.Version
		k.Held = append(k.Held, mv)
		k.Current = k.Current || v.Current
		k.Previous = k.Previous || v.Previous
		k.ReturnTo = k.ReturnTo || slices.Contains(returnTo[v.Module], v.Version)
		k.RunOn = append(k.RunOn, runOn[mv]...)
	}
	for _, r := range releases {
		k := byDigest[r.Archive.Digest]
		if k == nil {
			continue // kept, its archive gone: a host declared it says so
		}
		k.Held = append(k.Held, hostRolled.label+"@"+r.Version)
		k.ReturnTo = k.ReturnTo || slices.Contains(returnTo[inventory.HostRollOut], r.Version)
		for _, n := range nodes {
			if n.HostVersion == r.Version {
				k.RunOn = append(k.RunOn, n.Name)
			}
			if n.HostRelease == r.Version {
				k.DeclaredTo = append(k.DeclaredTo, n.Name)
			}
		}
	}
	for i := range out.Archives {
		k := &out.Archives[i]
		k.RunOn = append(k.RunOn, runsDigest[k.Digest]...)
		sort.Strings(k.RunOn)
		k.RunOn = slices.Compact(k.RunOn)
		age := now.Sub(k.StoredAt)
		switch {
		case k.Current:
			k.Why = "a module's current version"
		case k.ReturnTo:
			k.Why = "a version its module's last roll-out may return nodes to"
		case len(k.DeclaredTo) > 0:
			k.Why = "a host release declared to " + Plural(len(k.DeclaredTo), "node")
		case k.Previous:
			k.Why = "a module's previous version"
		case len(k.RunOn) > 0:
			k.Why = "run on " + fmt.Sprint(len(k.RunOn)) + " node(s)"
		case len(k.Held) > 0:
			k.Why = "held by a registered version"
		case age < CollectAfter:
			k.Why = fmt.Sprintf("held by nothing, and kept until %s old (it is %s)", CollectAfter, age.Round(time.Minute))
		default:
			k.MayGo, k.Why = true, fmt.Sprintf("held by nothing, run nowhere, %s old", age.Round(time.Hour))
		}
		out.Bytes += k.Bytes
		if k.MayGo {
			out.MayGoBytes += k.Bytes
		}
	}
	for _, l := range leftovers {
		out.Leftovers = append(out.Leftovers, Leftover{Subject: l.Subject, Chunks: l.Chunks, LastAt: l.LastAt,
			MayGo: !l.LastAt.IsZero() && now.Sub(l.LastAt) >= leftoverAfter})
	}
	return out, nil
}

// SweepResult is what one sweep let go.
type SweepResult struct {
	Archives, Leftovers int
	Bytes               int64
	// Builds and Plans are the ended builds and plans pruned.
	Builds, Plans int
}

// String is the sweep's log line.
func (r SweepResult) String() string {
	return fmt.Sprintf("the sweep let go %s (%s) and %s of puts that never ended; pruned %s and %s",
		Plural(r.Archives, "archive"), Plural(r.Bytes, "byte"), Plural(r.Leftovers, "leftover"), Plural(r.Builds, "ended build"), Plural(r.Plans, "ended plan"))
}

// How much of the builds record the sweep keeps: per module the newest
// keepBuilds (and always its latest and latest registered), and every
// build and ended plan younger than buildsWindow.
const (
	keepBuilds   = 100
	keepPlans    = 100
	buildsWindow = 90 * 24 * time.Hour
)

// Sweep lets go what the collection says may go (archives, and leftovers
// of puts that never ended), and prunes the builds record: serve runs it
// once a day, over its own connection to the broker.
func (c *Modules) Sweep(ctx context.Context, nc *nats.Conn) (SweepResult, error) {
	var r SweepResult
	col, err := c.collection(ctx, nc)
	if err != nil {
		return r, err
	}
	for _, k := range col.Archives {
		if !k.MayGo {
			continue
		}
		if err := archive.Delete(ctx, nc, k.Digest); err != nil {
			return r, err
		}
		r.Archives++
		r.Bytes += k.Bytes
	}
	for _, l := range col.Leftovers {
		if !l.MayGo {
			continue
		}
		if err := archive.PurgeLeftover(ctx, nc, l.Subject); err != nil {
			return r, err
		}
		r.Leftovers++
	}
	st, err := c.stores(ctx)
	if err != nil {
		return r, err
	}
	before := c.Now().Add(-buildsWindow)
	if r.Builds, err = st.Builds.Prune(ctx, keepBuilds, before); err != nil {
		return r, err
	}
	r.Plans, err = st.Builds.PrunePlans(ctx, keepPlans, before)
	return r, err
}
