package inventory

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"mesh-controller/embedded/sqlite"
)

// NodeState is what plans need of a node.
type NodeState struct {
	Name                string
	Mode                Mode
	Joined              bool
	PlanVersion         int64
	DeclaredPlanVersion int64
	SerialDeclared      int64
	SerialApplied       int64
	LastHeard           *time.Time
	HeartbeatIntervalS  float64
	// Pending counts its assignments with a recorded version not yet sent.
	Pending int
	// HostVersion is what its host says it runs; HostRelease the host
	// release declared to it ("" for none).
	HostVersion, HostRelease string
}

// Undelivered says the node's host does not run its plan yet: its
// declaration is older than its plan, or its host has not applied it.
func (n NodeState) Undelivered() bool {
	return n.PlanVersion > n.DeclaredPlanVersion || n.SerialApplied < n.SerialDeclared
}

// Behind says the node's plan is undelivered, or a version recorded for it
// waits to be sent (as Node.Behind).
func (n NodeState) Behind() bool {
	return n.Undelivered() || n.Pending > 0
}

// Snapshot is everything plans are computed from, read in one transaction
// so that every plan sees the same mesh.
type Snapshot struct {
	// Revision is the act revision it was read at (read first: what
	// follows is at least as new). An act judged on it commits only while
	// it is still the store's (Change.Based).
	Revision  int64
	Nodes     map[string]NodeState
	NodeNames []string
	Manifests map[string]map[string]Manifest // module -> version -> manifest
	// Archives are the built versions' archives, by module@version.
	Archives    map[string]Archive
	Current     map[string]string // module -> current version
	Assignments []Assignment      // by node, then module
	// Settings are the layers: module -> node ("" for the mesh layer) -> body.
	Settings map[string]map[string]json.RawMessage
	// Seats are the seat holders, bindings, pins, consumers and cleanups.
	Seats SeatState
	// Routing is what each node routes, of the nodes that route anything.
	Routing map[string]Routing
	// Filters are the packet filters the mesh owns, by node (converge
	// --filter); read with the nodes.
	Filters map[string]Filter
	// Overlay is what the overlay is computed from; read with the nodes.
	Overlay Overlay
	// HostReleases are the host releases kept, by version.
	HostReleases map[string]HostRelease
	// WithoutSnapshot is, per node/module, the version a roll-out allows
	// to be prepared there without a snapshot (RollOut.WithoutSnapshot):
	// the planner marks the declared module so while it is at it.
	WithoutSnapshot map[Holder]string

	versions map[Holder]string
	// onNode indexes Assignments by node (AssignmentsOf), made from the
	// slice indexed: a slice put in its place is indexed again.
	onNode  map[string][]int
	indexed []Assignment
}

// VersionOn is the version of a module assigned on a node, "" if none.
func (s *Snapshot) VersionOn(node, module string) string {
	if s.versions == nil {
		s.versions = make(map[Holder]string, len(s.Assignments))
		for _, a := range s.Assignments {
			s.versions[Holder{Node: a.Node, Module: a.Module}] = a.Version
		}
	}
	return s.versions[Holder{Node: node, Module: module}]
}

// nodeStateQuery reads NodeStates (scanNodeState) of the nodes a WHERE
// clause appended to it selects, by name.
const nodeStateQuery = `SELECT n.name, n.mode, n.joined_at IS NOT NULL, n.plan_version, coalesce(d.plan_version, 0), coalesce(d.serial, 0), n.serial_applied,
	n.last_heard, coalesce(n.heartbeat_interval_s, 0), coalesce(n.host_version, ''), coalesce(n.host_release, '')
	FROM nodes n LEFT JOIN declarations d INDEXED BY declarations_versions ON d.node = n.name`

func scanNodeState(r *sql.Rows) (NodeState, error) {
	var n NodeState
	var mode string
	var heard sql.NullString
	if err := r.Scan(&n.Name, &mode, &n.Joined, &n.PlanVersion, &n.DeclaredPlanVersion, &n.SerialDeclared, &n.SerialApplied, &heard, &n.HeartbeatIntervalS, &n.HostVersion, &n.HostRelease); err != nil {
		return NodeState{}, err
	}
	var err error
	if n.LastHeard, err = sqlite.ParseNullTime(heard); err != nil {
		return NodeState{}, err
	}
	n.Mode = Mode(mode)
	return n, nil
}

// Snapshot reads the mesh for planning.
func (s *Store) Snapshot(ctx context.Context) (_ *Snapshot, err error) {
	defer s.db.Failing(&err, "read the snapshot")
	return s.snapshot(ctx, true)
}

