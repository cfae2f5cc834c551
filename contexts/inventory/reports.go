package inventory

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"mesh-controller/embedded/sqlite"
)

// Beat is one heartbeat, as absorbed.
type Beat struct {
	Node          string
	HeardAt       time.Time
	IntervalS     float64
	SerialApplied int64
	UptimeS       int64
	// Applying is the declaration its host said it was applying; nil
	// between applies.
	Applying *Applying
	// HostVersion is the version its host said it runs; "" from a host
	// that predates saying it (the version it joined with stands).
	HostVersion string
}

// Applying is a declaration a node's host is applying, as its beat says.
type Applying struct {
	Serial int64
	// Since is when the host began, on its own clock.
	Since time.Time
	// Phase is the part of the apply under way (verify, archives…).
	Phase string
}

// Fact is one thing a host reported about its machine, with its evidence.
type Fact struct {
	Name  string `json:"name"`
	Value string `json:"value"`
	Why   string `json:"why"`
}

// Found is something a host found running beside the mesh's modules.
type Found struct {
	Kind   string `json:"kind"`
	Name   string `json:"name"`
	Detail string `json:"detail"`
	// Addresses are where a listener listens, and Commands what holds it,
	// each sorted; the host's reports of one port at several addresses
	// (v4 and v6, say) are kept as one.
	Addresses []string `json:"addresses,omitempty"`
	Commands  []string `json:"commands,omitempty"`
}

// mergeFound keeps what a host found as one entry a kind and name, their
// addresses and commands together (sorted, each once), the first detail.
func mergeFound(found []Found) []Found {
	at := map[[2]string]int{}
	var out []Found
	for _, f := range found {
		k := [2]string{f.Kind, f.Name}
		i, ok := at[k]
		if !ok {
			at[k] = len(out)
			out = append(out, Found{Kind: f.Kind, Name: f.Name, Detail: f.Detail})
			i = len(out) - 1
		}
		out[i].Addresses = append(out[i].Addresses, f.Addresses...)
		out[i].Commands = append(out[i].Commands, f.Commands...)
	}
	for i := range out {
		out[i].Addresses = sortedOnce(out[i].Addresses)
		out[i].Commands = sortedOnce(out[i].Commands)
	}
	return out
}

// sortedOnce sorts xs and keeps each once, leaving out "".
func sortedOnce(xs []string) []string {
	slices.Sort(xs)
	xs = slices.Compact(xs)
	if len(xs) > 0 && xs[0] == "" {
		xs = xs[1:]
	}
	return xs
}

// Outcome is a host's report of applying a declaration.
type Outcome struct {
	Serial  int64
	OK      bool
	Error   string
	TotalMS float64
	At      time.Time
}

// DataSet is one data set as a host last reported it.
type DataSet struct {
	Module     string
	Name       string
	Path       string
	Bytes      int64
	Precious   string
	LastBackup *time.Time
	// ReportedAt is when its host last reported it.
	ReportedAt time.Time
}

// MarkJoined records that the node's host joined.
func (s *Store) MarkJoined(ctx context.Context, node string, now time.Time) (err error) {
	defer s.db.Failing(&err, "mark %s joined", node)
	return s.MarkJoinedMany(ctx, []string{node}, now)
}

// MarkJoinedMany records that the nodes' hosts joined, in one transaction.
func (s *Store) MarkJoinedMany(ctx context.Context, nodes []string, now time.Time) (err error) {
	joins := make([]Join, len(nodes))
	for i, n := range nodes {
		joins[i] = Join{Node: n}
	}
	return s.RecordJoins(ctx, joins, now)
}

// Join is a node whose host joined, and the version its host said it runs.
type Join struct {
	Node, HostVersion string
}

