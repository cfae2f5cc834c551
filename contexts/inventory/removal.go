package inventory

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"mesh-controller/embedded/sqlite"
)

// ErrStillAssigned means a node to be removed still has modules assigned.
var ErrStillAssigned = sqlite.Refusal("still has modules assigned")

// Removal is what removing nodes did to the inventory.
type Removal struct {
	// Kept counts the retired and dropped data sets left on their disks,
	// now remembered under the removal until a person cleans them up.
	Kept int
	// Cancelled are deletions a person asked that no host will carry out
	// now; what they would have deleted stays listed.
	Cancelled []Deletion
}

// RemoveNodes takes nodes out of the inventory in one transaction, all or
// none: a node that is not known, or still has modules assigned, refuses
// the whole removal. Each node's retired and dropped data stays, marked
// with the removal and keeping its size and last backup as last heard
// (its reports and backup records go with it), and consumerData is what
// its providers kept for their consumers, remembered the same way. Its
// record, facts, data reports, declaration, pins, settings layer and
// pending deletions go; pins naming it as a provider go; replacements it
// was to take over are resolved. A node added later under the same name
// is a fresh record. based is the act revision the removal was judged on
// (0: not judged on a snapshot): another act committed since refuses it
// with ErrActConflict.
func (s *Store) RemoveNodes(ctx context.Context, nodes []string, consumerData []Retirement, based int64, now time.Time) (_ Removal, err error) {
	defer s.db.Failing(&err, "remove nodes")
	var out Removal
	at := sqlite.FormatTime(now)
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		out = Removal{}
		if err := moveRevision(ctx, tx, based); err != nil {
			return err
		}
		known := make(map[string]bool, len(nodes))
		err := sqlite.InChunks(nodes, func(marks string, args []any) error {
			names, err := sqlite.Strings(ctx, tx, `SELECT name FROM nodes WHERE name IN (`+marks+`)`, args...)
			for _, n := range names {
				known[n] = true
			}
			if err != nil {
				return err
			}
			var node, module string
			err = tx.QueryRowContext(ctx, `SELECT node, module FROM assignments WHERE node IN (`+marks+`) ORDER BY node, module LIMIT 1`, args...).Scan(&node, &module)
			if err == nil {
				return fmt.Errorf("node %s %w (%s)", node, ErrStillAssigned, module)
			}
			if !errors.Is(err, sql.ErrNoRows) {
				return err
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, n := range nodes {
			if !known[n] {
				return fmt.Errorf("node %s %w", n, ErrNodeNotFound)
			}
		}
		err = sqlite.InChunks(nodes, func(marks string, args []any) error {
			// What is left on their disks is remembered with what was last
			// heard of it, before their reports go with them.
			res, err := tx.ExecContext(ctx, `UPDATE retirements SET node_removed_at = ?,
				bytes = coalesce((SELECT d.bytes FROM node_data_sets d
					WHERE d.node = retirements.node AND d.module = retirements.module AND d.name = retirements.data_set), bytes),
				last_backup = (SELECT max(t) FROM (
					SELECT d.last_backup AS t FROM node_data_sets d
						WHERE d.node = retirements.node AND d.module = retirements.module AND d.name = retirements.data_set
					UNION ALL SELECT b.last_backup FROM backups b
						WHERE b.node = retirements.node AND b.module = retirements.module AND b.name = retirements.data_set) AS heard)
				WHERE node IN (`+marks+`) AND consumer = '' AND state IN ('retired', 'dropped') AND node_removed_at IS NULL`,
				append([]any{at}, args...)...)
			if err != nil {
				return err
			}
			n, _ := res.RowsAffected()
			out.Kept += int(n)
			if err := each(ctx, tx, `SELECT `+deletionColumns+` FROM deletions WHERE done_at IS NULL AND node IN (`+marks+`) ORDER BY id`, func(r *sql.Rows) error {
				d, err := scanDeletion(r)
				if err == nil {
					out.Cancelled = append(out.Cancelled, d)
				}
				return err
			}, args...); err != nil {
				return err
			}
			for _, q := range []string{
				`DELETE FROM deletions WHERE done_at IS NULL AND node IN (` + marks + `)`,
				// What they provided is theirs no longer; the data kept for
				// consumers is remembered below, from consumerData.
				`DELETE FROM consumers WHERE provider_node IN (` + marks + `)`,
				`DELETE FROM pins WHERE provider_node IN (` + marks + `)`,
				`DELETE FROM settings_layers WHERE node IN (` + marks + `)`,
				`DELETE FROM backups WHERE node IN (` + marks + `)`,
				`DELETE FROM backup_states WHERE node IN (` + marks + `)`,
				`DELETE FROM backup_runs WHERE node IN (` + marks + `)`,
				`DELETE FROM backup_access WHERE node IN (` + marks + `)`,
			} {
				if _, err := tx.ExecContext(ctx, q, args...); err != nil {
					return err
				}
			}
			// new_holder is node/module: a LIKE per node, the same on both engines.
			holders := strings.TrimSuffix(strings.Repeat(`new_holder LIKE ? || '/%' OR `, len(args)), " OR ")
			if _, err := tx.ExecContext(ctx, `UPDATE replacements SET resolved_at = ?
				WHERE resolved_at IS NULL AND (`+holders+`)`, append([]any{at}, args...)...); err != nil {
				return err
			}
			// A node of the overlay (its host reported a WireGuard key) is
			// a peer of others: the plans of every node that knows a key
			// move, as when a key changes (RecordFacts).
			if _, err := tx.ExecContext(ctx, `UPDATE nodes SET plan_version = plan_version + 1
				WHERE name IN (SELECT node FROM node_facts WHERE name = ?)
				AND EXISTS (SELECT 1 FROM node_facts WHERE name = ? AND node IN (`+marks+`))`,
				append([]any{factWireGuardKey, factWireGuardKey}, args...)...); err != nil {
				return err
			}
			// Their facts, found, data reports, declarations and own pins go
			// with them (ON DELETE CASCADE).
			_, err = tx.ExecContext(ctx, `DELETE FROM nodes WHERE name IN (`+marks+`)`, args...)
			return err
		})
		if err != nil {
			return err
		}
		for _, r := range consumerData {
			if _, err := tx.ExecContext(ctx, `INSERT INTO retirements (node, module, data_set, path, precious, consumer, state, bytes, retired_at, why, node_removed_at)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
				r.Node, r.Module, r.DataSet, r.Path, r.Precious, r.Consumer, r.State, r.Bytes, sqlite.FormatTime(r.RetiredAt), r.Why, at); err != nil {
				return err
			}
			out.Kept++
		}
		return nil
	})
	if err != nil {
		return Removal{}, err
	}
	return out, nil
}
