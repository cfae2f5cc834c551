// Package inventory owns nodes, modules and their versions, assignments,
// settings layers, seats, provisions, bindings, pins, data sets and
// retirements, what was declared to each node, the rules judged over them,
// and the inventory store. A module's manifest is its subpackage manifest,
// which holds no store. It imports no other context.
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
	ErrNodeExists = sqlite.Refusal("exists already")
	// ErrNodeNotFound means no node of that name is recorded.
	ErrNodeNotFound = sqlite.Refusal("is not known")
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
	// SerialDeclared is the serial of its latest declaration; 0 if none.
	SerialDeclared int64
	// SerialApplied is the highest serial its host reported applied; 0 if none.
	SerialApplied int64
	// HeartbeatIntervalS is the interval its host says it beats at.
	HeartbeatIntervalS float64
	// UptimeS is the host's uptime at its last heartbeat.
	UptimeS int64
	// LastOutcome is its host's latest apply report; nil if none.
	LastOutcome *Outcome
	// Applying is what its host's latest beat said it was applying; nil
	// if nothing.
	Applying *Applying
	// PlanVersion moves each time its plan changes; DeclaredPlanVersion is
	// the plan version its latest declaration was made from.
	PlanVersion, DeclaredPlanVersion int64
	// Pending counts its assignments with a version recorded (upgrade
	// record) and not yet sent.
	Pending int
	// HostVersion is what its host says it runs ("" until it joined);
	// HostRelease the host release declared to it ("" for none: its host
	// is left on what it runs).
	HostVersion, HostRelease string
}

// Behind says the node's declaration is older than its plan, its host has
// not applied its latest declaration, or a version was recorded for it and
// not yet sent.
func (n Node) Behind() bool {
	return n.PlanVersion > n.DeclaredPlanVersion || n.SerialApplied < n.SerialDeclared || n.Pending > 0
}

// Store is the inventory context's store.
type Store struct {
	db *sqlite.DB
}

// NewStore wraps an open, migrated inventory store.
func NewStore(db *sqlite.DB) *Store { return &Store{db: db} }

// AddNode records a node; a name already recorded is ErrNodeExists.
func (s *Store) AddNode(ctx context.Context, name string, mode Mode, now time.Time) (_ Node, err error) {
	defer s.db.Failing(&err, "add node %s", name)
	n := Node{Name: name, Mode: mode, CreatedAt: now.UTC().Truncate(time.Millisecond)}
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		if err := moveRevision(ctx, tx, 0); err != nil {
			return err
		}
		var exists int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM nodes WHERE name = ?`, name).Scan(&exists); err != nil {
			return err
		}
		if exists > 0 {
			return fmt.Errorf("node %s %w", name, ErrNodeExists)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO nodes (name, mode, created_at) VALUES (?, ?, ?)`,
			name, string(mode), sqlite.FormatTime(now)); err != nil {
			return err
		}
		return takeOverlayIndex(ctx, tx, name)
	})
	if err != nil {
		return Node{}, err
	}
	return n, nil
}

const nodeColumns = `n.name, n.mode, n.created_at, n.joined_at, n.last_heard, coalesce(d.serial, 0), n.serial_applied,
	coalesce(n.heartbeat_interval_s, 0), coalesce(n.uptime_s, 0), n.applied_serial, n.applied_ok, coalesce(n.applied_error, ''), coalesce(n.applied_ms, 0), n.applied_at,
	n.plan_version, coalesce(d.plan_version, 0),
	(SELECT count(*) FROM assignments a WHERE a.node = n.name AND a.pending_version IS NOT NULL),
	n.applying_serial, n.applying_since, coalesce(n.applying_phase, ''), coalesce(n.host_version, ''), coalesce(n.host_release, '')`

const nodesFrom = ` FROM nodes n LEFT JOIN declarations d INDEXED BY declarations_versions ON d.node = n.name`

