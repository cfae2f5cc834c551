package inventory

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"sync"
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
	// Declared says the request asked only for a node still behind
	// (DeclarationRequest.IfBehind) and another act had already declared
	// this plan: nothing was made, and Serial is that act's.
	Declared bool
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
func (s *Store) SaveDeclaration(ctx context.Context, node string, planVersion int64, sign Signer, now time.Time) (_ Declaration, err error) {
	defer s.db.Failing(&err, "save the declaration of %s", node)
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
	// IfBehind makes nothing when the node's latest declaration already
	// carries this plan version or a later one (and its host is not ahead of
	// it): the catch-up reads the plan an act has just moved, and must not
	// declare to every node a second time what the act is declaring.
	IfBehind bool
}

// SaveDeclarations numbers, signs and keeps many nodes' next declarations in
// one transaction: a push to a thousand nodes is one write, not a thousand.
func (s *Store) SaveDeclarations(ctx context.Context, reqs []DeclarationRequest, now time.Time) (_ []Declaration, err error) {
	defer s.db.Failing(&err, "save declarations")
	ds, _, err := s.SaveDeclarationsTimed(ctx, reqs, now)
	return ds, err
}

// SaveTimes is how long the parts of SaveDeclarations took: signing (in
// parallel across the cores) and the rest of the transaction (reading the
// serials, writing the rows, committing).
type SaveTimes struct {
	Sign, Store time.Duration
}

// SaveDeclarationsTimed is SaveDeclarations, saying how long signing and
// storing took. In its one transaction it reads every node's serials in a
// few queries, has the signers sign in parallel (each declaration's serial
// is known before any is signed), then writes them with one prepared
// statement.
func (s *Store) SaveDeclarationsTimed(ctx context.Context, reqs []DeclarationRequest, now time.Time) (_ []Declaration, _ SaveTimes, err error) {
	defer s.db.Failing(&err, "save declarations")
	out := make([]Declaration, len(reqs))
	var times SaveTimes
	start := time.Now()
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		names := make([]string, len(reqs))
		for i, r := range reqs {
			names[i] = r.Node
		}
		type serials struct{ planVersion, last, applied, declaredPlan int64 }
		known := make(map[string]serials, len(reqs))
		err := sqlite.InChunks(names, func(marks string, args []any) error {
			rows, err := tx.QueryContext(ctx, `SELECT n.name, n.plan_version, coalesce(d.serial, 0), n.serial_applied, coalesce(d.plan_version, 0) FROM nodes n
				LEFT JOIN declarations d ON d.node = n.name WHERE n.name IN (`+marks+`)`, args...)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var name string
				var sv serials
				if err := rows.Scan(&name, &sv.planVersion, &sv.last, &sv.applied, &sv.declaredPlan); err != nil {
					return err
				}
				known[name] = sv
			}
			return rows.Err()
		})
		if err != nil {
			return err
		}
		issued := now.UTC().Truncate(time.Second)
		// made are the requests that make a declaration, in order.
		made := make([]int, 0, len(reqs))
		for i, r := range reqs {
			sv, ok := known[r.Node]
			if !ok {
				return fmt.Errorf("node %s %w", r.Node, ErrNodeNotFound)
			}
			if r.IfBehind && r.PlanVersion != CurrentPlan && sv.declaredPlan >= r.PlanVersion && sv.last >= sv.applied {
				out[i] = Declaration{Node: r.Node, Serial: sv.last, PlanVersion: sv.declaredPlan, Declared: true}
				continue
			}
			made = append(made, i)
			d := Declaration{Node: r.Node, IssuedAt: issued, PlanVersion: r.PlanVersion}
			// Above what the host applied too: after a restore from a backup,
			// a host may have applied serials this store never saw, and it
			// refuses any serial not above its last.
			d.Serial = max(sv.last, sv.applied) + 1
			if r.PlanVersion == CurrentPlan {
				d.PlanVersion = sv.planVersion
			}
			out[i] = d
		}
		signStart := time.Now()
		if err := signAll(reqs, out, made); err != nil {
			return err
		}
		times.Sign = time.Since(signStart)
		stmt, err := tx.PrepareContext(ctx, `INSERT INTO declarations (node, serial, issued_at, body, signature, key, plan_version) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (node) DO UPDATE SET serial = excluded.serial, issued_at = excluded.issued_at, body = excluded.body, signature = excluded.signature, key = excluded.key, plan_version = excluded.plan_version`)
		if err != nil {
			return err
		}
		defer stmt.Close()
		at := sqlite.FormatTime(issued)
		for _, i := range made {
			d := out[i]
			if _, err := stmt.ExecContext(ctx, d.Node, d.Serial, at, d.Body, d.Signature, d.Key, d.PlanVersion); err != nil {
				return err
			}
		}
		return nil
	})
	times.Store = time.Since(start) - times.Sign
	if err != nil {
		return nil, times, err
	}
	return out, times, nil
}

