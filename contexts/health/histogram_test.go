package health

import (
	"context"
	"reflect"
	"testing"
	"time"

	"mesh-controller/embedded/sqlite/sqlitetest"
)

// The buckets column keeps the text earlier versions wrote (string keys,
// sorted as strings), and what is stored reads back merged.
func TestStore_HeartbeatBucketsText(t *testing.T) {
	db, _ := sqlitetest.Open(t, "health")
	s := NewStore(db)
	ctx := context.Background()
	hour := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	k := HourKey{Node: "web1", Hour: hour}
	for _, b := range []map[int]int64{{2: 1, 10: 3}, {1: 5, 10: 1}} {
		if err := s.RecordHeartbeats(ctx, map[HourKey]Histogram{k: {Count: 1, Buckets: b}}); err != nil {
			t.Fatal(err)
		}
	}
	var text string
	if err := db.Reader.QueryRowContext(ctx, `SELECT buckets FROM heartbeat_hours WHERE node = 'web1'`).Scan(&text); err != nil {
		t.Fatal(err)
	}
	if want := `{"1":5,"10":4,"2":1}`; text != want {
		t.Fatalf("stored %s, want %s", text, want)
	}
	hs, err := s.Heartbeats(ctx, hour)
	if err != nil || !reflect.DeepEqual(hs["web1"].Buckets, map[int]int64{1: 5, 2: 1, 10: 4}) || hs["web1"].Count != 2 {
		t.Fatalf("read back: %+v, %v", hs, err)
	}
}
