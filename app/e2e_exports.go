package app

// What the end-to-end suite (app/e2e) reaches beyond the use cases: a
// test there starts from the stores and broker as the daemon has them, or
// steps one of its loops by hand instead of waiting out its interval. Kept
// to one file so that the suite's reach into app is seen at a glance.

import (
	"context"
	"regexp"
	"time"

	"github.com/nats-io/nats.go"

	"mesh-controller/app/daemon"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/builds"
	"mesh-controller/contexts/identity"
	"mesh-controller/contexts/inventory"
	"mesh-controller/contexts/licences"
	"mesh-controller/embedded/broker"
)

// DialBroker connects to the mesh's broker as the controller does, for a
// test that publishes or listens on its subjects.
func (c *Nodes) DialBroker(ctx context.Context, ids *identity.Store) (*nats.Conn, error) {
	return c.dialBroker(ctx, ids)
}

// CatchUp runs serve's catch-up once, as at its start.
func (c *Server) CatchUp(ctx context.Context, nc *nats.Conn, ask daemon.CatchUpAsk) ([]daemon.Declared, int, error) {
	return c.catchUp(ctx, nc, ask)
}

// KickBuilds wakes the build queue now rather than at its next tick.
func (c *Builds) KickBuilds(ctx context.Context, st *Stores) { c.kickBuilds(ctx, st) }

// FollowPlan follows a build plan as serve does.
func (c *Builds) FollowPlan(ctx context.Context, p builds.Plan, progress func(string)) (builds.Plan, error) {
	return c.followPlan(ctx, p, progress)
}

// KeepRefreshed stores a refreshed licence value as serve's refresher does.
func (c *Licences) KeepRefreshed(ctx context.Context, st *Stores, l licences.Licence, v protocol.Secret, expires time.Time) (int64, time.Time, error) {
	return c.keepRefreshed(ctx, st, l, v, expires)
}

// BrokerKeys are the mesh's broker keys, for a broker run outside serve.
func BrokerKeys(ctx context.Context, ids *identity.Store) (broker.Keys, error) {
	return brokerKeys(ctx, ids)
}

// JoinUser is the broker user joining nodes connect as.
func JoinUser() broker.JoinUser { return joinUser() }

// DeclarationSigner signs a declaration with key as the controller does.
func DeclarationSigner(key identity.SigningKey, body protocol.Declaration) inventory.Signer {
	return (&declarer{key: key}).signer(body)
}

// TakeChanges are what differs between two previews of a take.
func TakeChanges(old, now TakePreview) []string { return changes(old, now) }

// CompareListeners orders listener names as the unmanaged-listener
// condition shows them.
func CompareListeners(a, b string) int { return compareListeners(a, b) }

// BackupName matches the names of scheduled backup files.
var BackupName *regexp.Regexp = backupName

// FencedContexts are the contexts whose stores keep a fence: every one.
var FencedContexts = fencedContexts

const (
	// BackupTimeLayout is the time in a scheduled backup's name.
	BackupTimeLayout = backupTimeLayout
	// AskWaitBound is how long a build ask waits for a builder.
	AskWaitBound = askWaitBound
	// BuildTryMargin is what a build try gets beyond its timeout.
	BuildTryMargin = buildTryMargin
	// UnmanagedShown is how many unmanaged listeners a condition names.
	UnmanagedShown = unmanagedShown
)
