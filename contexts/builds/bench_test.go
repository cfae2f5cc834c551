package builds

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"mesh-controller/embedded/sqlite"
)

// The figures the issue asks for: builds and queue at 10,000 finished
// builds. Run: go test ./contexts/builds -run '^$' -bench . -benchtime 2s
const (
	benchFinished = 10000
	benchWaiting  = 100
	benchModules  = 100
)

// filled is a store holding benchFinished finished builds of benchModules
// modules (one in ten failed), each with a full log tail and a manifest as
// a real build's, then benchWaiting waiting asks, a few in flight and a
// few dead. Rows go in by SQL in one transaction: the benchmark is of the
// reads, and the store's own acts would take a minute to make this many.
func filled(b *testing.B) *Store {
	b.Helper()
	s := open(b)
	ctx := context.Background()
	var tail []string
	for i := range LogTailLines {
		tail = append(tail, fmt.Sprintf("#%d [builder 4/7] RUN go build -trimpath -o bin/hello ./cmd/hello  # line %d of the build's output", i, i))
	}
	tailJSON, _ := json.Marshal(tail)
	manifest := `{"name":"hello","version":"1.0.0","build":{"command":["go","build","-o","bin/hello","./cmd/hello"],"outputs":["bin/"]},` +
		`"run":{"command":["bin/hello","--listen",":8080"]},"data":[{"name":"state","path":"/var/lib/hello","precious":"costly"}],` +
		`"needs":[{"seat":"db"}],"provides":[{"seat":"web"}],"description":"` + strings.Repeat("a module as big as a real one ", 10) + `"}`
	err := s.db.Write(ctx, func(tx *sql.Tx) error {
		ins, err := tx.PrepareContext(ctx, `INSERT INTO asks (id, repository, ref, module, state, builder, asked_at, taken_at, finished_at,
			source_commit, version, digest, bytes, duration_ms, why, registered) VALUES (?, ?, 'main', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)
		if err != nil {
			return err
		}
		defer ins.Close()
		details, err := tx.PrepareContext(ctx, `INSERT INTO outcome_details (id, log_tail, manifest) VALUES (?, ?, ?)`)
		if err != nil {
			return err
		}
		defer details.Close()
		at := t0
		for i := range benchFinished + benchWaiting + 20 {
			at = at.Add(time.Minute)
			mod := fmt.Sprintf("module-%03d", i%benchModules)
			state, why, registered := Done, "", i%2 == 0
			var taken, finished any = sqlite.FormatTime(at.Add(10 * time.Second)), sqlite.FormatTime(at.Add(50 * time.Second))
			switch {
			case i >= benchFinished+benchWaiting+10:
				state, registered, finished, why = Dead, false, sqlite.FormatTime(at), "no builder took it within 1h0m0s"
			case i >= benchFinished+benchWaiting:
				state, registered, finished = InFlight, false, nil
			case i >= benchFinished:
				state, registered, taken, finished = Waiting, false, nil, nil
			case i%10 == 3:
				state, why, registered = Failed, "exit status 1: go build: undefined: hello.Serve", false
			}
			id := NewID(at)
			if _, err := ins.ExecContext(ctx, id, "/src/"+mod+".git", mod, state, "web1/builder", sqlite.FormatTime(at), taken, finished,
				fmt.Sprintf("%040x", i), fmt.Sprintf("1.0.%d", i), fmt.Sprintf("%064x", i), 12<<20, 41234.5, why, registered); err != nil {
				return err
			}
			if !state.Open() {
				if _, err := details.ExecContext(ctx, id, string(tailJSON), manifest); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

func BenchmarkStore_Queue(b *testing.B) {
	s := filled(b)
	ctx := context.Background()
	for b.Loop() {
		q, err := s.Queue(ctx)
		if err != nil || len(q) != benchWaiting+20 {
			b.Fatalf("%d, %v", len(q), err)
		}
	}
}

func BenchmarkStore_List50(b *testing.B) {
	s := filled(b)
	ctx := context.Background()
	for b.Loop() {
		l, err := s.List(ctx, Filter{Limit: 50})
		if err != nil || len(l) != 50 {
			b.Fatalf("%d, %v", len(l), err)
		}
	}
}

func BenchmarkStore_ListModule50(b *testing.B) {
	s := filled(b)
	ctx := context.Background()
	for b.Loop() {
		l, err := s.List(ctx, Filter{Module: "module-042", Limit: 50})
		if err != nil || len(l) != 50 {
			b.Fatalf("%d, %v", len(l), err)
		}
	}
}

func BenchmarkStore_ListFailed50(b *testing.B) {
	s := filled(b)
	ctx := context.Background()
	for b.Loop() {
		l, err := s.List(ctx, Filter{States: []State{Failed}, Limit: 50})
		if err != nil || len(l) != 50 {
			b.Fatalf("%d, %v", len(l), err)
		}
	}
}

func BenchmarkStore_LatestByModule(b *testing.B) {
	s := filled(b)
	ctx := context.Background()
	for b.Loop() {
		l, err := s.LatestByModule(ctx)
		if err != nil || len(l) != benchModules {
			b.Fatalf("%d, %v", len(l), err)
		}
	}
}

// One ask's whole life through the store's acts, beside 10,000 builds.
func BenchmarkStore_EnqueueTakeFinish(b *testing.B) {
	s := filled(b)
	ctx := context.Background()
	now := t0.Add(365 * 24 * time.Hour)
	o := built("web1/builder")
	for b.Loop() {
		now = now.Add(time.Millisecond)
		a, err := s.Enqueue(ctx, Ask{Repository: "/src/hello.git", Module: "hello"}, now)
		if err == nil {
			_, err = s.Take(ctx, a.ID, "web1/builder", now)
		}
		if err == nil {
			_, err = s.Finish(ctx, a.ID, o, now)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
}

// Pruning 10,000 builds to the newest 10 of each of 100 modules: 9,000
// deleted, in batches.
func BenchmarkStore_Prune(b *testing.B) {
	ctx := context.Background()
	for b.Loop() {
		b.StopTimer()
		s := filled(b)
		b.StartTimer()
		n, err := s.Prune(ctx, 10, t0.Add(365*24*time.Hour))
		if err != nil || n != benchFinished-10*benchModules {
			b.Fatalf("pruned %d, %v", n, err)
		}
	}
}