// RecordJoins records that the nodes' hosts joined, each with the version
// it runs ("" leaves the one recorded), in one transaction.
func (s *Store) RecordJoins(ctx context.Context, joins []Join, now time.Time) (err error) {
	defer s.db.Failing(&err, "mark nodes joined")
	at := sqlite.FormatTime(now)
	return s.db.Write(ctx, func(tx *sql.Tx) error {
		stmt, err := tx.PrepareContext(ctx, `UPDATE nodes SET joined_at = ?1, last_heard = ?1, host_version = coalesce(?3, host_version) WHERE name = ?2`)
		if err != nil {
			return err
		}
		defer stmt.Close()
		for _, j := range joins {
			var version any
			if j.HostVersion != "" {
				version = j.HostVersion
			}
			if _, err := stmt.ExecContext(ctx, at, j.Node, version); err != nil {
				return fmt.Errorf("mark %s joined: %w", j.Node, err)
			}
		}
		// A joined host's recipient is in the backup holder's lines.
		return bumpBackupHolders(ctx, tx)
	})
}

// RecordBeats writes many heartbeats in one transaction: each node's row is
// updated in place, so beats cost a few writes a second, not one each. A
// beat never moves the applied serial back: one sent before an apply may be
// written after the apply's report. What a beat says of an apply under
// way replaces what the last one said.
func (s *Store) RecordBeats(ctx context.Context, beats []Beat) (err error) {
	defer s.db.Failing(&err, "record heartbeats")
	if len(beats) == 0 {
		return nil
	}
	return s.db.Write(ctx, func(tx *sql.Tx) error {
		stmt, err := tx.PrepareContext(ctx, `UPDATE nodes SET last_heard = ?1, heartbeat_interval_s = ?2,
			serial_applied = CASE WHEN serial_applied > ?3 THEN serial_applied ELSE ?3 END, uptime_s = ?4,
			applying_serial = ?6, applying_since = ?7, applying_phase = ?8, host_version = coalesce(?9, host_version) WHERE name = ?5`)
		if err != nil {
			return err
		}
		defer stmt.Close()
		for _, b := range beats {
			var serial, since, phase any // NULL between applies
			if a := b.Applying; a != nil {
				serial, since, phase = a.Serial, sqlite.FormatTime(a.Since), a.Phase
			}
			var version any // NULL: a host that predates saying it keeps the one it joined with
			if b.HostVersion != "" {
				version = b.HostVersion
			}
			if _, err := stmt.ExecContext(ctx, sqlite.FormatTime(b.HeardAt), b.IntervalS, b.SerialApplied, b.UptimeS, b.Node, serial, since, phase, version); err != nil {
				return fmt.Errorf("record heartbeat of %s: %w", b.Node, err)
			}
		}
		return nil
	})
}

// RecordFacts replaces a node's facts and what it found. A WireGuard key
// (the fact wireguard_key) new or changed moves, in the same transaction,
// the plans of the node and of every node that knows a key (any of them
// may peer with it, or reach it through a relay), so that the catch-up
// declares them.
//
// A key another node holds is refused (refused names both): it is not
// recorded as this node's, the first holder keeps it, and the node has no
// key until its host reports one of its own; so one host cannot make
// other hosts' peers collide, whatever it reports. A node holds a key
// first if it held it before this report, or, of two that did (recorded
// before keys were judged so), if it was recorded first (the lower
// overlay index), as the overlay's computation keeps it.
func (s *Store) RecordFacts(ctx context.Context, node string, facts []Fact, found []Found, now time.Time) (refused *KeyRefusal, err error) {
	out, err := s.RecordFactsMany(ctx, []FactsReport{{Node: node, Facts: facts, Found: found, At: now}})
	if err != nil {
		return nil, err
	}
	return out[0].Refused, out[0].Err
}

// FactsReport is one host's facts report, as RecordFactsMany keeps it.
type FactsReport struct {
	Node  string
	Facts []Fact
	Found []Found
	At    time.Time
}

