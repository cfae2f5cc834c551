package app

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"testing"
	"time"
)

// nodeViews are nodes with every field exercised: times with and without
// fractions and zones, a failed apply whose error needs escaping, floats
// that encoding/json writes with an exponent.
func nodeViews(n int) []NodeView {
	at := time.Date(2026, 11, 30, 17, 4, 38, 848000000, time.UTC)
	out := make([]NodeView, 0, n)
	for i := 0; i < n; i++ {
		heard := at.Add(time.Duration(i) * time.Millisecond)
		v := NodeView{Name: fmt.Sprintf("h%d", i), Mode: "converged", Joined: i%3 != 0, CreatedAt: at.Add(-time.Hour),
			SerialDeclared: int64(i), SerialApplied: int64(i / 2), Behind: i%2 == 1, HeartbeatS: 10}
		if v.Behind {
			v.BehindWhy = "its plan moved since <its declaration>"
		}
		if v.Joined {
			v.HostVersion, v.Protocol = "v0.3.0-2-g<abc>", "1.1"
		}
		if v.Joined {
			v.JoinedAt, v.LastHeard = &at, &heard
		}
		switch i % 7 {
		case 1:
			v.LastApply = &ApplyView{Serial: 3, OK: true, TotalMS: 1.25, At: heard}
		case 2:
			v.LastApply = &ApplyView{Serial: 4, Error: "write \"/srv/x\": <denied> & \\ \u2028 \x01 é \xff", TotalMS: 1e-7, At: heard.In(time.FixedZone("x", 3600))}
		case 3:
			v.HeartbeatS, v.Mode = 1e21, "adopted"
		case 4:
			v.HeartbeatS = 0.5
		case 5:
			v.HeartbeatS = math.Copysign(0, -1)
		case 6:
			v.Applying = &ApplyingView{Serial: int64(i + 1), Since: heard, Phase: "archives"}
		}
		if v.Joined {
			v.HostVersion = fmt.Sprintf("v0.3.%d-<&>", i%3)
		}
		if i%4 == 1 {
			v.HostRelease = "v0.3.1"
		}
		if i%11 == 10 {
			v.Applying = &ApplyingView{Serial: int64(i + 1), Since: heard.In(time.FixedZone("y", -7200))}
		}
		out = append(out, v)
	}
	return out
}

// node list --json and GET /v1/nodes write what WriteJSON would, byte for byte.
func TestWriteNodesJSON(t *testing.T) {
	for _, n := range []int{0, 1, 30} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			var want, got bytes.Buffer
			if err := WriteJSON(&want, nodeViews(n)); err != nil {
				t.Fatal(err)
			}
			if err := WriteNodesJSON(&got, nodeViews(n)); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Bytes(), want.Bytes()) {
				t.Fatalf("got\n%s\nwant\n%s", got.Bytes(), want.Bytes())
			}
		})
	}
	t.Run("not a number", func(t *testing.T) {
		nodes := nodeViews(1)
		nodes[0].HeartbeatS = math.NaN()
		if err := WriteNodesJSON(io.Discard, nodes); err == nil {
			t.Fatal("NaN printed")
		}
	})
}

// BenchmarkWriteNodesJSON prints 10,000 nodes as node list --json does, and
// as WriteJSON would (-bench 'WriteNodesJSON').
func BenchmarkWriteNodesJSON(b *testing.B) {
	nodes := nodeViews(10000)
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			if err := WriteNodesJSON(io.Discard, nodes); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		for b.Loop() {
			if err := WriteJSON(io.Discard, nodes); err != nil {
				b.Fatal(err)
			}
		}
	})
}
