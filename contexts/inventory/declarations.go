package inventory

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"mesh-controller/embedded/sqlite"
)

// Declaration is a node's latest signed declaration as kept: the truth of
// what the node should run.
type Declaration struct {
	Node      string
	Serial    int64
	IssuedAt  time.Time
	Body      string // canonical JSON
	Signature string
	Key       string
	// PlanVersion is the node's plan version it was made from (0 for a hand-written one).
	PlanVersion int64
}

// CurrentPlan asks SaveDeclaration to record the node's plan version as it is.
const CurrentPlan = -1

// Signer makes the signed body of a declaration once its serial is known.
type Signer func(serial int64, issuedAt time.Time) (body, signature, key string, err error)

// SaveDeclaration numbers a node's next declaration (one above the last, so
// serials strictly increase), has sign make it, and keeps it, in one
// transaction. planVersion is the plan it was made from; CurrentPlan marks
// a hand-written one as standing for the node's plan as it is now, so it
// is not replaced until the plan changes.
func (s *Store) SaveDeclaration(ctx context.Context, node string, planVersion int64, sign Signer, now time.Time) (Declaration, error) {
	ds, err := s.SaveDeclarations(ctx, []DeclarationRequest{{Node: node, PlanVersion: planVersion, Sign: sign}}, now)
	if err != nil {
		return Declaration{}, err
	}
	return ds[0], nil
}

// DeclarationRequest asks for one node's next declaration.
type DeclarationRequest struct {
	Node        string
	PlanVersion int64
	Sign        Signer
}

// SaveDeclarations numbers, signs and keeps many nodes' next declarations in
// one transaction: a push to a thousand nodes is one write, not a thousand.
func (s *Store) SaveDeclarations(ctx context.Context, reqs []DeclarationRequest, now time.Time) ([]Declaration, error) {
	out := make([]Declaration, len(reqs))
	err := s.db.Write(ctx, func(tx *sql.Tx) error {
		for i, r := range reqs {
			d := Declaration{Node: r.Node, IssuedAt: now.UTC().Truncate(time.Second), PlanVersion: r.PlanVersion}
			var planVersion, last, applied sql.NullInt64
			err := tx.QueryRowContext(ctx, `SELECT n.plan_version, d.serial, n.serial_applied FROM nodes n LEFT JOIN declarations d ON d.node = n.name WHERE n.name = ?`, r.Node).
				Scan(&planVersion, &last, &applied)
			if errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("node %s %w", r.Node, ErrNodeNotFound)
			}
			if err != nil {
				return err
			}
			// Above what the host applied too: after a restore from a backup,
			// a host may have applied serials this store never saw, and it
			// refuses any serial not above its last.
			d.Serial = max(last.Int64, applied.Int64) + 1
			if r.PlanVersion == CurrentPlan {
				d.PlanVersion = planVersion.Int64
			}
			if d.Body, d.Signature, d.Key, err = r.Sign(d.Serial, d.IssuedAt); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `INSERT OR REPLACE INTO declarations (node, serial, issued_at, body, signature, key, plan_version) VALUES (?, ?, ?, ?, ?, ?, ?)`,
				d.Node, d.Serial, sqlite.FormatTime(d.IssuedAt), d.Body, d.Signature, d.Key, d.PlanVersion); err != nil {
				return err
			}
			out[i] = d
		}
		return nil
	})
	if errors.Is(err, ErrNodeNotFound) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("save declarations: %w", err)
	}
	return out, nil
}

// LatestDeclaration returns a node's latest declaration, or nil if it has none.
func (s *Store) LatestDeclaration(ctx context.Context, node string) (*Declaration, error) {
	var d Declaration
	var issued string
	err := s.db.Reader.QueryRowContext(ctx, `SELECT node, serial, issued_at, body, signature, key, plan_version FROM declarations WHERE node = ?`, node).
		Scan(&d.Node, &d.Serial, &issued, &d.Body, &d.Signature, &d.Key, &d.PlanVersion)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read declaration of %s: %w", node, err)
	}
	if d.IssuedAt, err = sqlite.ParseTime(issued); err != nil {
		return nil, err
	}
	return &d, nil
}

// Behind lists the nodes whose applied serial is below their latest declaration.
func (s *Store) Behind(ctx context.Context) ([]string, error) {
	return sqlite.Strings(ctx, s.db.Reader, `SELECT n.name FROM nodes n JOIN declarations d ON d.node = n.name WHERE n.serial_applied < d.serial ORDER BY n.name`)
}

// DeclaredAt returns when each node's latest declaration was issued, in one query.
func (s *Store) DeclaredAt(ctx context.Context) (map[string]time.Time, error) {
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT node, issued_at FROM declarations`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]time.Time{}
	for rows.Next() {
		var node, at string
		if err := rows.Scan(&node, &at); err != nil {
			return nil, err
		}
		t, err := sqlite.ParseTime(at)
		if err != nil {
			return nil, err
		}
		out[node] = t
	}
	return out, rows.Err()
}
