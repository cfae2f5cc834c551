package builds

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"mesh-controller/embedded/sqlite"
	"mesh-controller/embedded/sqlite/sqlitetest"
)

var t0 = time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)

// open is a real, migrated builds store under t.TempDir().
func open(t testing.TB) *Store {
	t.Helper()
	db, _ := sqlitetest.Open(t, "builds")
	return NewStore(db)
}

// must fails the test on an error and returns the value.
func must[T any](t testing.TB) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func TestNewID(t *testing.T) {
	t.Run("carries its time", func(t *testing.T) {
		at := time.Date(2026, 11, 29, 10, 0, 0, 123e6, time.UTC)
		id := NewID(at)
		if !strings.HasPrefix(id, "b-1795946400123-") {
			t.Fatalf("id %s", id)
		}
		got, err := IDTime(id)
		if err != nil || !got.Equal(at) {
			t.Fatalf("IDTime(%s) = %v, %v", id, got, err)
		}
	})
	t.Run("sortable by time", func(t *testing.T) {
		var ids []string
		for _, d := range []time.Duration{0, time.Millisecond, time.Second, time.Hour, 24 * time.Hour, 400 * 24 * time.Hour, 100 * 365 * 24 * time.Hour} {
			ids = append(ids, NewID(t0.Add(d)))
		}
		if !slices.IsSorted(ids) {
			t.Fatalf("not in time order: %v", ids)
		}
	})
	t.Run("unique within one millisecond", func(t *testing.T) {
		seen := map[string]bool{}
		for range 10000 {
			id := NewID(t0)
			if seen[id] {
				t.Fatalf("%s made twice", id)
			}
			seen[id] = true
		}
	})
	t.Run("not ids", func(t *testing.T) {
		for _, id := range []string{"", "b-", "b-123", "b-123-", "x-123-abc", "b-12a-abc", "b-+12-abc", "b--12-abc", "b-123-a/b", "b-123-a b", "b-1-" + strings.Repeat("a", 64)} {
			if _, err := IDTime(id); !errors.Is(err, ErrBadID) {
				t.Errorf("%q: %v", id, err)
			}
		}
	})
}

func TestStore_Enqueue(t *testing.T) {
	s := open(t)
	ctx := context.Background()
	a := must[Ask](t)(s.Enqueue(ctx, Ask{Repository: "/src/hello.git", Ref: "main", Module: "hello", Plan: "p-1", AgainOf: "b-1-x",
		State: Done, Registered: true, Commit: "ignored"}, t0))
	if at, err := IDTime(a.ID); err != nil || !at.Equal(t0) {
		t.Fatalf("id %s: %v %v", a.ID, at, err)
	}
	if a.State != Waiting || a.Repository != "/src/hello.git" || a.Ref != "main" || a.Module != "hello" || a.Plan != "p-1" || a.AgainOf != "b-1-x" ||
		!a.AskedAt.Equal(t0) || a.TakenAt != nil || a.FinishedAt != nil || a.Registered || a.Commit != "" ||
		a.Details == nil || len(a.Details.Problems) != 0 || a.Details.LogTail == nil || a.Details.Manifest != nil {
		t.Fatalf("kept %+v", a)
	}
	if got := must[Ask](t)(s.Get(ctx, a.ID)); !sameAsk(got, a) {
		t.Fatalf("read back %+v, want %+v", got, a)
	}
	t.Run("given id", func(t *testing.T) {
		id := NewID(t0.Add(-time.Minute))
		b := must[Ask](t)(s.Enqueue(ctx, Ask{ID: id, Repository: "r", DryRun: true}, t0))
		if b.ID != id || !b.DryRun {
			t.Fatalf("%+v", b)
		}
		if _, err := s.Enqueue(ctx, Ask{ID: id, Repository: "r"}, t0); !errors.Is(err, ErrExists) {
			t.Fatalf("twice: %v", err)
		}
	})
	t.Run("refused", func(t *testing.T) {
		if _, err := s.Enqueue(ctx, Ask{Repository: ""}, t0); !errors.Is(err, ErrNoRepository) {
			t.Fatalf("no repository: %v", err)
		}
		if _, err := s.Enqueue(ctx, Ask{ID: "../x", Repository: "r"}, t0); !errors.Is(err, ErrBadID) {
			t.Fatalf("bad id: %v", err)
		}
	})
	t.Run("unknown", func(t *testing.T) {
		if _, err := s.Get(ctx, "b-1-nope"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("get: %v", err)
		}
		for name, act := range map[string]func() error{
			"take":   func() error { _, err := s.Take(ctx, "b-1-nope", "web1/builder", t0); return err },
			"finish": func() error { _, err := s.Finish(ctx, "b-1-nope", Outcome{}, t0); return err },
			"cancel": func() error { _, err := s.Cancel(ctx, "b-1-nope", t0); return err },
			"kill":   func() error { _, err := s.Kill(ctx, "b-1-nope", t0); return err },
		} {
			if err := act(); !errors.Is(err, ErrNotFound) {
				t.Errorf("%s: %v", name, err)
			}
		}
	})
}