// SnapshotWithoutNodes reads the mesh as Snapshot does but for the nodes
// (Nodes and NodeNames are empty): for status, which reads only the nodes
// it must judge (NodesToJudge), not every node of a large mesh.
func (s *Store) SnapshotWithoutNodes(ctx context.Context) (_ *Snapshot, err error) {
	defer s.db.Failing(&err, "read the snapshot")
	return s.snapshot(ctx, false)
}

func (s *Store) snapshot(ctx context.Context, withNodes bool) (*Snapshot, error) {
	tx, err := s.db.Reader.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	snap := &Snapshot{Nodes: map[string]NodeState{}, Manifests: map[string]map[string]Manifest{},
		Current: map[string]string{}, Settings: map[string]map[string]json.RawMessage{}}
	if err := tx.QueryRowContext(ctx, `SELECT rev FROM act_revision WHERE id = 1`).Scan(&snap.Revision); err != nil {
		return nil, fmt.Errorf("read the act revision: %w", err)
	}
	if withNodes {
		err = each(ctx, tx, nodeStateQuery+` ORDER BY n.name`, func(r *sql.Rows) error {
			n, err := scanNodeState(r)
			if err != nil {
				return err
			}
			snap.Nodes[n.Name] = n
			snap.NodeNames = append(snap.NodeNames, n.Name)
			return nil
		})
		if err != nil {
			return nil, err
		}
		if snap.Filters, err = nodeFilters(ctx, tx); err != nil {
			return nil, err
		}
		if snap.Overlay, err = readOverlay(ctx, tx); err != nil {
			return nil, fmt.Errorf("read the overlay: %w", err)
		}
	}
	err = each(ctx, tx, `SELECT module, version, manifest, archive_digest, archive_bytes, archive_unpacked_bytes FROM module_versions`, func(r *sql.Rows) error {
		var module, version, body string
		var a Archive
		if err := r.Scan(&module, &version, &body, &a.Digest, &a.Bytes, &a.UnpackedBytes); err != nil {
			return err
		}
		if a.Digest != "" {
			if snap.Archives == nil {
				snap.Archives = map[string]Archive{}
			}
			snap.Archives[module+"@"+version] = a
		}
		var m Manifest
		if err := json.Unmarshal([]byte(body), &m); err != nil {
			return fmt.Errorf("module %s %s: stored manifest: %w", module, version, err)
		}
		if snap.Manifests[module] == nil {
			snap.Manifests[module] = map[string]Manifest{}
		}
		snap.Manifests[module][version] = m
		return nil
	})
	if err != nil {
		return nil, err
	}
	releases, err := hostReleases(ctx, tx)
	if err != nil {
		return nil, err
	}
	snap.HostReleases = make(map[string]HostRelease, len(releases))
	for _, r := range releases {
		snap.HostReleases[r.Version] = r
	}
	err = each(ctx, tx, `SELECT name, current_version FROM modules`, func(r *sql.Rows) error {
		var name, v string
		if err := r.Scan(&name, &v); err != nil {
			return err
		}
		snap.Current[name] = v
		return nil
	})
	if err != nil {
		return nil, err
	}
	// Sized at once: a mesh of ten thousand nodes has as many assignments
	// or more, and growing the slice row by row copied them over and over.
	var count int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM assignments`).Scan(&count); err != nil {
		return nil, err
	}
	if count > 0 {
		snap.Assignments = make([]Assignment, 0, count)
	}
	err = each(ctx, tx, `SELECT node, module, version, assigned_at, unverified, coalesce(pending_version, ''), coalesce(taken, '') FROM assignments ORDER BY node, module`, func(r *sql.Rows) error {
		var a Assignment
		var at, unverified, taken string
		if err := r.Scan(&a.Node, &a.Module, &a.Version, &at, &unverified, &a.Pending, &taken); err != nil {
			return err
		}
		if taken != "" {
			a.Taken = &Take{}
			if err := json.Unmarshal([]byte(taken), a.Taken); err != nil {
				return fmt.Errorf("take of %s on %s: %w", a.Module, a.Node, err)
			}
		}
		if a.Pending != "" && withNodes {
			n := snap.Nodes[a.Node]
			n.Pending++
			snap.Nodes[a.Node] = n
		}
		var err error
		if a.AssignedAt, err = sqlite.ParseTime(at); err != nil {
			return err
		}
		if unverified == "[]" {
			a.Unverified = []string{} // as decoded, without the decoder: most are
		} else if err := json.Unmarshal([]byte(unverified), &a.Unverified); err != nil {
			return err
		}
		snap.Assignments = append(snap.Assignments, a)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if snap.Seats, err = readSeatState(ctx, tx); err != nil {
		return nil, err
	}
	if snap.Routing, err = readRouting(ctx, tx); err != nil {
		return nil, err
	}
	if snap.WithoutSnapshot, err = withoutSnapshot(ctx, tx); err != nil {
		return nil, fmt.Errorf("read the roll-outs without a snapshot: %w", err)
	}
	err = each(ctx, tx, `SELECT module, node, body FROM settings_layers`, func(r *sql.Rows) error {
		var module, node, body string
		if err := r.Scan(&module, &node, &body); err != nil {
			return err
		}
		if snap.Settings[module] == nil {
			snap.Settings[module] = map[string]json.RawMessage{}
		}
		snap.Settings[module][node] = json.RawMessage(body)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return snap, nil
}

// queryer runs a transaction's queries: a *sql.Tx, or one whose statements
// are prepared once for a batch (sqlite.Statements).
type queryer interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}

// each runs fn on every row a query gives.
func each(ctx context.Context, tx queryer, query string, fn func(*sql.Rows) error, args ...any) error {
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := fn(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// AssignmentsOf returns the snapshot's assignments on one node. An act on
// every node asks it of each: the assignments are indexed by node once,
// not scanned whole each time.
func (s *Snapshot) AssignmentsOf(node string) []Assignment {
	if s.onNode == nil || !sameSlice(s.indexed, s.Assignments) {
		s.onNode = make(map[string][]int, len(s.Nodes))
		for i, a := range s.Assignments {
			s.onNode[a.Node] = append(s.onNode[a.Node], i)
		}
		s.indexed = s.Assignments
	}
	var out []Assignment
	for _, i := range s.onNode[node] {
		out = append(out, s.Assignments[i])
	}
	return out
}

// sameSlice says whether a and b are one slice: the same elements, as many.
func sameSlice(a, b []Assignment) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// NodesRunning returns the nodes a module is assigned to, by name.
func (s *Snapshot) NodesRunning(module string) []string {
	var out []string
	for _, a := range s.Assignments {
		if a.Module == module {
			out = append(out, a.Node)
		}
	}
	return out
}

// Watch are the bounds NodesToJudge looks for nodes past.
type Watch struct {
	// Now is when the ages are measured to.
	Now time.Time
	// HeartbeatFactor times a node's heartbeat interval (DefaultInterval
	// when it has said none) is its silence bound.
	HeartbeatFactor float64
	DefaultInterval time.Duration
	// DataReport is how old a node's data report may grow.
	DataReport time.Duration
}

// NodesToJudge returns, by name, the nodes status must look at: the joined
// nodes not heard within their silence bound, or with a data set reported
// longer ago than w.DataReport, each less a second, and the nodes whose
// plan is undelivered (NodeState.Undelivered) or a version is recorded for
// them and not sent (NodeState.Behind). It is a superset of what
// is past a bound (the caller judges each node exactly, as it would have
// judged every node) that a well mesh keeps empty, however large.
func (s *Store) NodesToJudge(ctx context.Context, w Watch) (_ []NodeState, err error) {
	defer s.db.Failing(&err, "read the nodes to judge")
	tx, err := s.db.Reader.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	now := sqlite.FormatTime(w.Now)
	var out []NodeState
	err = each(ctx, tx, nodeStateQuery+`
		WHERE n.plan_version > coalesce(d.plan_version, 0) OR n.serial_applied < coalesce(d.serial, 0)
		OR EXISTS (SELECT 1 FROM assignments a WHERE a.node = n.name AND a.pending_version IS NOT NULL)
		OR n.joined_at IS NOT NULL AND (n.last_heard IS NULL
			OR `+s.db.Seconds("?1", "n.last_heard")+` > ?2 * CASE WHEN n.heartbeat_interval_s > 0 THEN n.heartbeat_interval_s ELSE ?3 END - 1
			OR EXISTS (SELECT 1 FROM node_data_sets s WHERE s.node = n.name AND `+s.db.Seconds("?1", "s.reported_at")+` > ?4 - 1))
		ORDER BY n.name`, func(r *sql.Rows) error {
		n, err := scanNodeState(r)
		if err != nil {
			return err
		}
		out = append(out, n)
		return nil
	}, now, w.HeartbeatFactor, w.DefaultInterval.Seconds(), w.DataReport.Seconds())
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return out, nil // a well mesh: nothing more to read
	}
	// Their recorded versions, counted in one read.
	pending := map[string]int{}
	err = each(ctx, tx, `SELECT node, count(*) FROM assignments WHERE pending_version IS NOT NULL GROUP BY node`, func(r *sql.Rows) error {
		var node string
		var n int
		if err := r.Scan(&node, &n); err != nil {
			return err
		}
		pending[node] = n
		return nil
	})
	for i := range out {
		out[i].Pending = pending[out[i].Name]
	}
	return out, err
}
