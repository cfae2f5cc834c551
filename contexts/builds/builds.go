// Package builds owns the build queue and the record of builds: each ask
// from the moment it is asked, through the builder that took it, to its
// outcome; the holders of the build seat that are paused; and the builds
// store. It imports no other context: a builder is named by its node and
// module, a module by its name.
package builds

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"mesh-controller/embedded/sqlite"
)

// State is where an ask stands.
type State string

// The states of an ask. Waiting, in flight and dead asks are open (they
// are the queue); the others have ended and never change again, except a
// done build that is later registered or superseded.
const (
	// Waiting: asked, and no builder has it.
	Waiting State = "waiting"
	// InFlight: a builder took it and has not answered yet.
	InFlight State = "in-flight"
	// Done: built; its outcome is kept, and it may be registered.
	Done State = "done"
	// Failed: the builder said why it could not be built.
	Failed State = "failed"
	// Dead: nobody took it, or nobody answered, within its bounds and
	// tries. A late outcome is still recorded.
	Dead State = "dead"
	// Superseded: built, and not registered because the mesh holds a
	// newer commit of the module.
	Superseded State = "superseded"
	// Cancelled: dropped by hand (cancel, clear) before a builder had it.
	Cancelled State = "cancelled"
	// Killed: ended by hand where it ran.
	Killed State = "killed"
)

// Open says the ask is in the queue: waiting, in flight or dead.
func (s State) Open() bool { return s == Waiting || s == InFlight || s == Dead }

// Limits on what one outcome keeps, so that a builder, whatever it sends,
// cannot grow the store without bound.
const (
	// LogTailLines is how many of a build log's last lines are kept.
	LogTailLines = 50
	// MaxLineBytes bounds one kept log line or problem.
	MaxLineBytes = 4096
	// MaxWhyBytes bounds the one line that says why.
	MaxWhyBytes = 1024
	// MaxProblems bounds how many of a manifest's problems are kept.
	MaxProblems = 200
)

// DefaultListLimit is how many builds List returns when its filter says
// no limit: builds lately, not all of history.
const DefaultListLimit = 50

var (
	// ErrNotFound means no build has that id.
	ErrNotFound = sqlite.Refusal("no build has that id")
	// ErrBadID means an id is not a build id (b-<unix-millis>-<random>).
	ErrBadID = sqlite.Refusal("is not a build id (b-<unix-millis>-<random>)")
	// ErrExists means a build has that id already.
	ErrExists = sqlite.Refusal("a build has that id already")
	// ErrNoRepository means an ask named no repository.
	ErrNoRepository = sqlite.Refusal("an ask must name a repository")
	// ErrNotWaiting means only a waiting ask may be taken.
	ErrNotWaiting = sqlite.Refusal("it is not waiting")
	// ErrInFlight means the ask is in flight: it can be killed, not cancelled.
	ErrInFlight = sqlite.Refusal("it is in flight")
	// ErrNotInFlight means the act is for an ask in flight only.
	ErrNotInFlight = sqlite.Refusal("it is not in flight")
	// ErrEnded means the ask ended already (done, failed, superseded,
	// cancelled or killed) and takes no outcome or act that would change it.
	ErrEnded = sqlite.Refusal("it has ended already")
	// ErrNotDone means only a done build may be registered or superseded.
	ErrNotDone = sqlite.Refusal("it is not a done build")
	// ErrDryRun means a dry run is looked at, never taken in.
	ErrDryRun = sqlite.Refusal("it is a dry run: looked at, never taken in")
	// ErrRegistered means a registered build cannot be superseded.
	ErrRegistered = sqlite.Refusal("it is registered already")
	// ErrNotPaused means the holder was not paused (by itself).
	ErrNotPaused = sqlite.Refusal("is not paused")
	// ErrNoHolder means a pause named no holder.
	ErrNoHolder = sqlite.Refusal("a pause must name a node, or * for every holder")
)

// Ask is one build ask and, once a builder answered, its outcome.
type Ask struct {
	ID         string `json:"id"`
	Repository string `json:"repository"`
	Ref        string `json:"ref"`
	// Module is known when the ask names it (rebuild, plans) or once built.
	Module string `json:"module"`
	DryRun bool   `json:"dry_run"`
	// Plan is the build plan the ask is a step of, "" if none.
	Plan string `json:"plan"`
	// AgainOf is the ask this one asks again (rebuild, replay, a dead ask
	// re-asked), "" for a first ask.
	AgainOf string `json:"again_of"`
	// AllowOlder lets it register a version older than the current one
	// (replay --register --older).
	AllowOlder bool  `json:"allow_older"`
	State      State `json:"state"`
	// Builder is the node/module that last took the ask.
	Builder string    `json:"builder"`
	AskedAt time.Time `json:"asked_at"`
	// TakenAt is when the last try was taken.
	TakenAt *time.Time `json:"taken_at"`
	// FinishedAt is when the ask ended or died; nil while waiting or in flight.
	FinishedAt *time.Time `json:"finished_at"`
	// Tries counts the tries given up because no outcome came in time.
	Tries int `json:"tries"`
	// LastTryAt is when a try was last given up; the waiting bound counts
	// from it.
	LastTryAt *time.Time `json:"last_try_at"`
	// Late says the outcome came from a try already given up: while the
	// ask was waiting again or dead, or from a builder other than the one
	// that had it in flight.
	Late bool `json:"late"`

	Commit string `json:"commit"`
	// CommitAt is when its commit was made (the committer's time), nil
	// when the builder did not say.
	CommitAt *time.Time `json:"commit_at"`
	Version  string     `json:"version"`
	Digest   string     `json:"digest"`
	Bytes    int64      `json:"bytes"`
	// UnpackedBytes is what its archive unpacks to, as its builder said
	// (0 for builds from before it was kept).
	UnpackedBytes int64   `json:"unpacked_bytes"`
	DurationMS    float64 `json:"duration_ms"`
	// Why is one line: why it failed, was superseded, cancelled, killed
	// or died.
	Why        string `json:"why"`
	Registered bool   `json:"registered"`
	// Details are the outcome's bulky parts. Get and the acts return them
	// (an empty Details when no outcome came); the lists leave them out
	// (nil), so that reading the queue or the builds lately stays cheap.
	Details *Details `json:"details,omitempty"`
}

