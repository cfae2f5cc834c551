package inventory

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"mesh-controller/embedded/sqlite"
)

// FilterNftables is the one packet filter the mesh can own on a node: an
// nftables table of its own.
const FilterNftables = "nftables"

// ErrAdoptedAlready means a node asked to be adopted is adopted already.
var ErrAdoptedAlready = sqlite.Refusal("is adopted already")

// Filter is the packet filter the mesh owns on a converged node.
type Filter struct {
	// Kind is FilterNftables.
	Kind string
	// CloseSSH says the person asked the SSH port the node reports be
	// closed too (converge --close-ssh); by default it stays open.
	CloseSSH bool
	// Since is when the node was converged with it.
	Since time.Time
}

// Converge makes a node converged, the mesh owning the filter f on it (nil:
// none), in one transaction; its plan moves, so its next declaration
// carries the filter (or none).
func (s *Store) Converge(ctx context.Context, node string, f *Filter, based int64) (err error) {
	defer s.db.Failing(&err, "converge node %s", node)
	if f != nil && f.Kind != FilterNftables {
		return fmt.Errorf("filter %q: only %s is known", f.Kind, FilterNftables)
	}
	return s.db.Write(ctx, func(tx *sql.Tx) error {
		// An act: judged acts committing after it are judged again.
		if err := moveRevision(ctx, tx, based); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `UPDATE nodes SET mode = ?, plan_version = plan_version + 1 WHERE name = ?`, string(Converged), node)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("node %s %w", node, ErrNodeNotFound)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM node_filters WHERE node = ?`, node); err != nil {
			return err
		}
		if f == nil {
			return nil
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO node_filters (node, kind, close_ssh, since) VALUES (?, ?, ?, ?)`,
			node, f.Kind, f.CloseSSH, sqlite.FormatTime(f.Since))
		return err
	})
}

// Adopt returns a converged node to adopted in one transaction: the mesh
// owns no filter there any more (its next declaration carries none, and
// its host removes the mesh's table); its assignments, what was taken
// included, stay as they are. ErrNodeNotFound, or ErrAdoptedAlready.
func (s *Store) Adopt(ctx context.Context, node string) (err error) {
	defer s.db.Failing(&err, "adopt node %s", node)
	return s.db.Write(ctx, func(tx *sql.Tx) error {
		// An act: judged acts committing after it are judged again.
		if err := moveRevision(ctx, tx, 0); err != nil {
			return err
		}
		var mode string
		err := tx.QueryRowContext(ctx, `SELECT mode FROM nodes WHERE name = ?`, node).Scan(&mode)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("node %s %w", node, ErrNodeNotFound)
		}
		if err != nil {
			return err
		}
		if Mode(mode) == Adopted {
			return fmt.Errorf("node %s %w", node, ErrAdoptedAlready)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM node_filters WHERE node = ?`, node); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `UPDATE nodes SET mode = ?, plan_version = plan_version + 1 WHERE name = ?`, string(Adopted), node)
		return err
	})
}

// NodeFilters returns the filter the mesh owns on each node that has one,
// by node.
func (s *Store) NodeFilters(ctx context.Context) (_ map[string]Filter, err error) {
	defer s.db.Failing(&err, "read the nodes' filters")
	tx, err := s.db.Reader.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	return nodeFilters(ctx, tx)
}

// nodeFilters reads node_filters within tx (a snapshot's, or its own).
func nodeFilters(ctx context.Context, tx *sql.Tx) (map[string]Filter, error) {
	out := map[string]Filter{}
	err := each(ctx, tx, `SELECT node, kind, close_ssh, since FROM node_filters`, func(r *sql.Rows) error {
		var node, since string
		var f Filter
		if err := r.Scan(&node, &f.Kind, &f.CloseSSH, &since); err != nil {
			return err
		}
		var err error
		f.Since, err = sqlite.ParseTime(since)
		out[node] = f
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read node filters: %w", err)
	}
	return out, nil
}

// FactNamed returns one fact of every node that reported it, by node:
// what a rule judges across the fleet reads one fact, not all of them.
func (s *Store) FactNamed(ctx context.Context, name string) (_ map[string]Fact, err error) {
	defer s.db.Failing(&err, "read fact %s", name)
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT node, name, value, why FROM node_facts WHERE name = ?`, name)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]Fact{}
	for rows.Next() {
		var node string
		var f Fact
		if err := rows.Scan(&node, &f.Name, &f.Value, &f.Why); err != nil {
			return nil, err
		}
		out[node] = f
	}
	return out, rows.Err()
}