// sameAsk compares asks read from the store: times parsed from the same
// text are equal structs.
func sameAsk(a, b Ask) bool { return reflect.DeepEqual(a, b) }

// built is a done outcome of module hello.
func built(on string) Outcome {
	return Outcome{On: on, Module: "hello", Commit: "c0ffee", Version: "1.0.0", Digest: "ab12", Bytes: 1234, UnpackedBytes: 5678, DurationMS: 2500,
		LogTail: []string{"go build", "builder: built"}, Manifest: []byte(`{"name": "hello", "version": "1.0.0"}`)}
}

// askIn makes, in its own store, an ask that stands in state (a dry run
// if dry), taken by web1/builder where it was taken.
func askIn(t *testing.T, state State, dry bool) (*Store, Ask) {
	t.Helper()
	s := open(t)
	ctx := context.Background()
	a := must[Ask](t)(s.Enqueue(ctx, Ask{Repository: "/src/hello.git", Module: "hello", DryRun: dry}, t0))
	take := func() { a = must[Ask](t)(s.Take(ctx, a.ID, "web1/builder", t0.Add(time.Minute))) }
	finish := func(failed bool) {
		o := built("")
		o.Failed = failed
		a = must[Ask](t)(s.Finish(ctx, a.ID, o, t0.Add(2*time.Minute)))
	}
	switch state {
	case Waiting:
	case InFlight:
		take()
	case Done:
		take()
		finish(false)
	case Failed:
		take()
		finish(true)
	case Dead:
		dead := must[[]Ask](t)(s.ExpireWaiting(ctx, time.Hour, t0.Add(2*time.Hour)))
		a = dead[0]
	case Superseded:
		take()
		finish(false)
		a = must[Ask](t)(s.MarkSuperseded(ctx, a.ID, "1.1.0 is registered from a newer commit"))
	case Cancelled:
		a = must[Ask](t)(s.Cancel(ctx, a.ID, t0.Add(time.Minute)))
	case Killed:
		take()
		a = must[Ask](t)(s.Kill(ctx, a.ID, t0.Add(2*time.Minute)))
	}
	if a.State != state {
		t.Fatalf("made %s, want %s", a.State, state)
	}
	return s, a
}