// signAll has each request's signer make its declaration's body and
// signature, on as many goroutines as there are cores: ed25519 signing is
// the costly part of declaring to thousands of nodes at once.
func signAll(reqs []DeclarationRequest, out []Declaration, made []int) error {
	workers := min(runtime.GOMAXPROCS(0), max(len(made)/64, 1))
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := w; k < len(made); k += workers {
				i := made[k]
				d := &out[i]
				var err error
				if d.Body, d.Signature, d.Key, err = reqs[i].Sign(d.Serial, d.IssuedAt); err != nil {
					errs[w] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// LatestDeclaration returns a node's latest declaration, or nil if it has none.
func (s *Store) LatestDeclaration(ctx context.Context, node string) (_ *Declaration, err error) {
	defer s.db.Failing(&err, "read the declaration of %s", node)
	var d Declaration
	var issued string
	err = s.db.Reader.QueryRowContext(ctx, `SELECT node, serial, issued_at, body, signature, key, plan_version FROM declarations WHERE node = ?`, node).
		Scan(&d.Node, &d.Serial, &issued, &d.Body, &d.Signature, &d.Key, &d.PlanVersion)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if d.IssuedAt, err = sqlite.ParseTime(issued); err != nil {
		return nil, err
	}
	return &d, nil
}

// Behind lists the nodes whose applied serial is below their latest declaration.
func (s *Store) Behind(ctx context.Context) (_ []string, err error) {
	defer s.db.Failing(&err, "read the nodes behind their plans")
	return sqlite.Strings(ctx, s.db.Reader, `SELECT n.name FROM nodes n JOIN declarations d ON d.node = n.name WHERE n.serial_applied < d.serial ORDER BY n.name`)
}

// AnyAhead says whether any node's plan moved past its latest declaration,
// or its host applied a serial above it (a store restored from a backup):
// what the catch-up declares. One query, however many nodes.
func (s *Store) AnyAhead(ctx context.Context) (_ bool, err error) {
	defer s.db.Failing(&err, "read whether any node is ahead of its declaration")
	var any bool
	err = s.db.Reader.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM nodes n LEFT JOIN declarations d ON d.node = n.name
		WHERE n.plan_version > coalesce(d.plan_version, 0) OR n.serial_applied > coalesce(d.serial, 0))`).Scan(&any)
	if err != nil {
		return false, err
	}
	return any, nil
}

// DeclaredAt returns when each node's latest declaration was issued, in one query.
func (s *Store) DeclaredAt(ctx context.Context) (_ map[string]time.Time, err error) {
	defer s.db.Failing(&err, "read when each node was declared")
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

// SignAgain signs every node's latest declaration not signed by key (the
// current key's id) again with sign, its body and serial unchanged, and
// returns how many: after a rotation of the controller's key a host that
// asks for its latest gets it signed by the key that signs from then on.
// A declaration replaced meanwhile is left as its replacement made it.
func (s *Store) SignAgain(ctx context.Context, key string, sign func(body string) (signature string)) (_ int, err error) {
	defer s.db.Failing(&err, "sign the latest declarations again")
	type kept struct {
		node      string
		serial    int64
		body, sig string
	}
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT node, serial, body FROM declarations WHERE key != ? ORDER BY node`, key)
	if err != nil {
		return 0, err
	}
	var ds []kept
	for rows.Next() {
		var d kept
		if err := rows.Scan(&d.node, &d.serial, &d.body); err != nil {
			rows.Close()
			return 0, err
		}
		ds = append(ds, d)
	}
	rows.Close()
	if err := rows.Err(); err != nil || len(ds) == 0 {
		return 0, err
	}
	// Signed outside the transaction: ten thousand take a quarter second.
	for i := range ds {
		ds[i].sig = sign(ds[i].body)
	}
	n := 0
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		n = 0
		stmt, err := tx.PrepareContext(ctx, `UPDATE declarations SET signature = ?, key = ? WHERE node = ? AND serial = ? AND key != ?`)
		if err != nil {
			return err
		}
		defer stmt.Close()
		for _, d := range ds {
			res, err := stmt.ExecContext(ctx, d.sig, key, d.node, d.serial, key)
			if err != nil {
				return err
			}
			k, _ := res.RowsAffected()
			n += int(k)
		}
		return nil
	})
	return n, err
}
