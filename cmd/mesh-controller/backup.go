package main

import (
	"mesh-controller/app"

	"fmt"
	"strings"
)

// BackupCmd is store backup.
type BackupCmd struct {
	Out string `required:"" placeholder:"FILE" help:"Where to write it (created 0600, never overwritten)."`
}

// Run backs every store up into one sealed file.
func (c *BackupCmd) Run(env *Env, cps *app.Copies) error {
	b, err := cps.Backup(env.Ctx, c.Out)
	if err != nil {
		return err
	}
	for _, s := range b.Manifest.Stores {
		fmt.Fprintf(env.Stdout, "%-10s schema %d  %9d bytes  sha256 %s\n", s.Context, s.SchemaVersion, s.Bytes, s.SHA256)
	}
	for _, s := range b.Manifest.Elsewhere {
		fmt.Fprintf(env.Stdout, "%-10s skipped: on PostgreSQL (%s), its database's own to back up: pg_dump --format=custom --file=%s.pgdump \"$%s\"\n",
			s.Context, s.Store, s.Context, s.Var)
	}
	fmt.Fprintf(env.Stdout, "backup written to %s: %d bytes, sealed to the operator key %s, in %d ms\n",
		b.File, b.Bytes, b.Recipient, b.Took.Milliseconds())
	fmt.Fprintf(env.Stderr, "restore needs it and the operator key's private half: keep both off this machine, and apart; "+
		"'mesh-controller store restore %s --data DIR --key OPERATOR-KEY-FILE'\n", b.File)
	return nil
}

// RestoreCmd is store restore.
type RestoreCmd struct {
	File InputFile `arg:"" help:"A file 'mesh-controller store backup' or 'serve --backup-every' wrote."`
	Key  InputFile `required:"" placeholder:"FILE" help:"The operator key file (its private half)."`
}

// Run restores the backup into the data dir (--data), which must be new or empty.
func (c *RestoreCmd) Run(env *Env) error {
	r, err := env.App.Restore(env.Ctx, string(c.File), string(c.Key))
	if err != nil {
		return err
	}
	w := env.Stdout
	fmt.Fprintf(w, "restored the backup made %s into %s\n", r.MadeAt.Format(timeShown), r.Dir)
	behind := false
	for _, s := range r.Stores {
		note := ""
		if s.Behind() {
			behind = true
			note = fmt.Sprintf(", behind this binary's %d: run migrate", s.Known)
		}
		fmt.Fprintf(w, "  %-10s schema %d%s  %9d bytes  integrity ok\n", s.Context, s.SchemaVersion, note, s.Bytes)
	}
	if len(r.Missing) > 0 {
		behind = true
		fmt.Fprintf(w, "  not in the backup: %s (an older binary made it): migrate makes them, empty\n", strings.Join(r.Missing, ", "))
	}
	if r.Fingerprint != "" {
		fmt.Fprintf(w, "signing key %s, as before", r.Fingerprint)
		if r.Hosts > 0 {
			if r.Hosts == 1 {
				fmt.Fprint(w, ": 1 joined host keeps trusting this controller and need not join again")
			} else {
				fmt.Fprintf(w, ": %d joined hosts keep trusting this controller and need not join again", r.Hosts)
			}
		}
		fmt.Fprintln(w)
	}
	if r.Lease != nil {
		fmt.Fprintf(w, "the lease held when the backup was made (pid %d on %s) is given back\n", r.Lease.PID, r.Lease.Host)
	}
	for _, s := range r.Elsewhere {
		fmt.Fprintf(w, "  %-10s not in the backup: it was on PostgreSQL (%s); restore its database from its own dump: pg_restore --dbname=\"$%s\" %s.pgdump\n",
			s.Context, s.Store, s.Var, s.Context)
	}
	for _, s := range r.OnPostgres {
		fmt.Fprintf(w, "  %-10s skipped: %s names a database on PostgreSQL (%s): serve reads that, not a file here; restore it with PostgreSQL's own tools (pg_restore)\n",
			s.Context, s.Var, s.Store)
	}
	if len(r.Moved) > 0 {
		fmt.Fprintf(w, "note: %s set: serve would read the store it names, not the one restored here; unset it\n", strings.Join(r.Moved, ", "))
	}
	data := quoteArg(r.Dir)
	if behind {
		fmt.Fprintf(w, "next: mesh-controller --data %s migrate, then mesh-controller --data %s serve\n", data, data)
	} else {
		fmt.Fprintf(w, "next: mesh-controller --data %s serve (on the address hosts dial, so they reconnect by themselves)\n", data)
	}
	return nil
}

// quoteArg quotes a path for a shell when it needs it.
func quoteArg(s string) string {
	if s != "" && !strings.ContainsAny(s, " \t\n'\"\\$`!*?[]{}()<>|&;#~") {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