func scanNode(sc interface{ Scan(...any) error }) (Node, error) {
	var n Node
	var mode, created string
	var joined, heard, appliedAt sql.NullString
	var appliedSerial, applyingSerial sql.NullInt64
	var applyingSince sql.NullString
	var applyingPhase string
	var appliedOK sql.NullBool
	var o Outcome
	if err := sc.Scan(&n.Name, &mode, &created, &joined, &heard, &n.SerialDeclared, &n.SerialApplied,
		&n.HeartbeatIntervalS, &n.UptimeS, &appliedSerial, &appliedOK, &o.Error, &o.TotalMS, &appliedAt,
		&n.PlanVersion, &n.DeclaredPlanVersion, &n.Pending, &applyingSerial, &applyingSince, &applyingPhase, &n.HostVersion, &n.HostRelease); err != nil {
		return Node{}, err
	}
	if applyingSerial.Valid && applyingSince.Valid {
		since, err := sqlite.ParseTime(applyingSince.String)
		if err != nil {
			return Node{}, err
		}
		n.Applying = &Applying{Serial: applyingSerial.Int64, Since: since, Phase: applyingPhase}
	}
	if appliedSerial.Valid && appliedAt.Valid {
		o.Serial, o.OK = appliedSerial.Int64, appliedOK.Bool
		at, err := sqlite.ParseTime(appliedAt.String)
		if err != nil {
			return Node{}, err
		}
		o.At = at
		n.LastOutcome = &o
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
func (s *Store) Node(ctx context.Context, name string) (_ Node, err error) {
	defer s.db.Failing(&err, "read node %s", name)
	row := s.db.Reader.QueryRowContext(ctx, `SELECT `+nodeColumns+nodesFrom+` WHERE n.name = ?`, name)
	n, err := scanNode(row)
	if errors.Is(err, sql.ErrNoRows) {
		return Node{}, fmt.Errorf("node %s %w", name, ErrNodeNotFound)
	}
	if err != nil {
		return Node{}, err
	}
	return n, nil
}

// Nodes returns every node, by name.
func (s *Store) Nodes(ctx context.Context) (_ []Node, err error) {
	defer s.db.Failing(&err, "list nodes")
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT `+nodeColumns+nodesFrom+` ORDER BY n.name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	nodes := []Node{}
	for rows.Next() {
		n, err := scanNode(rows)
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, n)
	}
	return nodes, rows.Err()
}

// NodesNamed returns those of the named nodes that are recorded: what one
// waiting on a few nodes reads, not every node.
func (s *Store) NodesNamed(ctx context.Context, names []string) (_ []Node, err error) {
	defer s.db.Failing(&err, "read nodes")
	var nodes []Node
	err = sqlite.InChunks(names, func(marks string, args []any) error {
		rows, err := s.db.Reader.QueryContext(ctx, `SELECT `+nodeColumns+nodesFrom+` WHERE n.name IN (`+marks+`)`, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			n, err := scanNode(rows)
			if err != nil {
				return err
			}
			nodes = append(nodes, n)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return nodes, nil
}

// AddNodes records many nodes in one transaction; if any name is taken,
// none is recorded.
func (s *Store) AddNodes(ctx context.Context, names []string, mode Mode, now time.Time) (err error) {
	defer s.db.Failing(&err, "add nodes")
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		stmt, err := tx.PrepareContext(ctx, `INSERT INTO nodes (name, mode, created_at) VALUES (?, ?, ?) ON CONFLICT (name) DO NOTHING`)
		if err != nil {
			return err
		}
		defer stmt.Close()
		for _, n := range names {
			res, err := stmt.ExecContext(ctx, n, string(mode), sqlite.FormatTime(now))
			if err != nil {
				return err
			}
			if k, _ := res.RowsAffected(); k == 0 {
				return fmt.Errorf("node %s %w", n, ErrNodeExists)
			}
			if err := takeOverlayIndex(ctx, tx, n); err != nil {
				return err
			}
		}
		return nil
	})
	return err
}

// JoinedNodes lists the nodes whose host has joined, by name.
func (s *Store) JoinedNodes(ctx context.Context) (_ []string, err error) {
	defer s.db.Failing(&err, "list joined nodes")
	names, err := sqlite.Strings(ctx, s.db.Reader, `SELECT name FROM nodes WHERE joined_at IS NOT NULL ORDER BY name`)
	if err != nil {
		return nil, err
	}
	return names, nil
}
