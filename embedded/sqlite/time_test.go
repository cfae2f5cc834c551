package sqlite

import (
	"testing"
	"time"
)

// ParseTime reads exactly what time.Parse reads with TimeLayout, and refuses
// what it refuses.
func TestParseTime(t *testing.T) {
	for _, s := range []string{
		"2026-11-30T17:04:38.848Z", "0000-01-01T00:00:00.000Z", "9999-12-31T23:59:59.999Z", "2024-02-29T12:00:00.000Z",
		"2026-02-29T12:00:00.000Z", "2026-04-31T00:00:00.000Z", "2026-13-01T00:00:00.000Z", "2026-00-01T00:00:00.000Z",
		"2026-11-30T24:00:00.000Z", "2026-11-30T23:60:00.000Z", "2026-11-30T23:59:60.000Z", "2026-11-30 17:04:38.848Z",
		"2026-11-30T17:04:38.84Z", "2026-11-30T17:04:38.848", "2026-11-30T17:04:38.8a8Z", "-026-11-30T17:04:38.848Z",
		"2026-11-30T17:04:38.848+01:00", "", "2026-1-30T17:04:38.848Z",
	} {
		want, wantErr := time.Parse(TimeLayout, s)
		got, err := ParseTime(s)
		if (err != nil) != (wantErr != nil) || got != want {
			t.Errorf("%q: got %v, %v; time.Parse %v, %v", s, got, err, want, wantErr)
		}
	}
	now := time.Now()
	if got, err := ParseTime(FormatTime(now)); err != nil || !got.Equal(now.Truncate(time.Millisecond)) {
		t.Errorf("round trip of %v: %v, %v", now, got, err)
	}
}

// BenchmarkParseTime reads a stored time (-bench ParseTime).
func BenchmarkParseTime(b *testing.B) {
	s := FormatTime(time.Now())
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			if _, err := ParseTime(s); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("time.Parse", func(b *testing.B) {
		for b.Loop() {
			if _, err := time.Parse(TimeLayout, s); err != nil {
				b.Fatal(err)
			}
		}
	})
}
