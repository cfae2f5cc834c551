package inventory

import (
	"context"
	"database/sql"
	"encoding/json"
	"time"

	"mesh-controller/embedded/sqlite"
)

// ErrAssigned means a module is already on that node.
var ErrAssigned = sqlite.Refusal("is already assigned there")

// ErrNotAssigned means a module is not on that node.
var ErrNotAssigned = sqlite.Refusal("is not assigned there")

// Assignment is a module put on a node, at the version its plan declares.
type Assignment struct {
	Node       string
	Module     string
	Version    string
	AssignedAt time.Time
	// Unverified are requirements not judged yet: the node had not reported the facts.
	Unverified []string
	// Pending is a version recorded by 'upgrade record' and not yet sent.
	Pending string
	// Taken says the module was taken onto an adopted node (take), and
	// from what; nil when it was assigned plainly.
	Taken *Take
}

// Take is how a module came onto an adopted node by take: the cutover a
// person approved (the preview's digest, the units and processes to stop)
// and what ran there before, as the preview said it.
type Take struct {
	Digest    string        `json:"digest"`
	At        time.Time     `json:"at"`
	From      []string      `json:"from"`
	Units     []string      `json:"units,omitempty"`
	Processes []TakeProcess `json:"processes,omitempty"`
}

// TakeProcess is one process a take's cutover stops: only while its pid
// still runs that command.
type TakeProcess struct {
	Pid     int    `json:"pid"`
	Command string `json:"command"`
}

// SettingsLayer is the mesh's (Node "") or one node's settings for a module.
type SettingsLayer struct {
	Module string
	Node   string
	Body   json.RawMessage
	SetAt  time.Time
}

// Retirement is what happened to one data set when its module left a node
// (or, with Consumer set, to what a provider on a removed node kept for one
// consumer). Retired and dropped data is still on the node's disk: it stays
// listed until a person cleans it up.
type Retirement struct {
	ID        int64     `json:"id"`
	Node      string    `json:"node"`
	Module    string    `json:"module"`
	DataSet   string    `json:"data_set"`
	Path      string    `json:"path"`
	Precious  string    `json:"precious"`
	Consumer  string    `json:"consumer"`
	State     string    `json:"state"` // retired, dropped, deleted, reactivated
	Bytes     *int64    `json:"bytes"`
	RetiredAt time.Time `json:"retired_at"`
	Why       string    `json:"why"`
	// NodeRemovedAt is when its node was removed; nil while the node is in
	// the mesh. A node added later under the same name is another record.
	NodeRemovedAt *time.Time `json:"node_removed_at"`
	// LastBackup is the last backup heard of it when its node was removed
	// (the node's own reports went with it); nil otherwise.
	LastBackup *time.Time `json:"last_backup"`
}

