package e2e

import (
	"context"
	"fmt"
	"mesh-controller/app"
	"path/filepath"
	"testing"
)

// BenchmarkBackup backs up the stores of a mesh of 2,000 nodes (4
// assignments each, 40 modules, every node declared three times), a few MB of
// stores, as the backup command does: open, copy, check, compress, seal.
//
//	go test -run '^$' -bench Backup -benchtime 10x ./app/
func BenchmarkBackup(b *testing.B) {
	c := plannedMesh(b, 2000, 4, 40)
	ctx := context.Background()
	withOperator(b, c)
	for i := 0; i < 3; i++ {
		if _, err := c.Push(ctx, app.PushRequest{}); err != nil {
			b.Fatal(err)
		}
	}
	dir := b.TempDir()
	var made app.BackupMade
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var err error
		if made, err = c.Backup(ctx, filepath.Join(dir, fmt.Sprintf("b%d.age", i))); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	var stores int64
	for _, s := range made.Manifest.Stores {
		stores += s.Bytes
	}
	b.ReportMetric(float64(stores)/1e6, "MB-stores")
	b.ReportMetric(float64(made.Bytes)/1e6, "MB-archive")
}
