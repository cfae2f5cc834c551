package builder

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"mesh-controller/app/archive"
)

// A put the broker could not take (away for a moment) is tried again; one
// that can never succeed is not.
func TestPutPatiently(t *testing.T) {
	calls := 0
	err := putPatiently(context.Background(), func() error {
		calls++
		if calls < 3 {
			return errors.New("the archives bucket mesh-archives: context deadline exceeded")
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("transient: %v after %d calls", err, calls)
	}
	calls = 0
	err = putPatiently(context.Background(), func() error {
		calls++
		return fmt.Errorf("put archive: %w", archive.ErrDigest)
	})
	if !errors.Is(err, archive.ErrDigest) || calls != 1 {
		t.Fatalf("permanent: %v after %d calls", err, calls)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	calls = 0
	if err := putPatiently(ctx, func() error { calls++; return errors.New("no responders") }); err == nil || calls != 1 {
		t.Fatalf("cancelled: %v after %d calls", err, calls)
	}
}