// bump moves the plans of nodes: their declarations are then behind.
func bump(ctx context.Context, tx *sql.Tx, nodes []string) error {
	if len(nodes) == 0 {
		return nil
	}
	// Prepared once: an act may move every node's plan.
	stmt, err := tx.PrepareContext(ctx, `UPDATE nodes SET plan_version = plan_version + 1 WHERE name = ?`)
	if err != nil {
		return err
	}
	defer stmt.Close()
	for _, n := range nodes {
		if _, err := stmt.ExecContext(ctx, n); err != nil {
			return err
		}
	}
	return nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// SetSettings keeps a settings layer; the plans of the bump nodes move.
func (s *Store) SetSettings(ctx context.Context, l SettingsLayer, bumpNodes []string) (err error) {
	defer s.db.Failing(&err, "set the settings of %s", l.Module)
	return s.db.Write(ctx, func(tx *sql.Tx) error {
		// An act: judged acts committing after it are judged again.
		if err := moveRevision(ctx, tx, 0); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO settings_layers (module, node, body, set_at) VALUES (?, ?, ?, ?) ON CONFLICT (module, node) DO UPDATE SET body = excluded.body, set_at = excluded.set_at`,
			l.Module, l.Node, string(l.Body), sqlite.FormatTime(l.SetAt)); err != nil {
			return err
		}
		return bump(ctx, tx, bumpNodes)
	})
}

// ClearSettings takes a settings layer away; cleared says there was one.
func (s *Store) ClearSettings(ctx context.Context, module, node string, bumpNodes []string) (cleared bool, err error) {
	defer s.db.Failing(&err, "clear the settings of %s", module)
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		// An act: judged acts committing after it are judged again.
		if err := moveRevision(ctx, tx, 0); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `DELETE FROM settings_layers WHERE module = ? AND node = ?`, module, node)
		if err != nil {
			return err
		}
		n, _ := res.RowsAffected()
		if cleared = n > 0; !cleared {
			return nil
		}
		return bump(ctx, tx, bumpNodes)
	})
	return cleared, err
}

// BumpPlans moves the plans of nodes (something they depend on changed).
func (s *Store) BumpPlans(ctx context.Context, nodes []string) (err error) {
	defer s.db.Failing(&err, "move the plans of %d nodes", len(nodes))
	return s.db.Write(ctx, func(tx *sql.Tx) error { return bump(ctx, tx, nodes) })
}

// Retirements returns what was retired or dropped on a node ("" for all),
// oldest first.
func (s *Store) Retirements(ctx context.Context, node string) (_ []Retirement, err error) {
	defer s.db.Failing(&err, "read the retirements on %s", node)
	query := `SELECT ` + retirementColumns + ` FROM retirements`
	var args []any
	if node != "" {
		query += ` WHERE node = ?`
		args = append(args, node)
	}
	rows, err := s.db.Reader.QueryContext(ctx, query+` ORDER BY id`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	rs := []Retirement{}
	for rows.Next() {
		r, err := scanRetirement(rows)
		if err != nil {
			return nil, err
		}
		rs = append(rs, r)
	}
	return rs, rows.Err()
}

// retirementColumns are what scanRetirement reads.
const retirementColumns = `id, node, module, data_set, path, precious, consumer, state, bytes, retired_at, why, node_removed_at, last_backup`

// scanRetirement reads a row of retirementColumns.
func scanRetirement(rows *sql.Rows) (Retirement, error) {
	var r Retirement
	var at string
	var bytes sql.NullInt64
	var removed, backup sql.NullString
	if err := rows.Scan(&r.ID, &r.Node, &r.Module, &r.DataSet, &r.Path, &r.Precious, &r.Consumer, &r.State, &bytes, &at, &r.Why, &removed, &backup); err != nil {
		return r, err
	}
	if bytes.Valid {
		r.Bytes = &bytes.Int64
	}
	var err error
	if r.RetiredAt, err = sqlite.ParseTime(at); err != nil {
		return r, err
	}
	if r.NodeRemovedAt, err = sqlite.ParseNullTime(removed); err != nil {
		return r, err
	}
	r.LastBackup, err = sqlite.ParseNullTime(backup)
	return r, err
}

// Assigned is which of nodes have a module assigned: a rack that joined
// together is asked about in one query, not one each.
func (s *Store) Assigned(ctx context.Context, nodes []string) (_ map[string]bool, err error) {
	defer s.db.Failing(&err, "read which of %d nodes have assignments", len(nodes))
	out := map[string]bool{}
	err = sqlite.InChunks(nodes, func(marks string, args []any) error {
		rows, err := s.db.Reader.QueryContext(ctx, `SELECT DISTINCT node FROM assignments WHERE node IN (`+marks+`)`, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var node string
			if err := rows.Scan(&node); err != nil {
				return err
			}
			out[node] = true
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// AssignmentsOn lists what is assigned to one node, by module.
func (s *Store) AssignmentsOn(ctx context.Context, node string) (_ []Assignment, err error) {
	defer s.db.Failing(&err, "read the assignments on %s", node)
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT module, version, assigned_at, coalesce(pending_version, '') FROM assignments WHERE node = ? ORDER BY module`, node)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Assignment
	for rows.Next() {
		a := Assignment{Node: node}
		var at string
		if err := rows.Scan(&a.Module, &a.Version, &at, &a.Pending); err != nil {
			return nil, err
		}
		if a.AssignedAt, err = sqlite.ParseTime(at); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

// CountNodes counts every node, and those whose host joined (an added
// node waits for its host until then): one query, for a scrape at any size.
func (s *Store) CountNodes(ctx context.Context) (all, joined int, err error) {
	defer s.db.Failing(&err, "count the nodes")
	err = s.db.Reader.QueryRowContext(ctx, `SELECT count(*), count(joined_at) FROM nodes`).Scan(&all, &joined)
	return all, joined, err
}
