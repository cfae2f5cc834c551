package main

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"mesh-controller/app"
	"mesh-controller/cmd/clirun"
)

// SetRef is NODE/MODULE/DATASET, checked while parsing: one that does not
// parse is a usage error and no store is touched.
type SetRef string

// Validate checks the data set's name.
func (s SetRef) Validate() error {
	if _, err := app.ParseSetRef(string(s)); err != nil {
		return clirun.UsageError{Msg: err.Error()}
	}
	return nil
}

// DataBackupCmd is data backup.
type DataBackupCmd struct {
	Sets []SetRef      `arg:"" name:"set" help:"NODE/MODULE/DATASET, as data lists them."`
	Why  string        `required:"" help:"Why, for the hand-act log."`
	Wait time.Duration `default:"30m" help:"How long each backup is waited for."`
	JSON bool          `name:"json" help:"Print one JSON array."`
}

// Run backs the sets up now.
func (c *DataBackupCmd) Run(env *Env, sts *app.Seats) error {
	sets := make([]string, len(c.Sets))
	for i, s := range c.Sets {
		sets[i] = string(s)
	}
	done, err := sts.DataBackup(env.Ctx, app.BackupRequest{Sets: sets, Why: c.Why, Wait: c.Wait})
	if c.JSON {
		if done == nil {
			done = []app.BackupDone{}
		}
		if perr := printJSON(env.Stdout, done); perr != nil {
			return perr
		}
		return err
	}
	for _, d := range done {
		if d.Run.OK {
			fmt.Fprintf(env.Stdout, "%s: snapshot %s, %s, %s added of %s, in %s\n", d.Set, d.Run.Snapshot, filesShown(d.Run.Files),
				bytesShown(d.Run.BytesAdded), bytesShown(d.Run.Bytes), msShown(d.Run.DurationMS))
		}
	}
	return err
}

// DataSnapshotsCmd is data snapshots.
type DataSnapshotsCmd struct {
	Set  SetRef `arg:"" name:"set" help:"NODE/MODULE/DATASET."`
	JSON bool   `name:"json" help:"Print one JSON array."`
}

// Run lists the set's snapshots, newest first.
func (c *DataSnapshotsCmd) Run(env *Env, sts *app.Seats) error {
	ss, err := sts.DataSnapshots(env.Ctx, string(c.Set))
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, ss)
	}
	if len(ss) == 0 {
		fmt.Fprintf(env.Stderr, "the repository holds no snapshot of %s yet: data backup %s --why … makes one\n", c.Set, c.Set)
		return nil
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SNAPSHOT\tTAKEN\tPATH")
	for _, s := range ss {
		id := s.ID
		if len(id) > 8 {
			id = id[:8]
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", id, s.Time.UTC().Format("2006-01-02 15:04:05Z"), strings.Join(s.Paths, " "))
	}
	return tw.Flush()
}

// DataRestoreCmd is data restore.
type DataRestoreCmd struct {
	Set      SetRef        `arg:"" name:"set" help:"NODE/MODULE/DATASET."`
	Snapshot string        `placeholder:"ID" help:"The snapshot (data snapshots lists them); default the latest."`
	To       Name          `placeholder:"NODE" help:"Restore onto another node that runs the module (default: the set's own)."`
	Why      string        `required:"" help:"Why, for the hand-act log."`
	Wait     time.Duration `default:"30m" help:"How long the restore is waited for."`
	JSON     bool          `name:"json" help:"Print one JSON object."`
}

// Run restores the set.
func (c *DataRestoreCmd) Run(env *Env, sts *app.Seats) error {
	r, err := sts.DataRestore(env.Ctx, app.RestoreRequest{Set: string(c.Set), Snapshot: c.Snapshot, To: string(c.To), Why: c.Why, Wait: c.Wait})
	if c.JSON {
		if perr := printJSON(env.Stdout, r); perr != nil {
			return perr
		}
		return err
	}
	if r.Before != nil && r.Before.OK {
		fmt.Fprintf(env.Stdout, "first, a fresh snapshot of what was there: %s\n", r.Before.Snapshot)
	}
	if err != nil {
		return err
	}
	to := string(c.To)
	if to == "" {
		to, _, _ = strings.Cut(string(c.Set), "/")
	}
	fmt.Fprintf(env.Stdout, "restored %s onto %s from snapshot %s: %s, %s, in %s\n", c.Set, to, r.Restore.Snapshot, filesShown(r.Restore.Files),
		bytesShown(r.Restore.Bytes), msShown(r.Restore.DurationMS))
	if r.Restore.Aside != "" {
		fmt.Fprintf(env.Stdout, "what was there is kept at %s, retired as %s: data lists it, cleanup delete deletes it\n", r.Restore.Aside, r.AsideName)
	} else {
		fmt.Fprintln(env.Stdout, "the data set was empty: nothing was moved aside")
	}
	return nil
}

// DataVerifyCmd is data verify.
type DataVerifyCmd struct {
	Set  SetRef        `arg:"" name:"set" help:"NODE/MODULE/DATASET."`
	Wait time.Duration `default:"30m" help:"How long the drill is waited for."`
	JSON bool          `name:"json" help:"Print one JSON object."`
}

// Run drills a restore now.
func (c *DataVerifyCmd) Run(env *Env, sts *app.Seats) error {
	o, err := sts.DataVerify(env.Ctx, app.VerifyRequest{Set: string(c.Set), Wait: c.Wait})
	if c.JSON {
		if perr := printJSON(env.Stdout, o); perr != nil {
			return perr
		}
		return err
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "%s: snapshot %s restored and verified on the holder: %s, %s, in %s\n", c.Set, o.Snapshot, filesShown(o.Files), bytesShown(o.Bytes), msShown(o.DurationMS))
	return nil
}

// bytesShown is a size for a person.
func bytesShown(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", n)
}

// msShown is a duration in milliseconds for a person.
func msShown(ms float64) string {
	return (time.Duration(ms * float64(time.Millisecond))).Round(time.Millisecond).String()
}

// printFresh says the snapshots taken before a risky act, or why none.
func printFresh(env *Env, fresh []app.FreshSnapshot) {
	for _, f := range fresh {
		if f.Snapshot != "" {
			fmt.Fprintf(env.Stdout, "first, a fresh snapshot of %s: %s\n", f.Set, f.Snapshot)
		} else {
			fmt.Fprintf(env.Stderr, "no fresh snapshot of %s first: %s\n", f.Set, f.Why)
		}
	}
}

// filesShown is a count of files as a sentence says it.
func filesShown(n int64) string {
	if n == 1 {
		return "1 file"
	}
	return fmt.Sprintf("%d files", n)
}
