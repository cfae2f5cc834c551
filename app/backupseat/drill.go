package backupseat

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"mesh-controller/app/protocol"
)

// Drill restores the latest snapshot of a data set into a scratch
// directory and proves it: restic check reads a seventh of the
// repository's data (a different seventh each day, so a week of drills
// reads it all), and the restore verifies every restored file's content
// against the snapshot's hashes. The scratch is removed after.
func (s *Seat) Drill(ctx context.Context, node, module, data string) protocol.DrillOutcome {
	start := time.Now()
	o := protocol.DrillOutcome{Node: node, Module: module, Data: data}
	fail := func(format string, args ...any) protocol.DrillOutcome {
		o.Why = fmt.Sprintf(format, args...)
		o.DurationMS = float64(time.Since(start).Microseconds()) / 1000
		o.At = time.Now().UTC()
		return o
	}
	ss, err := s.snapshots(ctx, node, module, data)
	if err != nil {
		return fail("the snapshots could not be listed: %v", err)
	}
	if len(ss) == 0 {
		return fail("the repository holds no snapshot of it")
	}
	o.Snapshot = ss[0].ID
	defer s.lockRepo(node)()
	repo := s.repo(node)
	subset := fmt.Sprintf("%d/7", start.YearDay()%7+1)
	if err := repo.Check(ctx, subset); err != nil {
		return fail("restic check (data subset %s) failed: %v", subset, err)
	}
	scratch, err := os.MkdirTemp(s.o.Scratch, "drill-")
	if err != nil {
		return fail("no scratch directory: %v", err)
	}
	defer os.RemoveAll(scratch)
	if err := repo.Restore(ctx, o.Snapshot, scratch); err != nil {
		return fail("the restore of snapshot %s failed: %v", protocol.ShortSnapshot(o.Snapshot), err)
	}
	err = filepath.WalkDir(scratch, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			o.Files++
			o.Bytes += info.Size()
		}
		return nil
	})
	if err != nil {
		return fail("the restored tree could not be read: %v", err)
	}
	o.OK = true
	o.DurationMS = float64(time.Since(start).Microseconds()) / 1000
	o.At = time.Now().UTC()
	return o
}
