package health

import (
	"context"
	"database/sql"
	"encoding/json"
	"time"

	"mesh-controller/embedded/sqlite"
)

// ModuleState is one supervised module as its host last reported it.
type ModuleState struct {
	Node    string `json:"node"`
	Module  string `json:"module"`
	Version string `json:"version"`
	// Archive is the digest of the archive its host runs it from ("" from
	// a host that does not say).
	Archive    string    `json:"archive,omitempty"`
	State      string    `json:"state"`
	Serial     int64     `json:"serial"`
	Pid        int       `json:"pid,omitempty"`
	Since      time.Time `json:"since"`
	Restarts1h int       `json:"restarts_1h"`
	LastExit   string    `json:"last_exit,omitempty"`
	Detail     string    `json:"detail,omitempty"`
	LogTail    []string  `json:"log_tail,omitempty"`
	HeardAt    time.Time `json:"heard_at"`
	// ChangedAt is when the controller heard this state begin.
	ChangedAt time.Time `json:"changed_at"`
}

// RecordModuleStates replaces, per node given, the states of its modules
// with those reported, in one transaction: a module its host no longer
// reports is gone, and a state that did not change keeps its changed_at.
func (s *Store) RecordModuleStates(ctx context.Context, byNode map[string][]ModuleState) (err error) {
	defer s.db.Failing(&err, "record module states")
	if len(byNode) == 0 {
		return nil
	}
	return s.db.Write(ctx, func(tx *sql.Tx) error {
		for node, states := range byNode {
			keep := make([]any, 0, len(states)+1)
			keep = append(keep, node)
			marks := ""
			for _, m := range states {
				tail, _ := json.Marshal(m.LogTail)
				if m.LogTail == nil {
					tail = []byte("[]")
				}
				if _, err := tx.ExecContext(ctx, `INSERT INTO module_states
					(node, module, version, state, serial, pid, since, restarts_1h, last_exit, detail, log_tail, heard_at, changed_at, archive)
					VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
					ON CONFLICT (node, module) DO UPDATE SET version = excluded.version, archive = excluded.archive, state = excluded.state, serial = excluded.serial,
						pid = excluded.pid, since = excluded.since, restarts_1h = excluded.restarts_1h, last_exit = excluded.last_exit,
						detail = excluded.detail, log_tail = excluded.log_tail, heard_at = excluded.heard_at,
						changed_at = CASE WHEN module_states.state = excluded.state AND module_states.version = excluded.version
							THEN module_states.changed_at ELSE excluded.changed_at END`,
					node, m.Module, m.Version, m.State, m.Serial, m.Pid, sqlite.FormatTime(m.Since), m.Restarts1h, m.LastExit, m.Detail, string(tail),
					sqlite.FormatTime(m.HeardAt), sqlite.FormatTime(m.HeardAt), m.Archive); err != nil {
					return err
				}
				keep = append(keep, m.Module)
				if marks != "" {
					marks += ", "
				}
				marks += "?"
			}
			q := `DELETE FROM module_states WHERE node = ?`
			if marks != "" {
				q += ` AND module NOT IN (` + marks + `)`
			}
			if _, err := tx.ExecContext(ctx, q, keep...); err != nil {
				return err
			}
		}
		return nil
	})
}

// ModuleStates returns the modules' states of one node, or of every node
// when node is "", by node and module.
func (s *Store) ModuleStates(ctx context.Context, node string) (_ []ModuleState, err error) {
	defer s.db.Failing(&err, "read module states")
	q := `SELECT node, module, version, state, serial, pid, since, restarts_1h, last_exit, detail, log_tail, heard_at, changed_at, archive FROM module_states`
	var args []any
	if node != "" {
		q += ` WHERE node = ?`
		args = append(args, node)
	}
	rows, err := s.db.Reader.QueryContext(ctx, q+` ORDER BY node, module`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []ModuleState
	for rows.Next() {
		var m ModuleState
		var since, heard, changed, tail string
		if err := rows.Scan(&m.Node, &m.Module, &m.Version, &m.State, &m.Serial, &m.Pid, &since, &m.Restarts1h, &m.LastExit, &m.Detail, &tail, &heard, &changed, &m.Archive); err != nil {
			return nil, err
		}
		m.Since, _ = sqlite.ParseTime(since)
		m.HeardAt, _ = sqlite.ParseTime(heard)
		m.ChangedAt, _ = sqlite.ParseTime(changed)
		_ = json.Unmarshal([]byte(tail), &m.LogTail)
		out = append(out, m)
	}
	return out, rows.Err()
}

// ModuleStatesOn returns one module's states on the nodes named, by node.
func (s *Store) ModuleStatesOn(ctx context.Context, module string, nodes []string) (_ map[string]ModuleState, err error) {
	defer s.db.Failing(&err, "read the states of module %s", module)
	out := map[string]ModuleState{}
	err = sqlite.InChunks(nodes, func(marks string, args []any) error {
		rows, err := s.db.Reader.QueryContext(ctx, `SELECT node, version, state, pid, since, restarts_1h, last_exit, detail, changed_at
			FROM module_states WHERE module = ? AND node IN (`+marks+`)`, append([]any{module}, args...)...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			m := ModuleState{Module: module}
			var since, changed string
			if err := rows.Scan(&m.Node, &m.Version, &m.State, &m.Pid, &since, &m.Restarts1h, &m.LastExit, &m.Detail, &changed); err != nil {
				return err
			}
			m.Since, _ = sqlite.ParseTime(since)
			m.ChangedAt, _ = sqlite.ParseTime(changed)
			out[m.Node] = m
		}
		return rows.Err()
	})
	return out, err
}