// Every act from every state: the ones allowed and what they make, each
// refused one with its sentinel and the words that say where the ask stands.
func TestStore_Transitions(t *testing.T) {
	ctx := context.Background()
	now := t0.Add(3 * time.Minute)
	all := []State{Waiting, InFlight, Done, Failed, Dead, Superseded, Cancelled, Killed}
	type want struct {
		state State          // after an allowed act
		check func(Ask) bool // more about the ask after it
		err   error          // the refusal
		says  string         // in the refusal's message
	}
	acts := []struct {
		name    string
		do      func(s *Store, id string) (Ask, error)
		want    map[State]want // states not named are refused with refused
		refused error
	}{
		{"take", func(s *Store, id string) (Ask, error) { return s.Take(ctx, id, "web2/builder", now) },
			map[State]want{Waiting: {state: InFlight, check: func(a Ask) bool { return a.Builder == "web2/builder" && a.TakenAt.Equal(now) }}},
			ErrNotWaiting},
		{"finish done", func(s *Store, id string) (Ask, error) { return s.Finish(ctx, id, built(""), now) },
			map[State]want{
				InFlight: {state: Done, check: func(a Ask) bool { return !a.Late && a.Builder == "web1/builder" && a.FinishedAt.Equal(now) }},
				Waiting:  {state: Done, check: func(a Ask) bool { return a.Late && a.Version == "1.0.0" }},
				Dead:     {state: Done, check: func(a Ask) bool { return a.Late && a.Why == "" && a.FinishedAt.Equal(now) }},
			}, ErrEnded},
		{"finish failed", func(s *Store, id string) (Ask, error) {
			return s.Finish(ctx, id, Outcome{Failed: true, Why: "exit status 2", On: "web3/builder"}, now)
		},
			map[State]want{
				InFlight: {state: Failed, check: func(a Ask) bool { return a.Late && a.Builder == "web3/builder" && a.Why == "exit status 2" }},
				Waiting:  {state: Failed, check: func(a Ask) bool { return a.Late }},
				Dead:     {state: Failed, check: func(a Ask) bool { return a.Late }},
			}, ErrEnded},
		{"register", func(s *Store, id string) (Ask, error) { return s.MarkRegistered(ctx, id) },
			map[State]want{Done: {state: Done, check: func(a Ask) bool { return a.Registered }}},
			ErrNotDone},
		{"supersede", func(s *Store, id string) (Ask, error) { return s.MarkSuperseded(ctx, id, "older than\n1.1.0") },
			map[State]want{Done: {state: Superseded, check: func(a Ask) bool { return a.Why == "older than 1.1.0" && !a.Registered }}},
			ErrNotDone},
		{"cancel", func(s *Store, id string) (Ask, error) { return s.Cancel(ctx, id, now) },
			map[State]want{
				Waiting:  {state: Cancelled, check: func(a Ask) bool { return a.FinishedAt.Equal(now) && a.Why == "cancelled by hand" }},
				Dead:     {state: Cancelled, check: func(a Ask) bool { return a.FinishedAt.Equal(now) }},
				InFlight: {err: ErrInFlight, says: "it is in flight on web1/builder since 2026-11-29T10:01:00.000Z"},
			}, ErrEnded},
		{"kill", func(s *Store, id string) (Ask, error) { return s.Kill(ctx, id, now) },
			map[State]want{InFlight: {state: Killed, check: func(a Ask) bool { return a.Builder == "web1/builder" && a.Why == "killed by hand" }}},
			ErrNotInFlight},
		{"requeue", func(s *Store, id string) (Ask, error) { return s.Requeue(ctx, id, now) },
			map[State]want{InFlight: {state: Waiting, check: func(a Ask) bool { return a.Tries == 1 && a.LastTryAt.Equal(now) && a.FinishedAt == nil }}},
			ErrNotInFlight},
	}
	// What a refusal says of where the ask stands, by state.
	says := map[State]string{
		Waiting:    "waiting since 2026-11-29T10:00:00.000Z",
		InFlight:   "in flight on web1/builder since 2026-11-29T10:01:00.000Z",
		Done:       "done at 2026-11-29T10:02:00.000Z",
		Failed:     "failed at 2026-11-29T10:02:00.000Z",
		Dead:       "dead at 2026-11-29T12:00:00.000Z: no builder took it within 1h0m0s",
		Superseded: "superseded at 2026-11-29T10:02:00.000Z: 1.1.0 is registered from a newer commit",
		Cancelled:  "cancelled at 2026-11-29T10:01:00.000Z: cancelled by hand",
		Killed:     "killed on web1/builder at 2026-11-29T10:02:00.000Z",
	}
	for _, act := range acts {
		for _, from := range all {
			t.Run(act.name+" "+string(from), func(t *testing.T) {
				t.Parallel() // each on a store of its own
				s, a := askIn(t, from, false)
				w, ok := act.want[from]
				if !ok {
					w = want{err: act.refused, says: says[from]}
				}
				got, err := act.do(s, a.ID)
				if w.err != nil {
					if !errors.Is(err, w.err) || !strings.Contains(err.Error(), w.says) || !strings.Contains(err.Error(), a.ID) {
						t.Fatalf("got %v, want %v saying %q and the id", err, w.err, w.says)
					}
					if after := must[Ask](t)(s.Get(ctx, a.ID)); !sameAsk(after, a) {
						t.Fatalf("a refused act changed the ask:\n%+v\n%+v", after, a)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if got.State != w.state || (w.check != nil && !w.check(got)) {
					t.Fatalf("got %+v, want %s", got, w.state)
				}
				if read := must[Ask](t)(s.Get(ctx, a.ID)); !sameAsk(read, got) {
					t.Fatalf("returned %+v, kept %+v", got, read)
				}
			})
		}
	}
	t.Run("a dry run is never registered", func(t *testing.T) {
		s, a := askIn(t, Done, true)
		if _, err := s.MarkRegistered(ctx, a.ID); !errors.Is(err, ErrDryRun) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("registered twice changes nothing", func(t *testing.T) {
		s, a := askIn(t, Done, false)
		first := must[Ask](t)(s.MarkRegistered(ctx, a.ID))
		again := must[Ask](t)(s.MarkRegistered(ctx, a.ID))
		if !sameAsk(first, again) || !again.Registered {
			t.Fatalf("%+v\n%+v", first, again)
		}
		if _, err := s.MarkSuperseded(ctx, a.ID, "x"); !errors.Is(err, ErrRegistered) {
			t.Fatalf("superseded once registered: %v", err)
		}
	})
}

// A builder that dies mid-build: its ask goes back to waiting after its
// bound, is taken again, and after maxTries is dead; the dying builder's
// outcome, heard late, is still recorded.
func TestStore_ExpireInFlight(t *testing.T) {
	s := open(t)
	ctx := context.Background()
	const bound, maxTries = 10 * time.Minute, 3
	a := must[Ask](t)(s.Enqueue(ctx, Ask{Repository: "r", Module: "hello"}, t0))
	other := must[Ask](t)(s.Enqueue(ctx, Ask{Repository: "r2"}, t0))
	now := t0
	for try := 1; try <= maxTries; try++ {
		must[Ask](t)(s.Take(ctx, a.ID, "web1/builder", now))
		// Within its bound, nothing moves.
		if r, d, err := s.ExpireInFlight(ctx, bound, maxTries, now.Add(bound)); err != nil || len(r)+len(d) != 0 {
			t.Fatalf("try %d within its bound: %v %v %v", try, r, d, err)
		}
		now = now.Add(bound + time.Second)
		requeued, dead, err := s.ExpireInFlight(ctx, bound, maxTries, now)
		if err != nil {
			t.Fatal(err)
		}
		if try < maxTries {
			if len(dead) != 0 || len(requeued) != 1 || requeued[0].State != Waiting || requeued[0].Tries != try || !requeued[0].LastTryAt.Equal(now) {
				t.Fatalf("try %d: requeued %+v dead %+v", try, requeued, dead)
			}
			continue
		}
		if len(requeued) != 0 || len(dead) != 1 || dead[0].State != Dead || dead[0].Tries != maxTries || !dead[0].FinishedAt.Equal(now) ||
			dead[0].Why != "no outcome within 10m0s, 3 tries" {
			t.Fatalf("last try: requeued %+v dead %+v", requeued, dead)
		}
	}
	if got := must[Ask](t)(s.Get(ctx, other.ID)); got.State != Waiting {
		t.Fatalf("an ask never taken was expired in flight: %+v", got)
	}
	q := must[[]Ask](t)(s.Queue(ctx))
	if len(q) != 2 || q[0].State != Dead && q[1].State != Dead {
		t.Fatalf("queue %+v", q)
	}
	late := must[Ask](t)(s.Finish(ctx, a.ID, built("web1/builder"), now.Add(time.Minute)))
	if late.State != Done || !late.Late || late.Tries != maxTries || late.Why != "" {
		t.Fatalf("late outcome: %+v", late)
	}
	if _, err := s.Finish(ctx, a.ID, built("web1/builder"), now.Add(time.Minute)); !errors.Is(err, ErrEnded) {
		t.Fatalf("a second outcome: %v", err)
	}
	t.Run("maxTries below one is one", func(t *testing.T) {
		b := must[Ask](t)(s.Enqueue(ctx, Ask{Repository: "r"}, now))
		must[Ask](t)(s.Take(ctx, b.ID, "web1/builder", now))
		if _, dead, err := s.ExpireInFlight(ctx, bound, 0, now.Add(time.Hour)); err != nil || len(dead) != 1 || dead[0].ID != b.ID {
			t.Fatalf("%+v %v", dead, err)
		}
	})
}

// An ask nobody takes is dead after its bound, counted from when it was
// asked or from its last try given up.
func TestStore_ExpireWaiting(t *testing.T) {
	s := open(t)
	ctx := context.Background()
	const bound = 10 * time.Minute
	a := must[Ask](t)(s.Enqueue(ctx, Ask{Repository: "r"}, t0))
	b := must[Ask](t)(s.Enqueue(ctx, Ask{Repository: "r"}, t0))
	must[Ask](t)(s.Take(ctx, b.ID, "web1/builder", t0.Add(time.Minute)))
	must[Ask](t)(s.Requeue(ctx, b.ID, t0.Add(8*time.Minute)))
	if _, err := s.Kill(ctx, b.ID, t0); !errors.Is(err, ErrNotInFlight) || !strings.Contains(err.Error(), "waiting since 2026-11-29T10:08:00.000Z, 1 tries given up") {
		t.Fatalf("kill a requeued ask: %v", err)
	}
	if dead := must[[]Ask](t)(s.ExpireWaiting(ctx, bound, t0.Add(bound))); len(dead) != 0 {
		t.Fatalf("within its bound: %+v", dead)
	}
	dead := must[[]Ask](t)(s.ExpireWaiting(ctx, bound, t0.Add(bound+time.Second)))
	if len(dead) != 1 || dead[0].ID != a.ID || dead[0].Why != "no builder took it within 10m0s" {
		t.Fatalf("first bound: %+v", dead)
	}
	dead = must[[]Ask](t)(s.ExpireWaiting(ctx, bound, t0.Add(8*time.Minute+bound+time.Second)))
	if len(dead) != 1 || dead[0].ID != b.ID || dead[0].Tries != 1 {
		t.Fatalf("after its try: %+v", dead)
	}
	if w := must[[]Ask](t)(s.Waiting(ctx, 0)); len(w) != 0 {
		t.Fatalf("still waiting: %+v", w)
	}
}

// An outcome is kept bounded, and says what was built and where.
func TestStore_Finish(t *testing.T) {
	ctx := context.Background()
	t.Run("bounded", func(t *testing.T) {
		s, a := askIn(t, InFlight, false)
		var tail []string
		for i := range 80 {
			tail = append(tail, strings.Repeat("x", i))
		}
		tail[79] = strings.Repeat("é", MaxLineBytes) // two bytes each: cut on a rune
		o := Outcome{Failed: true, Why: "git clone:\n  repository\tnot found\n", LogTail: tail, Problems: []string{"name: missing", "version: missing"}}
		got := must[Ask](t)(s.Finish(ctx, a.ID, o, t0.Add(time.Hour)))
		d := got.Details
		if len(d.LogTail) != LogTailLines || d.LogTail[0] != tail[30] || len(d.LogTail[49]) != MaxLineBytes || !strings.HasSuffix(d.LogTail[49], "é") {
			t.Fatalf("log tail of %d lines, first %q, last %d bytes", len(d.LogTail), d.LogTail[0], len(d.LogTail[49]))
		}
		if got.Why != "git clone: repository not found" || !slices.Equal(d.Problems, o.Problems) {
			t.Fatalf("why %q problems %v", got.Why, d.Problems)
		}
		var many []string
		for i := range MaxProblems + 10 {
			many = append(many, fmt.Sprintf("problem %d", i))
		}
		s2, b := askIn(t, InFlight, false)
		if d := must[Ask](t)(s2.Finish(ctx, b.ID, Outcome{Failed: true, Problems: many}, t0)).Details; len(d.Problems) != MaxProblems || d.Problems[0] != "problem 0" {
			t.Fatalf("problems: %d, first %q", len(d.Problems), d.Problems[0])
		}
	})
	t.Run("what was built", func(t *testing.T) {
		s := open(t)
		a := must[Ask](t)(s.Enqueue(ctx, Ask{Repository: "/src/x.git"}, t0))
		must[Ask](t)(s.Take(ctx, a.ID, "web1/builder", t0))
		got := must[Ask](t)(s.Finish(ctx, a.ID, built(""), t0.Add(time.Minute)))
		if got.Module != "hello" || got.Commit != "c0ffee" || got.Digest != "ab12" || got.Bytes != 1234 || got.UnpackedBytes != 5678 || got.DurationMS != 2500 ||
			string(got.Details.Manifest) != `{"name":"hello","version":"1.0.0"}` || !slices.Equal(got.Details.LogTail, []string{"go build", "builder: built"}) || got.Late {
			t.Fatalf("%+v", got)
		}
	})
	t.Run("a manifest that is not JSON", func(t *testing.T) {
		s, a := askIn(t, InFlight, false)
		if _, err := s.Finish(ctx, a.ID, Outcome{Manifest: []byte(`{"name":`)}, t0); err == nil || !strings.Contains(err.Error(), "not JSON") {
			t.Fatalf("got %v", err)
		}
		if got := must[Ask](t)(s.Get(ctx, a.ID)); got.State != InFlight {
			t.Fatalf("%+v", got)
		}
	})
	t.Run("two builders, the first answering late", func(t *testing.T) {
		s, a := askIn(t, InFlight, false)
		must[Ask](t)(s.Requeue(ctx, a.ID, t0.Add(time.Hour)))
		must[Ask](t)(s.Take(ctx, a.ID, "web2/builder", t0.Add(time.Hour)))
		got := must[Ask](t)(s.Finish(ctx, a.ID, built("web1/builder"), t0.Add(2*time.Hour)))
		if got.State != Done || !got.Late || got.Builder != "web1/builder" {
			t.Fatalf("%+v", got)
		}
		if _, err := s.Finish(ctx, a.ID, built("web2/builder"), t0.Add(2*time.Hour)); !errors.Is(err, ErrEnded) {
			t.Fatalf("the second builder's answer: %v", err)
		}
	})
}

// clear cancels what waits (and, asked, what is dead), never what is in flight.
func TestStore_Clear(t *testing.T) {
	s := open(t)
	ctx := context.Background()
	var ids []string
	for range 5 {
		ids = append(ids, must[Ask](t)(s.Enqueue(ctx, Ask{Repository: "r"}, t0)).ID)
	}
	must[Ask](t)(s.Take(ctx, ids[0], "web1/builder", t0))
	must[Ask](t)(s.Take(ctx, ids[1], "web1/builder", t0))
	must[Ask](t)(s.Finish(ctx, ids[1], built(""), t0))
	must[[]Ask](t)(s.ExpireWaiting(ctx, time.Minute, t0.Add(time.Hour))) // ids 2, 3, 4 dead
	fresh := must[Ask](t)(s.Enqueue(ctx, Ask{Repository: "r"}, t0.Add(time.Hour)))

	if n := must[int](t)(s.Clear(ctx, false, t0.Add(2*time.Hour))); n != 1 {
		t.Fatalf("cleared %d, want the one waiting", n)
	}
	if a := must[Ask](t)(s.Get(ctx, fresh.ID)); a.State != Cancelled || a.Why != "cleared by hand" {
		t.Fatalf("%+v", a)
	}
	if n := must[int](t)(s.Clear(ctx, true, t0.Add(2*time.Hour))); n != 3 {
		t.Fatalf("cleared %d, want the 3 dead", n)
	}
	if a := must[Ask](t)(s.Get(ctx, ids[0])); a.State != InFlight {
		t.Fatalf("in flight was cleared: %+v", a)
	}
	if a := must[Ask](t)(s.Get(ctx, ids[1])); a.State != Done {
		t.Fatalf("done was cleared: %+v", a)
	}
	if q := must[[]Ask](t)(s.Queue(ctx)); len(q) != 1 || q[0].ID != ids[0] {
		t.Fatalf("queue %+v", q)
	}
}

func TestStore_Pause(t *testing.T) {
	s := open(t)
	ctx := context.Background()
	p, added, err := s.Pause(ctx, "web1", "disk\nfull", t0)
	if err != nil || !added || p.Holder != "web1" || !p.Since.Equal(t0) || p.Why != "disk full" {
		t.Fatalf("%+v %v %v", p, added, err)
	}
	p, added, err = s.Pause(ctx, "web1", "again", t0.Add(time.Hour))
	if err != nil || added || !p.Since.Equal(t0) || p.Why != "disk full" {
		t.Fatalf("paused again: %+v %v %v", p, added, err)
	}
	if _, _, err := s.Pause(ctx, "", "x", t0); !errors.Is(err, ErrNoHolder) {
		t.Fatalf("no holder: %v", err)
	}
	ps := must[[]Pause](t)(s.Paused(ctx))
	if _, ok := PausedFor(ps, "web1"); !ok {
		t.Fatal("web1 not paused")
	}
	if _, ok := PausedFor(ps, "web2"); ok {
		t.Fatal("web2 paused")
	}
	must[Pause](t)(func() (Pause, error) { p, _, err := s.Pause(ctx, Every, "upgrade", t0.Add(time.Minute)); return p, err }())
	ps = must[[]Pause](t)(s.Paused(ctx))
	if len(ps) != 2 || ps[0].Holder != Every || ps[1].Holder != "web1" {
		t.Fatalf("paused %+v", ps)
	}
	if p, ok := PausedFor(ps, "web2"); !ok || p.Holder != Every {
		t.Fatalf("web2 under every holder's pause: %+v %v", p, ok)
	}
	if p, _ := PausedFor(ps, "web1"); p.Holder != "web1" {
		t.Fatalf("web1's own pause first: %+v", p)
	}
	if _, err := s.Resume(ctx, "web2"); !errors.Is(err, ErrNotPaused) || !strings.Contains(err.Error(), "every holder is paused, since 2026-11-29T10:01:00.000Z") {
		t.Fatalf("web2 not paused by itself: %v", err)
	}
	lifted := must[[]Pause](t)(s.Resume(ctx, "web1"))
	if len(lifted) != 1 || lifted[0].Holder != "web1" {
		t.Fatalf("lifted %+v", lifted)
	}
	must[Pause](t)(func() (Pause, error) { p, _, err := s.Pause(ctx, "web3", "", t0); return p, err }())
	lifted = must[[]Pause](t)(s.Resume(ctx, Every))
	if len(lifted) != 2 {
		t.Fatalf("every: lifted %+v", lifted)
	}
	if ps := must[[]Pause](t)(s.Paused(ctx)); len(ps) != 0 {
		t.Fatalf("still paused %+v", ps)
	}
	if _, err := s.Resume(ctx, Every); !errors.Is(err, ErrNotPaused) {
		t.Fatalf("nothing paused: %v", err)
	}
}

func TestStore_List(t *testing.T) {
	s := open(t)
	ctx := context.Background()
	var ids []string
	for i := range 60 {
		mod := []string{"hello", "web"}[i%2]
		a := must[Ask](t)(s.Enqueue(ctx, Ask{Repository: "/src/" + mod + ".git", Module: mod}, t0.Add(time.Duration(i)*time.Second)))
		ids = append(ids, a.ID)
		if i%3 == 0 {
			must[Ask](t)(s.Take(ctx, a.ID, "web1/builder", t0))
		}
	}
	got := must[[]Ask](t)(s.List(ctx, Filter{}))
	if len(got) != DefaultListLimit || got[0].ID != ids[59] || got[49].ID != ids[10] {
		t.Fatalf("default: %d, first %s", len(got), got[0].ID)
	}
	if got := must[[]Ask](t)(s.List(ctx, Filter{Limit: -1})); len(got) != 60 {
		t.Fatalf("all: %d", len(got))
	}
	got = must[[]Ask](t)(s.List(ctx, Filter{Module: "hello", Limit: 5}))
	if len(got) != 5 || got[0].ID != ids[58] || got[4].ID != ids[50] {
		t.Fatalf("hello: %+v", got)
	}
	got = must[[]Ask](t)(s.List(ctx, Filter{Module: "web", States: []State{InFlight}, Limit: 100}))
	for _, a := range got {
		if a.Module != "web" || a.State != InFlight {
			t.Fatalf("%+v", a)
		}
	}
	if len(got) != 10 { // i odd and a multiple of 3: 3, 9, … 57
		t.Fatalf("web in flight: %d", len(got))
	}
	if w := must[[]Ask](t)(s.Waiting(ctx, 3)); len(w) != 3 || w[0].ID != ids[1] || w[2].ID != ids[4] {
		t.Fatalf("waiting: %+v", w)
	}
}

func TestStore_LatestByModule(t *testing.T) {
	s := open(t)
	ctx := context.Background()
	at := t0
	next := func() time.Time { at = at.Add(time.Minute); return at }
	ask := func(mod string, dry bool, end func(id string)) string {
		a := must[Ask](t)(s.Enqueue(ctx, Ask{Repository: "/src/" + mod + ".git", Module: mod, DryRun: dry}, next()))
		if end != nil {
			end(a.ID)
		}
		return a.ID
	}
	finish := func(failed bool) func(string) {
		return func(id string) {
			must[Ask](t)(s.Take(ctx, id, "web1/builder", next()))
			o := built("")
			o.Module, o.Failed = "", failed
			must[Ask](t)(s.Finish(ctx, id, o, next()))
		}
	}
	cancel := func(id string) { must[Ask](t)(s.Cancel(ctx, id, next())) }
	helloFailed := ask("hello", false, finish(true))
	ask("hello", true, finish(false)) // a dry run says nothing of the source
	ask("hello", false, cancel)       // nor does a cancelled ask
	ask("hello", false, nil)          // nor one still waiting
	ask("web", false, finish(true))
	webDone := ask("web", false, finish(false))
	ask("db", false, cancel)
	got := must[[]Ask](t)(s.LatestByModule(ctx))
	if len(got) != 2 || got[0].ID != helloFailed || got[0].State != Failed || got[1].ID != webDone || got[1].State != Done {
		t.Fatalf("%+v", got)
	}
}

// Prune keeps the newest of each module, every open ask, and what
// LatestByModule and the registered version stand on.
func TestStore_Prune(t *testing.T) {
	ctx := context.Background()
	s := open(t)
	at := t0
	next := func() time.Time { at = at.Add(time.Minute); return at }
	ask := func(mod, repo string, end string) string {
		a := must[Ask](t)(s.Enqueue(ctx, Ask{Repository: repo, Module: mod}, next()))
		switch end {
		case "done", "failed", "registered":
			must[Ask](t)(s.Take(ctx, a.ID, "web1/builder", next()))
			o := built("")
			o.Module, o.Failed = mod, end == "failed"
			must[Ask](t)(s.Finish(ctx, a.ID, o, next()))
			if end == "registered" {
				must[Ask](t)(s.MarkRegistered(ctx, a.ID))
			}
		case "cancelled":
			must[Ask](t)(s.Cancel(ctx, a.ID, next()))
		case "in-flight":
			must[Ask](t)(s.Take(ctx, a.ID, "web1/builder", next()))
		}
		return a.ID
	}
	kept := map[string]string{} // id: why it must stay
	var hello []string
	for range 6 {
		hello = append(hello, ask("hello", "/src/hello.git", "done"))
	}
	registered := ask("web", "/src/web.git", "registered")
	kept[registered] = "web's latest registered"
	webFailed := ask("web", "/src/web.git", "failed")
	kept[webFailed] = "web's latest counted build"
	kept[ask("web", "/src/web.git", "cancelled")] = "web's newest"
	kept[ask("web", "/src/web.git", "waiting")] = "waiting"
	kept[ask("web", "/src/web.git", "in-flight")] = "in flight"
	typo := []string{ask("", "/src/tpyo.git", "failed"), ask("", "/src/tpyo.git", "failed")}
	kept[typo[1]] = "its repository's newest"
	cutoff := next()
	late := ask("hello", "/src/hello.git", "done") // ended after the cutoff
	kept[late] = "ended after the cutoff"
	dead := must[Ask](t)(s.Enqueue(ctx, Ask{Repository: "/src/hello.git", Module: "hello"}, t0))
	// Only the ask asked at t0 waited past its bound: the web one asked
	// later still waits.
	if d := must[[]Ask](t)(s.ExpireWaiting(ctx, time.Minute, t0.Add(2*time.Minute))); len(d) != 1 || d[0].ID != dead.ID {
		t.Fatalf("dead %+v", d)
	}
	kept[dead.ID] = "dead"

	// keep 2: hello's newest two are the late one and hello[5]; the five
	// before them go. The typo repository has only two. web's older ones
	// are each protected.
	kept[hello[5]], kept[typo[0]] = "hello's newest two", "its repository's newest two"
	n := must[int](t)(s.Prune(ctx, 2, cutoff))
	if n != 5 {
		t.Fatalf("pruned %d, want hello's five oldest", n)
	}
	for id, why := range kept {
		if _, err := s.Get(ctx, id); err != nil {
			t.Errorf("%s (%s) pruned: %v", id, why, err)
		}
	}
	for _, id := range hello[:5] {
		if _, err := s.Get(ctx, id); !errors.Is(err, ErrNotFound) {
			t.Errorf("%s kept: %v", id, err)
		}
	}
	// keep 0 is keep 1: a module's newest is never pruned.
	must[int](t)(s.Prune(ctx, 0, at.Add(time.Hour)))
	left := must[[]Ask](t)(s.List(ctx, Filter{Limit: -1}))
	var ids []string
	for _, a := range left {
		ids = append(ids, a.ID)
	}
	sort.Strings(ids)
	want := []string{late, registered, webFailed, typo[1], dead.ID}
	for id, why := range kept {
		if why == "waiting" || why == "in flight" || why == "web's newest" {
			want = append(want, id)
		}
	}
	sort.Strings(want)
	if !slices.Equal(ids, want) {
		t.Fatalf("left %v, want %v", ids, want)
	}
	if got := must[[]Ask](t)(s.LatestByModule(ctx)); len(got) != 2 || got[0].ID != late || got[1].ID != webFailed {
		t.Fatalf("latest after pruning: %+v", got)
	}
	// Their details went with them.
	var orphans int
	if err := s.db.Reader.QueryRow(`SELECT count(*) FROM outcome_details WHERE id NOT IN (SELECT id FROM asks)`).Scan(&orphans); err != nil || orphans != 0 {
		t.Fatalf("%d details of pruned asks left, %v", orphans, err)
	}
	if err := s.db.Check(ctx); err != nil {
		t.Fatal(err)
	}
}

// The reads that must stay fast at 10,000 builds use an index, never a
// scan of the table.
func TestStore_QueryPlans(t *testing.T) {
	s := open(t)
	for name, q := range map[string]string{
		"queue":          queueQuery,
		"waiting":        waitingQuery,
		"latest":         latestQuery,
		"list":           `SELECT ` + askColumns + ` FROM asks ORDER BY asked_at DESC, id DESC LIMIT 50`,
		"list module":    `SELECT ` + askColumns + ` FROM asks WHERE module = 'x' ORDER BY asked_at DESC, id DESC LIMIT 50`,
		"list states":    `SELECT ` + askColumns + ` FROM asks WHERE state IN ('failed') ORDER BY asked_at DESC, id DESC LIMIT 50`,
		"expire waiting": `SELECT ` + askColumns + ` FROM asks WHERE state = 'waiting' AND coalesce(last_try_at, asked_at) < '' ORDER BY asked_at, id`,
	} {
		plan := sqlitetest.QueryPlan(t, s.db, q, placeholders(q)...)
		if s.db.Postgres {
			continue
		}
		t.Logf("%s: %q", name, plan)
		for _, step := range plan {
			if (strings.HasPrefix(step, "SCAN asks") || strings.HasPrefix(step, "SCAN b")) && !strings.Contains(step, "INDEX") {
				t.Errorf("%s scans the table: %q", name, plan)
			}
		}
	}
}

// placeholders are arguments for a query's ? marks.
func placeholders(q string) []any {
	args := make([]any, strings.Count(q, "?"))
	for i := range args {
		args[i] = 1
	}
	return args
}

// The queue outlives the process: what was asked, taken and paused is
// there when the store is opened again.
func TestStore_Reopen(t *testing.T) {
	ctx := context.Background()
	db, path := sqlitetest.Open(t, "builds")
	s := NewStore(db)
	a := must[Ask](t)(s.Enqueue(ctx, Ask{Repository: "r"}, t0))
	b := must[Ask](t)(s.Enqueue(ctx, Ask{Repository: "r"}, t0))
	must[Ask](t)(s.Take(ctx, b.ID, "web1/builder", t0))
	if _, _, err := s.Pause(ctx, "web2", "disk", t0); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := sqlite.Open(ctx, sqlite.Location{Context: "builds", DSN: path}, false)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s = NewStore(db)
	q := must[[]Ask](t)(s.Queue(ctx))
	if len(q) != 2 {
		t.Fatalf("queue after reopening: %+v", q)
	}
	for _, got := range q {
		want := map[string]State{a.ID: Waiting, b.ID: InFlight}[got.ID]
		if got.State != want || want == InFlight && got.Builder != "web1/builder" {
			t.Fatalf("%+v", got)
		}
	}
	if ps := must[[]Pause](t)(s.Paused(ctx)); len(ps) != 1 || ps[0].Holder != "web2" {
		t.Fatalf("paused after reopening: %+v", ps)
	}
}
