package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"
)

// Size measures the store on either engine, and Observe is told of every
// Write, committed or rolled back.
func TestSizeAndObserve(t *testing.T) {
	db := emptyStore(t)
	ctx := context.Background()
	n, err := db.Size(ctx)
	if err != nil || n <= 0 {
		t.Fatalf("size %d, %v", n, err)
	}
	var seen []time.Duration
	db.Observe = func(d time.Duration) { seen = append(seen, d) }
	if err := db.Write(ctx, func(*sql.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	failed := errors.New("refused")
	if err := db.Write(ctx, func(*sql.Tx) error { return failed }); !errors.Is(err, failed) {
		t.Fatal(err)
	}
	if len(seen) != 2 || seen[0] <= 0 {
		t.Fatalf("observed %v, want two writes", seen)
	}
}
