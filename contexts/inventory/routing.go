package inventory

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
)

// Routing is what a node routes: the domain its public ports' routed names
// are composed under ("" for none), and the networks it routes for what it
// hosts (canonical CIDR prefixes, in the mesh's order; none is empty). The application
// judges both before they are kept.
type Routing struct {
	PublicDomain string
	Networks     []string
}

// Routing returns one node's routing, or ErrNodeNotFound.
func (s *Store) Routing(ctx context.Context, node string) (_ Routing, err error) {
	defer s.db.Failing(&err, "read the routing of node %s", node)
	var r Routing
	var domain, networks sql.NullString
	err = s.db.Reader.QueryRowContext(ctx, `SELECT public_domain, networks FROM nodes WHERE name = ?`, node).Scan(&domain, &networks)
	if errors.Is(err, sql.ErrNoRows) {
		return Routing{}, fmt.Errorf("node %s %w", node, ErrNodeNotFound)
	}
	if err != nil {
		return Routing{}, err
	}
	if r, err = routingOf(domain, networks); err != nil {
		return Routing{}, err
	}
	return r, nil
}

func routingOf(domain, networks sql.NullString) (Routing, error) {
	r := Routing{PublicDomain: domain.String, Networks: []string{}}
	if networks.Valid {
		if err := json.Unmarshal([]byte(networks.String), &r.Networks); err != nil {
			return Routing{}, fmt.Errorf("stored networks: %w", err)
		}
	}
	return r, nil
}

// SetPublicDomain keeps a node's public domain ("" clears it) and, if it
// changed, moves the node's plan in the same transaction, so that the
// catch-up declares it even if the command stops before it does. changed
// says whether it did change.
func (s *Store) SetPublicDomain(ctx context.Context, node, domain string) (changed bool, err error) {
	defer s.db.Failing(&err, "set the public domain of %s", node)
	var value any
	if domain != "" {
		value = domain
	}
	return s.setRouting(ctx, node, "public_domain", value)
}

// SetNetworks keeps a node's networks (none clears them) as SetPublicDomain
// keeps its domain: in the order given (the application judges and sorts
// them), and the plan moved only on a change.
func (s *Store) SetNetworks(ctx context.Context, node string, networks []string) (changed bool, err error) {
	defer s.db.Failing(&err, "set the networks of %s", node)
	var value any
	if len(networks) > 0 {
		b, err := json.Marshal(networks)
		if err != nil {
			return false, err
		}
		value = string(b)
	}
	return s.setRouting(ctx, node, "networks", value)
}

// setRouting sets one routing column (a constant of this file, never a
// caller's word) when it differs, moving the node's plan.
func (s *Store) setRouting(ctx context.Context, node, column string, value any) (changed bool, err error) {
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		// An act: judged acts committing after it are judged again.
		if err := moveRevision(ctx, tx, 0); err != nil {
			return err
		}
		if err := mustExist(ctx, tx, node); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `UPDATE nodes SET `+column+` = ? WHERE name = ? AND `+column+` IS DISTINCT FROM ?`, value, node, value)
		if err != nil {
			return err
		}
		n, _ := res.RowsAffected()
		if changed = n > 0; !changed {
			return nil
		}
		return bump(ctx, tx, []string{node})
	})
	if err != nil {
		return false, err
	}
	return changed, err
}

// readRouting reads the routing of every node that has any, by name.
func readRouting(ctx context.Context, tx *sql.Tx) (map[string]Routing, error) {
	out := map[string]Routing{}
	err := each(ctx, tx, `SELECT name, public_domain, networks FROM nodes WHERE public_domain IS NOT NULL OR networks IS NOT NULL`, func(r *sql.Rows) error {
		var name string
		var domain, networks sql.NullString
		if err := r.Scan(&name, &domain, &networks); err != nil {
			return err
		}
		rt, err := routingOf(domain, networks)
		if err != nil {
			return fmt.Errorf("node %s: %w", name, err)
		}
		out[name] = rt
		return nil
	})
	return out, err
}

// mustExist returns ErrNodeNotFound unless the node is recorded.
func mustExist(ctx context.Context, tx *sql.Tx, node string) error {
	var exists int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM nodes WHERE name = ?`, node).Scan(&exists); err != nil {
		return err
	}
	if exists == 0 {
		return fmt.Errorf("node %s %w", node, ErrNodeNotFound)
	}
	return nil
}
