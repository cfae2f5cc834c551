// Package inventory owns nodes (and, as the mesh grows, modules, assignments,
// settings, seats, bindings, data sets and declarations) and the inventory
// store. It imports no other context.
package inventory

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"mesh-controller/embedded/sqlite"
)

var (
	// ErrNodeExists means a node of that name is already recorded.
	ErrNodeExists = errors.New("exists already")
	// ErrNodeNotFound means no node of that name is recorded.
	ErrNodeNotFound = errors.New("is not known")
)

// Mode says how much of a machine the mesh owns.
type Mode string

const (
	// Converged: the machine is the mesh's entirely.
	Converged Mode = "converged"
	// Adopted: the machine was already in use; the mesh touches only its own modules.
	Adopted Mode = "adopted"
)

// Node is a machine the mesh knows.
type Node struct {
	Name      string
	Mode      Mode
	CreatedAt time.Time
	// JoinedAt is when its host presented its token; nil until then.
	JoinedAt *time.Time
	// LastHeard is when the mesh last heard from its host; nil if never.
	LastHeard *time.Time
}

// Store is the inventory context's store.
type Store struct {
	db *sqlite.DB
}

// NewStore wraps an open, migrated inventory store.
func NewStore(db *sqlite.DB) *Store { return &Store{db: db} }

// AddNode records a node; a name already recorded is ErrNodeExists.
func (s *Store) AddNode(ctx context.Context, name string, mode Mode, now time.Time) (Node, error) {
	n := Node{Name: name, Mode: mode, CreatedAt: now.UTC().Truncate(time.Millisecond)}
	err := s.db.Write(ctx, func(tx *sql.Tx) error {
		var exists int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM nodes WHERE name = ?`, name).Scan(&exists); err != nil {
			return err
		}
		if exists > 0 {
			return fmt.Errorf("node %s %w", name, ErrNodeExists)
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO nodes (name, mode, created_at) VALUES (?, ?, ?)`,
			name, string(mode), sqlite.FormatTime(now))
		return err
	})
	if errors.Is(err, ErrNodeExists) {
		return Node{}, err
	}
	if err != nil {
		return Node{}, fmt.Errorf("add node %s: %w", name, err)
	}
	return n, nil
}

const nodeColumns = `name, mode, created_at, joined_at, last_heard`

func scanNode(sc interface{ Scan(...any) error }) (Node, error) {
	var n Node
	var mode, created string
	var joined, heard sql.NullString
	if err := sc.Scan(&n.Name, &mode, &created, &joined, &heard); err != nil {
		return Node{}, err
	}
	n.Mode = Mode(mode)
	var err error
	if n.CreatedAt, err = sqlite.ParseTime(created); err != nil {
		return Node{}, err
	}
	if n.JoinedAt, err = sqlite.ParseNullTime(joined); err != nil {
		return Node{}, err
	}
	if n.LastHeard, err = sqlite.ParseNullTime(heard); err != nil {
		return Node{}, err
	}
	return n, nil
}

// Node returns one node, or ErrNodeNotFound.
func (s *Store) Node(ctx context.Context, name string) (Node, error) {
	row := s.db.Reader.QueryRowContext(ctx, `SELECT `+nodeColumns+` FROM nodes WHERE name = ?`, name)
	n, err := scanNode(row)
	if errors.Is(err, sql.ErrNoRows) {
		return Node{}, fmt.Errorf("node %s %w", name, ErrNodeNotFound)
	}
	if err != nil {
		return Node{}, fmt.Errorf("read node %s: %w", name, err)
	}
	return n, nil
}

// Nodes returns every node, by name.
func (s *Store) Nodes(ctx context.Context) ([]Node, error) {
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT `+nodeColumns+` FROM nodes ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	defer rows.Close()
	nodes := []Node{}
	for rows.Next() {
		n, err := scanNode(rows)
		if err != nil {
			return nil, fmt.Errorf("list nodes: %w", err)
		}
		nodes = append(nodes, n)
	}
	return nodes, rows.Err()
}