// Details are the bulky parts of an outcome.
type Details struct {
	// Problems are the manifest's problems, every one (up to MaxProblems).
	Problems []string `json:"problems"`
	// LogTail is the build log's last lines (up to LogTailLines).
	LogTail []string `json:"log_tail"`
	// Manifest is mesh.json as built, nil when there was none.
	Manifest json.RawMessage `json:"manifest,omitempty"`
}

// Outcome is what a builder reported for an ask (protocol.md,
// mesh.build.result).
type Outcome struct {
	Failed bool
	// On is the builder that built it (node/module); "" keeps the taker.
	On string
	// Module is the built manifest's module; "" keeps the ask's.
	Module string
	Commit string
	// CommitAt is the commit's committer time; zero when not known.
	CommitAt time.Time
	Version  string
	Digest   string
	Bytes    int64
	// UnpackedBytes is what the archive unpacks to: the sum of its
	// regular files' sizes.
	UnpackedBytes int64
	DurationMS    float64
	Why           string
	Problems      []string
	LogTail       []string
	Manifest      json.RawMessage
}

// Store is the builds context's store.
type Store struct {
	db *sqlite.DB
}

// said is err as the act it came from says it: a refusal as "<act>:
// <refusal>", since the act names the build or plan the refusal is about
// ("cancel build b-…: it has ended already"); anything else as Failed says
// it ("builds store: cancel build b-…: database is locked").
func (s *Store) said(err error, act string, args ...any) error {
	if sqlite.IsRefusal(err) {
		return fmt.Errorf(act+": %w", append(args, err)...)
	}
	return s.db.Failed(err, act, args...)
}

// NewStore wraps an open, migrated builds store.
func NewStore(db *sqlite.DB) *Store { return &Store{db: db} }

// NewID makes a build id, b-<unix-millis>-<random>: it carries the time it
// was asked, so an outcome can be matched to the asks before it, and ids
// sort as their times do (the millis have 13 digits from 2001 to 2286).
// 48 random bits make two ids of one millisecond differ.
func NewID(now time.Time) string {
	var b [6]byte
	rand.Read(b[:]) // never fails: crypto/rand crashes the program rather than return an error
	return fmt.Sprintf("b-%d-%s", now.UnixMilli(), hex.EncodeToString(b[:]))
}

// IDTime is the time a build id carries; ErrBadID if it is not one.
func IDTime(id string) (time.Time, error) {
	rest, ok := strings.CutPrefix(id, "b-")
	millis, random, ok2 := strings.Cut(rest, "-")
	ms, err := strconv.ParseInt(millis, 10, 64)
	digits := millis != "" && !strings.ContainsFunc(millis, func(r rune) bool { return r < '0' || r > '9' })
	if !ok || !ok2 || err != nil || !digits || random == "" || len(id) > 64 || strings.ContainsFunc(random, notIDRune) {
		return time.Time{}, fmt.Errorf("%q %w", id, ErrBadID)
	}
	return time.UnixMilli(ms).UTC(), nil
}

// notIDRune is what the random part of an id may not hold: ids name work
// dirs and subjects, so letters, digits, - and _ only.
func notIDRune(r rune) bool {
	return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_')
}

// describe says where an ask stands, for a refusal: "in flight on web1/builder since …".
func describe(a Ask) string {
	at := func(t *time.Time) string {
		if t == nil {
			return "?"
		}
		return sqlite.FormatTime(*t)
	}
	switch a.State {
	case Waiting:
		since := a.AskedAt
		if a.LastTryAt != nil {
			since = *a.LastTryAt
		}
		s := "waiting since " + sqlite.FormatTime(since)
		if a.Tries > 0 {
			s += fmt.Sprintf(", %d tries given up", a.Tries)
		}
		return s
	case InFlight:
		return fmt.Sprintf("in flight on %s since %s", a.Builder, at(a.TakenAt))
	case Killed:
		return fmt.Sprintf("killed on %s at %s", a.Builder, at(a.FinishedAt))
	}
	// Done, failed, superseded, cancelled, dead: each says why, if it can.
	s := fmt.Sprintf("%s at %s", a.State, at(a.FinishedAt))
	if a.Registered {
		s += ", registered"
	}
	if a.Why != "" {
		s += ": " + a.Why
	}
	return s
}
