package health

import (
	"context"
	"reflect"
	"strconv"
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

// HeartbeatHours reads each hour of the nodes named apart, by node then
// hour, from the hour since falls in; HeartbeatLongest, the longest
// interval of each node since then.
func TestStore_HeartbeatHours(t *testing.T) {
	db, _ := sqlitetest.Open(t, "health")
	s := NewStore(db)
	ctx := context.Background()
	h0 := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	in := map[HourKey]Histogram{}
	for i, k := range []HourKey{{"web2", h0}, {"web1", h0.Add(time.Hour)}, {"web1", h0}, {"web1", h0.Add(-time.Hour)}} {
		var h Histogram
		h.Add(float64(1000 * (i + 1)))
		in[k] = h
	}
	if err := s.RecordHeartbeats(ctx, in); err != nil {
		t.Fatal(err)
	}
	hs, err := s.HeartbeatHours(ctx, h0.Add(30*time.Minute), []string{"web2", "web1", "web9"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, h := range hs {
		got = append(got, h.Node+" "+h.Hour.Format(time.RFC3339)+" "+strconv.FormatFloat(h.MaxMS, 'f', -1, 64))
	}
	want := []string{"web1 2026-11-29T10:00:00Z 3000", "web1 2026-11-29T11:00:00Z 2000", "web2 2026-11-29T10:00:00Z 1000"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("read %q, want %q", got, want)
	}
	if hs, err := s.HeartbeatHours(ctx, h0, []string{"web2"}); err != nil || len(hs) != 1 || hs[0].Node != "web2" {
		t.Fatalf("web2 alone: %+v %v", hs, err)
	}
	longest, err := s.HeartbeatLongest(ctx, h0)
	if want := map[string]float64{"web1": 3000, "web2": 1000}; err != nil || !reflect.DeepEqual(longest, want) {
		t.Fatalf("longest %v %v, want %v", longest, err, want)
	}
}