// FactsKept is what became of one FactsReport: the WireGuard key it
// refused, or why it could not be kept (its node removed meanwhile).
type FactsKept struct {
	Refused *KeyRefusal
	Err     error
}

// RecordFactsMany keeps many hosts' facts reports, each exactly as
// RecordFacts keeps one, in one transaction whose statements are prepared
// once: a rack that joins or comes back at once reports ten thousand times
// within seconds, and kept one transaction each the reports took the
// writer from the joins. Each stands or falls alone (a savepoint each);
// err is the transaction's. out[i] is reports[i]'s.
func (s *Store) RecordFactsMany(ctx context.Context, reports []FactsReport) (out []FactsKept, err error) {
	defer s.db.Failing(&err, "record the facts of %d nodes", len(reports))
	err = s.db.Write(ctx, func(wtx *sql.Tx) error {
		out = make([]FactsKept, len(reports))
		tx := sqlite.Prepared(wtx)
		defer tx.Close()
		for i, r := range reports {
			if _, err := tx.ExecContext(ctx, `SAVEPOINT facts`); err != nil {
				return err
			}
			refused, err := recordFacts(ctx, tx, r)
			if err != nil {
				if _, rerr := tx.ExecContext(ctx, `ROLLBACK TO facts`); rerr != nil {
					return rerr
				}
				out[i].Err = s.db.Failed(err, "record the facts of %s", r.Node)
			}
			out[i].Refused = refused
			if _, err := tx.ExecContext(ctx, `RELEASE facts`); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// recordFacts keeps one report within tx.
func recordFacts(ctx context.Context, tx sqlite.Runner, r FactsReport) (refused *KeyRefusal, err error) {
	node, facts, found, now := r.Node, r.Facts, r.Found, r.At
	var oldKey, newKey string
	err = tx.QueryRowContext(ctx, `SELECT value FROM node_facts WHERE node = ? AND name = ?`, node, factWireGuardKey).Scan(&oldKey)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, err
	}
	for _, f := range facts {
		if f.Name == factWireGuardKey {
			newKey = f.Value
		}
	}
	holder, err := keyHolder(ctx, tx, node, newKey, oldKey == newKey)
	if err != nil {
		return nil, err
	}
	if holder != "" {
		refused = &KeyRefusal{Node: node, Holder: holder, Key: newKey, Since: now}
		newKey = ""
	}
	if err := keepKeyRefusal(ctx, tx, node, refused); err != nil {
		return nil, err
	}
	if oldKey != newKey {
		if _, err := tx.ExecContext(ctx, `UPDATE nodes SET plan_version = plan_version + 1
			WHERE name = ?1 OR name IN (SELECT node FROM node_facts WHERE name = ?2)`, node, factWireGuardKey); err != nil {
			return nil, err
		}
	}
	for _, q := range []string{`DELETE FROM node_facts WHERE node = ?`, `DELETE FROM node_found WHERE node = ?`} {
		if _, err := tx.ExecContext(ctx, q, node); err != nil {
			return nil, err
		}
	}
	for _, f := range facts {
		if f.Name == factWireGuardKey && refused != nil {
			continue
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO node_facts (node, name, value, why) VALUES (?, ?, ?, ?) ON CONFLICT (node, name) DO UPDATE SET value = excluded.value, why = excluded.why`, node, f.Name, f.Value, f.Why); err != nil {
			return nil, err
		}
	}
	for _, f := range mergeFound(found) {
		if _, err := tx.ExecContext(ctx, `INSERT INTO node_found (node, kind, name, detail, addresses, commands) VALUES (?, ?, ?, ?, ?, ?)`,
			node, f.Kind, f.Name, f.Detail, strings.Join(f.Addresses, " "), strings.Join(f.Commands, " ")); err != nil {
			return nil, err
		}
	}
	_, err = tx.ExecContext(ctx, `UPDATE nodes SET facts_at = ?, last_heard = ? WHERE name = ?`, sqlite.FormatTime(now), sqlite.FormatTime(now), node)
	return refused, err
}

// KeyRefusal is a WireGuard key a node's host reported while another node,
// Holder, held it (overlay.key-conflict).
type KeyRefusal struct {
	Node, Holder, Key string
	// Since is when it was first refused.
	Since time.Time
}

// keyHolder is the node that holds key before node may ("" for none, or
// no key): another node holding it, if node did not hold it already
// (held), else one of them recorded before node.
func keyHolder(ctx context.Context, tx queryer, node, key string, held bool) (string, error) {
	if key == "" {
		return "", nil
	}
	var holder string
	err := each(ctx, tx, `SELECT f.node, coalesce(n.overlay_index, 0) < coalesce((SELECT overlay_index FROM nodes WHERE name = ?1), 0)
		FROM node_facts f JOIN nodes n ON n.name = f.node
		WHERE f.name = ?2 AND f.value = ?3 AND f.node <> ?1 ORDER BY n.overlay_index, f.node`, func(r *sql.Rows) error {
		var other string
		var earlier bool
		if err := r.Scan(&other, &earlier); err != nil {
			return err
		}
		if holder == "" && (!held || earlier) {
			holder = other
		}
		return nil
	}, node, factWireGuardKey, key)
	return holder, err
}

// keepKeyRefusal keeps a node's refused key (r), the time first refused
// kept while the same key is refused, or forgets it (r nil).
func keepKeyRefusal(ctx context.Context, tx sqlite.Runner, node string, r *KeyRefusal) error {
	if r == nil {
		_, err := tx.ExecContext(ctx, `DELETE FROM overlay_key_refusals WHERE node = ?`, node)
		return err
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO overlay_key_refusals (node, holder, key, since) VALUES (?1, ?2, ?3, ?4)
		ON CONFLICT (node) DO UPDATE SET holder = excluded.holder, key = excluded.key,
		since = CASE WHEN overlay_key_refusals.key = excluded.key THEN overlay_key_refusals.since ELSE excluded.since END`,
		node, r.Holder, r.Key, sqlite.FormatTime(r.Since))
	return err
}

// KeyRefusals returns every node's refused WireGuard key, by node.
func (s *Store) KeyRefusals(ctx context.Context) (_ []KeyRefusal, err error) {
	defer s.db.Failing(&err, "read refused WireGuard keys")
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT node, holder, key, since FROM overlay_key_refusals ORDER BY node`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []KeyRefusal
	for rows.Next() {
		var r KeyRefusal
		var since string
		if err := rows.Scan(&r.Node, &r.Holder, &r.Key, &since); err != nil {
			return nil, err
		}
		if r.Since, err = sqlite.ParseTime(since); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// Facts returns what a node reported about its machine, and what it found.
func (s *Store) Facts(ctx context.Context, node string) (_ []Fact, _ []Found, err error) {
	defer s.db.Failing(&err, "read the facts of %s", node)
	facts := []Fact{}
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT name, value, why FROM node_facts WHERE node = ? ORDER BY name`, node)
	if err != nil {
		return nil, nil, err
	}
	for rows.Next() {
		var f Fact
		if err := rows.Scan(&f.Name, &f.Value, &f.Why); err != nil {
			rows.Close()
			return nil, nil, err
		}
		facts = append(facts, f)
	}
	rows.Close()
	found := []Found{}
	rows, err = s.db.Reader.QueryContext(ctx, `SELECT kind, name, detail, addresses, commands FROM node_found WHERE node = ? ORDER BY kind, name`, node)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	for rows.Next() {
		f, err := scanFound(rows)
		if err != nil {
			return nil, nil, err
		}
		found = append(found, f)
	}
	return facts, found, rows.Err()
}

// scanFound reads one node_found row of kind, name, detail, addresses,
// commands, after the columns first points at, if any.
func scanFound(r *sql.Rows, first ...any) (Found, error) {
	var f Found
	var addresses, commands string
	err := r.Scan(append(first, &f.Kind, &f.Name, &f.Detail, &addresses, &commands)...)
	f.Addresses, f.Commands = words(addresses), words(commands)
	return f, err
}

// words are the space-separated words of s; none is nil.
func words(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Fields(s)
}

// ListenersOf returns the listeners (found of kind "port") of many nodes at
// once, by node, in a few queries rather than one a node.
func (s *Store) ListenersOf(ctx context.Context, nodes []string) (_ map[string][]Found, err error) {
	defer s.db.Failing(&err, "read listeners")
	out := map[string][]Found{}
	err = sqlite.InChunks(nodes, func(marks string, args []any) error {
		rows, err := s.db.Reader.QueryContext(ctx, `SELECT node, kind, name, detail, addresses, commands FROM node_found WHERE kind = 'port' AND node IN (`+marks+`) ORDER BY node, name`, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var node string
			f, err := scanFound(rows, &node)
			if err != nil {
				return err
			}
			out[node] = append(out[node], f)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// FactsOf returns the facts of many nodes at once, by node (a node with
// none has no entry), in a few queries rather than one a node.
func (s *Store) FactsOf(ctx context.Context, nodes []string) (_ map[string][]Fact, err error) {
	defer s.db.Failing(&err, "read facts")
	out := map[string][]Fact{}
	err = sqlite.InChunks(nodes, func(marks string, args []any) error {
		rows, err := s.db.Reader.QueryContext(ctx, `SELECT node, name, value, why FROM node_facts WHERE node IN (`+marks+`) ORDER BY node, name`, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var node string
			var f Fact
			if err := rows.Scan(&node, &f.Name, &f.Value, &f.Why); err != nil {
				return err
			}
			out[node] = append(out[node], f)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// RecordOutcome keeps a node's latest apply outcome; a successful apply also
// moves its applied serial.
func (s *Store) RecordOutcome(ctx context.Context, node string, o Outcome) (err error) {
	defer s.db.Failing(&err, "record the apply outcome of %s", node)
	if err := s.RecordOutcomes(ctx, []NodeOutcome{{Node: node, Outcome: o}}); err != nil {
		return err
	}
	return nil
}

// NodeOutcome is one node's apply outcome, as a host reported it.
type NodeOutcome struct {
	Node string
	Outcome
}

// RecordOutcomes keeps many nodes' apply outcomes in one transaction: ten
// thousand hosts reporting one roll-out are a few writes, not ten thousand.
func (s *Store) RecordOutcomes(ctx context.Context, outcomes []NodeOutcome) (err error) {
	defer s.db.Failing(&err, "record apply outcomes")
	return s.db.Write(ctx, func(tx *sql.Tx) error {
		stmt, err := tx.PrepareContext(ctx, `UPDATE nodes SET applied_serial = ?, applied_ok = ?, applied_error = ?, applied_ms = ?, applied_at = ?, last_heard = ?,
			serial_applied = CASE WHEN ? = 1 AND serial_applied < ? THEN ? ELSE serial_applied END WHERE name = ?`)
		if err != nil {
			return err
		}
		defer stmt.Close()
		for _, o := range outcomes {
			at := sqlite.FormatTime(o.At)
			if _, err := stmt.ExecContext(ctx, o.Serial, o.OK, o.Error, o.TotalMS, at, at, o.OK, o.Serial, o.Serial, o.Node); err != nil {
				return err
			}
		}
		return nil
	})
}

// RecordDataSets replaces a node's reported data sets.
func (s *Store) RecordDataSets(ctx context.Context, node string, sets []DataSet, now time.Time) (err error) {
	defer s.db.Failing(&err, "record the data sets of %s", node)
	return s.RecordDataReports(ctx, []DataReport{{Node: node, Sets: sets, At: now}})
}

// DataReport is the data sets one node's host reported, and when.
type DataReport struct {
	Node string
	Sets []DataSet
	At   time.Time
}

// RecordDataReports replaces the reported data sets of each node, in order,
// in one transaction: after a change to every node each host reports its
// data, and ten thousand transactions of one report each kept the writer
// busy for seconds.
func (s *Store) RecordDataReports(ctx context.Context, reports []DataReport) (err error) {
	defer s.db.Failing(&err, "record the data sets of %d nodes", len(reports))
	return s.db.Write(ctx, func(tx *sql.Tx) error {
		stmts := sqlite.Prepared(tx)
		defer stmts.Close()
		for _, r := range reports {
			at := sqlite.FormatTime(r.At)
			if _, err := stmts.ExecContext(ctx, `DELETE FROM node_data_sets WHERE node = ?`, r.Node); err != nil {
				return err
			}
			for _, d := range r.Sets {
				var backup sql.NullString
				if d.LastBackup != nil {
					backup = sql.NullString{String: sqlite.FormatTime(*d.LastBackup), Valid: true}
				}
				if _, err := stmts.ExecContext(ctx, `INSERT INTO node_data_sets (node, module, name, path, bytes, precious, last_backup, reported_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (node, module, name) DO UPDATE SET path = excluded.path, bytes = excluded.bytes, precious = excluded.precious, last_backup = excluded.last_backup, reported_at = excluded.reported_at`,
					r.Node, d.Module, d.Name, d.Path, d.Bytes, d.Precious, backup, at); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// DataSets returns a node's data sets as last reported.
func (s *Store) DataSets(ctx context.Context, node string) (_ []DataSet, err error) {
	defer s.db.Failing(&err, "read the data sets of %s", node)
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT module, name, path, bytes, precious, last_backup, reported_at FROM node_data_sets WHERE node = ? ORDER BY module, name`, node)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	sets := []DataSet{}
	for rows.Next() {
		var d DataSet
		var backup sql.NullString
		var reported string
		if err := rows.Scan(&d.Module, &d.Name, &d.Path, &d.Bytes, &d.Precious, &backup, &reported); err != nil {
			return nil, err
		}
		if d.ReportedAt, err = sqlite.ParseTime(reported); err != nil {
			return nil, err
		}
		if d.LastBackup, err = sqlite.ParseNullTime(backup); err != nil {
			return nil, err
		}
		sets = append(sets, d)
	}
	return sets, rows.Err()
}

// AllDataSets returns every node's data sets as last reported, in one query.
func (s *Store) AllDataSets(ctx context.Context) (_ map[string][]DataSet, err error) {
	defer s.db.Failing(&err, "read every node's data sets")
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT node, module, name, path, bytes, precious, last_backup, reported_at FROM node_data_sets ORDER BY node, module, name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string][]DataSet{}
	for rows.Next() {
		var node, reported string
		var d DataSet
		var backup sql.NullString
		if err := rows.Scan(&node, &d.Module, &d.Name, &d.Path, &d.Bytes, &d.Precious, &backup, &reported); err != nil {
			return nil, err
		}
		if d.LastBackup, err = sqlite.ParseNullTime(backup); err != nil {
			return nil, err
		}
		if d.ReportedAt, err = sqlite.ParseTime(reported); err != nil {
			return nil, err
		}
		out[node] = append(out[node], d)
	}
	return out, rows.Err()
}

// FactsAt is when a node's host last reported its facts; nil if never.
func (s *Store) FactsAt(ctx context.Context, node string) (_ *time.Time, err error) {
	defer s.db.Failing(&err, "read when %s reported its facts", node)
	var at sql.NullString
	err = s.db.Reader.QueryRowContext(ctx, `SELECT facts_at FROM nodes WHERE name = ?`, node).Scan(&at)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("node %s %w", node, ErrNodeNotFound)
	}
	if err != nil || !at.Valid {
		return nil, err
	}
	t, err := sqlite.ParseTime(at.String)
	return &t, err
}
