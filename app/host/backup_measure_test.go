package host

import (
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"mesh-controller/app/protocol"
)

// TestBackup_Measured measures what issue 29's closing note asks of the
// host, when MESH_MEASURE is set: the first and second backup of a 200 MiB
// data set (200 files of 1 MiB, random: nothing compresses) with 1 %
// changed, through the real REST server on loopback, and a restore of it
// (verified, moved in, the old contents aside). What a backup added is
// what crossed the network.
func TestBackup_Measured(t *testing.T) {
	if os.Getenv("MESH_MEASURE") == "" {
		t.Skip("MESH_MEASURE not set")
	}
	m := newBkMesh(t)
	m.start()
	dir := filepath.Join(m.root, "var/lib/db")
	os.MkdirAll(dir, 0o755)
	chunk := make([]byte, 1<<20)
	write := func(i int) {
		rand.Read(chunk)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%03d", i)), chunk, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 200 {
		write(i)
	}
	m.declare(m.dbModule("/var/lib/db", nil))
	first := m.backedUp("b1", "db", "main")
	write(7)
	write(150)
	second := m.backedUp("b2", "db", "main")
	start := time.Now()
	restored := m.restored(protocol.RestoreAsk{ID: "r1", Module: "db", Data: "main", Snapshot: "latest", From: "n1"})
	if !restored.OK {
		t.Fatalf("restore: %+v", restored)
	}
	t.Logf("first backup:  %d files, %.1f MiB, %.1f MiB added, %.2f s", first.Files, mib(first.Bytes), mib(first.BytesAdded), first.DurationMS/1000)
	t.Logf("second backup: %d files, %.1f MiB, %.2f MiB added, %.2f s", second.Files, mib(second.Bytes), mib(second.BytesAdded), second.DurationMS/1000)
	t.Logf("restore:       %d files, %.1f MiB, %.2f s (%.2f s asked to heard)", restored.Files, mib(restored.Bytes), restored.DurationMS/1000, time.Since(start).Seconds())
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }
