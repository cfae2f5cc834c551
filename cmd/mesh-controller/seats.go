package main

import (
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/alecthomas/kong"

	"mesh-controller/app"
	"mesh-controller/cmd/clirun"
)

// SeatsCmd is seat list.
type SeatsCmd struct {
	JSON bool `name:"json" help:"Print one JSON array."`
}

// Run lists every seat the mesh defines.
func (c *SeatsCmd) Run(env *Env, sts *app.Seats) error {
	seats, err := sts.Seats(env.Ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, seats)
	}
	if len(seats) == 0 {
		fmt.Fprintln(env.Stderr, "no registered module defines a seat")
		return nil
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SEAT\tREPLICATED\tHOLDERS\tDELIVERS")
	for _, s := range seats {
		name := s.Seat
		if len(s.Aliases) > 0 {
			name += " (was " + strings.Join(s.Aliases, ", ") + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", name, yesNo(s.Replicated), dash(strings.Join(s.Holders, ", ")), s.Delivers)
	}
	return tw.Flush()
}

// SeatCmd is seat: a handover, an addition, the list, or (with rename) a
// new name. Its bare form (seat NAME --to|--add) is listed first in help.
type SeatCmd struct {
	Hand   SeatHandCmd   `cmd:"" default:"withargs" hidden:"" help:"Hand a seat over (NAME --to NODE/MODULE), or add a holder beside the others (NAME --add NODE/MODULE)."`
	List   SeatsCmd      `cmd:"" help:"Every seat the mesh defines, what it delivers, and who holds it."`
	Rename SeatRenameCmd `cmd:"" help:"Rename a seat; the former name still resolves."`
}

// SeatRenameCmd is seat rename.
type SeatRenameCmd struct {
	From Name `arg:"" help:"The seat."`
	To   Name `arg:"" help:"Its new name."`
}

// Run renames.
func (c *SeatRenameCmd) Run(env *Env, sts *app.Seats) error {
	if err := sts.SeatRename(env.Ctx, string(c.From), string(c.To)); err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "seat %s is now %s; %s still resolves to it\n", c.From, c.To, c.From)
	return nil
}

// SeatHandCmd is seat NAME --to|--add NODE/MODULE.
type SeatHandCmd struct {
	Seat Name   `arg:"" help:"The seat."`
	To   string `xor:"how" required:"" placeholder:"NODE/MODULE" help:"Hand the seat to this assignment, in one act."`
	Add  string `xor:"how" required:"" placeholder:"NODE/MODULE" help:"Add this holder beside the others (a replicated seat)."`
	Yes  bool   `help:"Hand it over even though the new holder starts without the old holder's data (recorded in the hand-act log: --why)."`
	Why  string `help:"With --yes: why; recorded in the hand-act log."`
}

// Run hands the seat over or adds a holder.
func (c *SeatHandCmd) Run(env *Env, sts *app.Seats) error {
	to, add := c.To, false
	if c.Add != "" {
		to, add = c.Add, true
	}
	h, err := sts.SeatHandover(env.Ctx, app.HandoverRequest{Seat: string(c.Seat), To: to, Add: add, Yes: c.Yes, Why: c.Why})
	if err != nil {
		return err
	}
	switch {
	case !h.Changed:
		fmt.Fprintf(env.Stdout, "%s already holds seat %s; nothing changed\n", h.To, h.Seat)
	case add:
		fmt.Fprintf(env.Stdout, "seat %s: %s added beside %s\n", h.Seat, h.To, strings.Join(h.From, ", "))
	default:
		fmt.Fprintf(env.Stdout, "seat %s handed to %s (from %s) in one act\n", h.Seat, h.To, dash(strings.Join(h.From, ", ")))
	}
	if h.Empty != "" {
		fmt.Fprintf(env.Stderr, "the replacement starts empty: %s (data.empty-replacement stays open until a hand act is recorded for it or the data is there)\n", h.Empty)
	}
	if h.Recorded {
		fmt.Fprintln(env.Stderr, "your choice to start it empty is recorded in the hand-act log")
	}
	printPushed(env, h.Pushed)
	return nil
}

// ProvisionCmd groups the acts on provisions: which provider a node's
// consumers get one from, and their credentials.
type ProvisionCmd struct {
	Pin    PinCmd    `cmd:"" help:"Which provider a node's consumers get a provision from."`
	Unpin  UnpinCmd  `cmd:"" help:"Put that question back to the mesh (stickiness still keeps a binding that holds precious data)."`
	Rotate RotateCmd `cmd:"" help:"New per-consumer credentials for a provision; both ends in the same push."`
}

// PinCmd is provision pin.
type PinCmd struct {
	Node      Name   `arg:"" predictor:"node" help:"The consuming node."`
	Provision Name   `arg:"" help:"The provision."`
	FromNode  Name   `arg:"" predictor:"node" name:"from-node" help:"The providing node."`
	Module    Name   `arg:"" predictor:"module" help:"The providing module."`
	Yes       bool   `help:"Move a binding even though its new provider starts without the data the old one keeps (recorded in the hand-act log: --why)."`
	Why       string `help:"With --yes: why; recorded in the hand-act log."`
}

// Run pins.
func (c *PinCmd) Run(env *Env, sts *app.Seats) error {
	p, err := sts.Pin(env.Ctx, app.PinRequest{Node: string(c.Node), Provision: string(c.Provision), FromNode: string(c.FromNode),
		Module: string(c.Module), Yes: c.Yes, Why: c.Why})
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "%s gets %s from %s\n", p.Node, p.Provision, p.Provider)
	if p.Empty != "" {
		fmt.Fprintf(env.Stderr, "the replacement starts empty: %s; the old provider keeps it, waiting for retirement\n", p.Empty)
	}
	if p.Recorded {
		fmt.Fprintln(env.Stderr, "your choice to start it empty is recorded in the hand-act log")
	}
	printPushed(env, p.Pushed)
	return nil
}

// UnpinCmd is provision unpin.
type UnpinCmd struct {
	Node      Name `arg:"" predictor:"node" help:"The consuming node."`
	Provision Name `arg:"" help:"The provision."`
}

// Run unpins.
func (c *UnpinCmd) Run(env *Env, sts *app.Seats) error {
	p, err := sts.Unpin(env.Ctx, string(c.Node), string(c.Provision))
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "%s's %s is the mesh's choice again\n", p.Node, p.Provision)
	if p.Stays != "" {
		fmt.Fprintf(env.Stdout, "%s (only a pin moves it)\n", p.Stays)
	}
	printPushed(env, p.Pushed)
	return nil
}

// RotateCmd is provision rotate.
type RotateCmd struct {
	Provision Name `arg:"" help:"The provision."`
	Consumer  Name `help:"Only this consuming node's credentials."`
	Module    Name `help:"Only credentials of this module (consumer or provider)."`
}

// Run rotates.
func (c *RotateCmd) Run(env *Env, sts *app.Seats) error {
	r, err := sts.Rotate(env.Ctx, string(c.Provision), string(c.Consumer), string(c.Module))
	if err != nil {
		return err
	}
	for _, cr := range r.Credentials {
		fmt.Fprintf(env.Stdout, "new credential: %s\n", cr)
	}
	fmt.Fprintln(env.Stderr, "providers and consumers are sent their declarations in one push; the old values are not kept")
	printPushed(env, r.Pushed)
	return nil
}

// RetireCmd groups retire commands; alone it lists.
type RetireCmd struct {
	List    RetireListCmd   `cmd:"" default:"withargs" hidden:"" help:"Every provider waiting for a person to approve a retirement."`
	Approve RetireDecideCmd `cmd:"" help:"Retire what it waits with: access off, data kept."`
	Reject  RetireDecideCmd `cmd:"" help:"Keep them active; a warning condition stays open."`
}

// RetireListCmd is retire.
type RetireListCmd struct {
	JSON bool `name:"json" help:"Print one JSON array."`
}

// Run lists waiting providers.
func (c *RetireListCmd) Run(env *Env, sts *app.Seats) error {
	ws, err := sts.Retire(env.Ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, ws)
	}
	if len(ws) == 0 {
		fmt.Fprintln(env.Stderr, "no provider waits for a retirement; what was retired is listed by 'mesh-controller cleanup'")
		return nil
	}
	for _, w := range ws {
		fmt.Fprintf(env.Stdout, "%s waits to retire:\n", w.Provider)
		for _, cs := range w.Consumers {
			fmt.Fprintf(env.Stdout, "  %s (%s) since %s: %s\n", cs.Consumer, cs.Provision, cs.Since.Format(timeShown), cs.Why)
		}
	}
	// What a person does next, on stderr: the list itself stays the list.
	fmt.Fprintln(env.Stderr, "next: 'mesh-controller retire approve NODE MODULE --why …' turns their access off and keeps their data, which 'mesh-controller cleanup' then lists and 'cleanup delete' removes; 'retire reject' keeps them active")
	return nil
}

// RetireDecideCmd is retire approve and retire reject.
type RetireDecideCmd struct {
	Node   Name   `arg:"" predictor:"node" help:"The provider's node."`
	Module Name   `arg:"" predictor:"module" help:"The provider's module."`
	Why    string `required:"" help:"Why; recorded in the hand-act log."`
}

// Run approves or rejects, as its name in the command line says.
func (c *RetireDecideCmd) Run(env *Env, kctx *kong.Context, sts *app.Seats) error {
	approve := kctx.Selected().Name == "approve"
	decided, pushed, err := sts.RetireDecide(env.Ctx, string(c.Node), string(c.Module), c.Why, approve)
	if err != nil {
		return err
	}
	for _, cs := range decided {
		if approve {
			fmt.Fprintf(env.Stdout, "%s at %s/%s retired: access off, data kept; 'mesh-controller cleanup' lists it, 'mesh-controller cleanup delete %s %s %s --why …' deletes it\n",
				cs.Consumer, c.Node, c.Module, c.Node, c.Module, cs.Consumer)
		} else {
			fmt.Fprintf(env.Stdout, "%s at %s/%s kept active; retire.rejected stays open\n", cs.Consumer, c.Node, c.Module)
		}
	}
	printPushed(env, pushed)
	return nil
}

// CleanupCmd groups cleanup commands; alone it lists.
type CleanupCmd struct {
	List   CleanupListCmd   `cmd:"" default:"withargs" help:"Every retired consumer and retired data set per provider: age, size, why."`
	Delete CleanupDeleteCmd `cmd:"" help:"Have the provider delete one retired consumer's data or retired data set; or, with --older-than, every one older (only with --confirm)."`
}

// CleanupListCmd is cleanup [list].
type CleanupListCmd struct {
	JSON bool `name:"json" help:"Print one JSON array."`
}

// Run lists what may be cleaned up.
func (c *CleanupListCmd) Run(env *Env, sts *app.Seats) error {
	cls, err := sts.Cleanup(env.Ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, cls)
	}
	if len(cls) == 0 {
		fmt.Fprintln(env.Stderr, "nothing retired")
		return nil
	}
	printCleanables(env, cls)
	return nil
}

func printCleanables(env *Env, cls []app.Cleanable) {
	tw := tabwriter.NewWriter(env.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PROVIDER\tRETIRED\tKIND\tPRECIOUS\tSTATE\tAGE\tSIZE\tLAST BACKUP\tWHY")
	for _, cl := range cls {
		what := cl.Target
		if cl.Deleting {
			what += " (deleting)"
		}
		provider := cl.Node + "/" + cl.Module
		if cl.OnRemovedNode() {
			provider += " (node removed)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", provider, what, cl.Kind, dash(cl.Precious), cl.State, app.Plural(cl.AgeDays, "day"), size(cl.Bytes), lastBackup(cl), cl.Why)
	}
	tw.Flush()
}

func size(b *int64) string {
	if b == nil {
		return "not reported"
	}
	return app.Plural(*b, "byte")
}

// lastBackup says when a cleanable was last backed up, and whether that is
// within its cadence: one that is not is deleted only with --yes.
func lastBackup(cl app.Cleanable) string {
	s := when(cl.LastBackup)
	switch {
	case cl.Cadence == "":
		return dash("")
	case cl.NeedsDigest:
		return s + " (needs --yes)"
	}
	return s
}

// printPreview shows what deleting one target would lose, and the digest
// that confirms exactly that.
func printPreview(env *Env, cl app.Cleanable) {
	fmt.Fprintf(env.Stdout, "would delete %s/%s %s (%s)\n", cl.Node, cl.Module, cl.Target, cl.Kind)
	tw := tabwriter.NewWriter(env.Stdout, 0, 0, 2, ' ', 0)
	if cl.Path != "" {
		fmt.Fprintf(tw, "  path\t%s\n", cl.Path)
	}
	fmt.Fprintf(tw, "  precious\t%s\n", dash(cl.Precious))
	fmt.Fprintf(tw, "  size\t%s\n", size(cl.Bytes))
	if cl.Cadence != "" {
		fmt.Fprintf(tw, "  last backup\t%s (cadence %s)\n", when(cl.LastBackup), cl.Cadence)
	}
	if cl.OnRemovedNode() {
		fmt.Fprintf(tw, "  node\t%s, removed %s: no host can act; it is recorded deleted by hand\n", cl.Node, cl.NodeRemovedAt.Format(timeShown))
	}
	fmt.Fprintf(tw, "  digest\t%s\n", cl.Digest)
	tw.Flush()
}

// CleanupDeleteCmd is cleanup delete.
type CleanupDeleteCmd struct {
	Node      Name   `arg:"" predictor:"node" optional:"" help:"The provider's node."`
	Module    Name   `arg:"" predictor:"module" optional:"" help:"The provider's module."`
	Target    string `arg:"" optional:"" name:"consumer" help:"The retired consumer (node/module), or the retired data set's name."`
	OlderThan int    `name:"older-than" placeholder:"DAYS" help:"Every retired consumer and data set older than this many days."`
	Why       string `required:"" help:"Why; recorded in the hand-act log."`
	Confirm   bool   `help:"With --older-than: delete; without it, only list."`
	Yes       string `placeholder:"DIGEST" help:"The digest of the preview this command printed: deletes irreplaceable or costly data with no backup within its cadence, exactly as previewed."`
}

// Run deletes (or lists what --older-than would delete, or previews what
// needs a digest).
func (c *CleanupDeleteCmd) Run(env *Env, sts *app.Seats) error {
	switch {
	case c.OlderThan > 0 && c.Target != "":
		return clirun.UsageError{Msg: "give NODE MODULE CONSUMER or --older-than DAYS, not both"}
	case c.OlderThan <= 0 && c.Target == "":
		return clirun.UsageError{Msg: "give NODE MODULE CONSUMER, or --older-than DAYS"}
	case c.Confirm && c.OlderThan <= 0:
		return clirun.UsageError{Msg: "--confirm goes with --older-than"}
	case c.Yes != "" && c.OlderThan > 0:
		return clirun.UsageError{Msg: "--yes confirms one target's preview: delete those that need it one by one, without --older-than"}
	}
	r, err := sts.CleanupDelete(env.Ctx, app.CleanupRequest{Node: string(c.Node), Module: string(c.Module), Target: c.Target,
		OlderThanDays: c.OlderThan, Why: c.Why, Confirm: c.Confirm, Yes: c.Yes})
	var de *app.DigestError
	if errors.As(err, &de) {
		for _, cl := range r.Preview {
			printPreview(env, cl)
		}
		return err
	}
	if c.OlderThan > 0 && !c.Confirm && err == nil {
		if len(r.Preview) == 0 {
			fmt.Fprintf(env.Stderr, "nothing retired is older than %s\n", app.Plural(c.OlderThan, "day"))
			return nil
		}
		printCleanables(env, r.Preview)
		if len(r.Preview) == 1 {
			fmt.Fprintln(env.Stderr, "nothing deleted: add --confirm to delete it")
		} else {
			fmt.Fprintf(env.Stderr, "nothing deleted: add --confirm to delete these %d\n", len(r.Preview))
		}
		needs := 0
		for _, cl := range r.Preview {
			if cl.NeedsDigest {
				needs++
			}
		}
		if needs > 0 {
			fmt.Fprintf(env.Stderr, "%d of them (needs --yes) are refused even with --confirm: delete each alone, with the digest of its preview\n", needs)
		}
		return nil
	}
	printFresh(env, r.Fresh)
	for _, cl := range r.Deleted {
		if cl.OnRemovedNode() {
			fmt.Fprintf(env.Stdout, "%s/%s %s (%s) recorded deleted by hand: %s was removed, no host can act; wipe its disk if that is not done\n", cl.Node, cl.Module, cl.Target, cl.Kind, cl.Node)
		} else {
			fmt.Fprintf(env.Stdout, "%s/%s deletes %s (%s); its host reports when it is gone\n", cl.Node, cl.Module, cl.Target, cl.Kind)
		}
	}
	printPushed(env, r.Pushed)
	return err
}

// DataCmd groups the data commands; alone it lists.
type DataCmd struct {
	List      DataListCmd      `cmd:"" default:"withargs" hidden:"" help:"Every data set every machine declares: size, preciousness, state, last backup, backup holder."`
	Backup    DataBackupCmd    `cmd:"" help:"Back data sets up now (NODE/MODULE/DATASET…), each waited for: its snapshot, files, bytes added."`
	Snapshots DataSnapshotsCmd `cmd:"" help:"What the repository holds of a data set, newest first."`
	Restore   DataRestoreCmd   `cmd:"" help:"Restore a data set from a snapshot: its module stopped, what is there moved aside (kept, retired), the snapshot restored, the module started."`
	Verify    DataVerifyCmd    `cmd:"" help:"A restore drill of a data set's latest snapshot now: restored into a scratch dir on the holder, every file verified, the repository checked."`
}

// DataListCmd is data [list].
type DataListCmd struct {
	JSON bool `name:"json" help:"Print one JSON array."`
}

// Run lists every data set every machine declares.
func (c *DataListCmd) Run(env *Env, sts *app.Seats) error {
	ds, err := sts.Data(env.Ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, ds)
	}
	if len(ds) == 0 {
		fmt.Fprintln(env.Stderr, "no data sets")
		return nil
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tMODULE\tNAME\tPATH\tSIZE\tPRECIOUS\tSTATE\tLAST BACKUP\tBACKUP HOLDER")
	for _, d := range ds {
		size := "-"
		if d.Bytes != nil {
			size = fmt.Sprint(*d.Bytes)
		}
		node := d.Node
		if d.NodeRemovedAt != nil {
			node += " (removed)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", node, d.Module, d.Name, d.Path, size, d.Precious, d.State, when(d.LastBackup), dash(d.BackupHolder))
	}
	return tw.Flush()
}
