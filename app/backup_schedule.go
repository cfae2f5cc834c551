package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"time"
)

// DefaultBackupKeep is how many backups serve --backup-every keeps.
const DefaultBackupKeep = 7

// backupName is the name the daemon gives each backup, by its UTC time; it
// deletes only files named so, and sorting the names sorts the times.
var backupName = regexp.MustCompile(`^mesh-backup-(\d{8}T\d{6}Z)\.age$`)

const backupTimeLayout = "20060102T150405Z"

// backupPartial is what a daemon killed while writing a backup leaves.
var backupPartial = regexp.MustCompile(`^\.mesh-backup-\d{8}T\d{6}Z\.age` + regexp.QuoteMeta(partialInfix) + `\d+$`)

// backupSchedule makes the daemon's backups: every so often into a
// directory, keeping the newest few.
type backupSchedule struct {
	dir   string
	every time.Duration
	keep  int
	st    *Stores
	now   func() time.Time
	log   *slog.Logger
	timer *time.Timer
}

// scheduleBackups prepares the daemon's backups, or returns nil when o asks
// for none. It refuses at once what would fail every backup (no operator
// key, a directory it cannot make). The first backup is due one interval
// after the newest already in the directory, so a daemon restarted often
// neither skips backups nor crowds out the older ones.
func scheduleBackups(ctx context.Context, o ServeOptions, st *Stores, now func() time.Time, log *slog.Logger) (*backupSchedule, error) {
	if o.BackupEvery == 0 && o.BackupDir == "" {
		return nil, nil
	}
	switch {
	case o.BackupEvery < time.Second:
		return nil, fmt.Errorf("backups every %v: give an interval of a second or more", o.BackupEvery)
	case o.BackupDir == "":
		return nil, fmt.Errorf("backups every %v: give the directory to keep them in", o.BackupEvery)
	case o.BackupKeep < 0:
		return nil, fmt.Errorf("keep %d backups: give a number of 1 or more", o.BackupKeep)
	}
	s := &backupSchedule{dir: o.BackupDir, every: o.BackupEvery, keep: o.BackupKeep, st: st, now: now, log: log}
	if s.keep == 0 {
		s.keep = DefaultBackupKeep
	}
	if _, err := st.Secrets.OperatorKey(ctx); err != nil {
		return nil, fmt.Errorf("backups are sealed to the operator key: %w", err)
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, fmt.Errorf("make the backup directory: %w; give --backup-dir a directory this user can make", err)
	}
	s.removePartials()
	names, err := s.backups()
	if err != nil {
		return nil, err
	}
	wait := time.Duration(0)
	if len(names) > 0 {
		if t, err := time.Parse(backupTimeLayout, backupName.FindStringSubmatch(names[len(names)-1])[1]); err == nil {
			wait = max(0, t.Add(s.every).Sub(now()))
		}
	}
	s.timer = time.NewTimer(wait)
	return s, nil
}

// due fires when the next backup is due; never for a nil schedule.
func (s *backupSchedule) due() <-chan time.Time {
	if s == nil {
		return nil
	}
	return s.timer.C
}

func (s *backupSchedule) stop() {
	if s != nil {
		s.timer.Stop()
	}
}

// run makes one backup, removes those past the newest keep, logs what it
// did or why it failed, and sets when the next is due.
func (s *backupSchedule) run(ctx context.Context) {
	started := s.now()
	defer func() { s.timer.Reset(max(0, started.Add(s.every).Sub(s.now()))) }()
	out := filepath.Join(s.dir, "mesh-backup-"+started.UTC().Format(backupTimeLayout)+".age")
	made, err := backupStores(ctx, s.st.dbs, out, started)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error("backup failed", "err", err)
		}
		return
	}
	removed, err := s.prune(filepath.Base(out))
	s.log.Info("backup written", "file", out, "bytes", made.Bytes, "stores", len(made.Manifest.Stores),
		"ms", made.Took.Milliseconds(), "removed_older", len(removed), "keeping", s.keep)
	if err != nil {
		s.log.Error("backup: remove older backups", "err", err)
	}
}

// backups lists the daemon's backups in dir, oldest first.
func (s *backupSchedule) backups() ([]string, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("make the backup directory: %w; give --backup-dir a directory this user can make", err)
	}
	var names []string
	for _, e := range entries {
		if e.Type().IsRegular() && backupName.MatchString(e.Name()) {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	return names, nil
}

// removePartials removes what a daemon killed while writing a backup left;
// only at start, so as not to race a backup being written.
func (s *backupSchedule) removePartials() {
	entries, _ := os.ReadDir(s.dir)
	for _, e := range entries {
		if e.Type().IsRegular() && backupPartial.MatchString(e.Name()) {
			os.Remove(filepath.Join(s.dir, e.Name()))
		}
	}
}

// prune removes all but the newest keep backups, never the one just
// written (should the clock have gone back, it sorts before older ones).
func (s *backupSchedule) prune(written string) ([]string, error) {
	names, err := s.backups()
	if err != nil {
		return nil, err
	}
	names = slices.DeleteFunc(names, func(n string) bool { return n == written })
	var removed []string
	var errs []error
	for _, n := range names[:max(0, len(names)-(s.keep-1))] {
		if err := os.Remove(filepath.Join(s.dir, n)); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, n)
	}
	return removed, errors.Join(errs...)
}
