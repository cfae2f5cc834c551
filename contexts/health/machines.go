package health

import (
	"context"
	"database/sql"
	"time"

	"mesh-controller/embedded/sqlite"
)

// Forgotten is what the health store let go of for machines taken out of
// the mesh.
type Forgotten struct {
	// Cleared are the open conditions that were about them, now cleared.
	Cleared []Condition
	// Drops counts the dropped-message counters of theirs that went.
	Drops int
}

// ForgetMachines clears every open condition about the machines (each
// clearing kept in the history, its summary saying why), drops their
// dropped-message counters, and keeps the hand acts given, in one
// transaction: a removed node leaves nothing open behind it, and the act
// that removed it is recorded with it or not at all.
func (s *Store) ForgetMachines(ctx context.Context, machines []string, why string, acts []HandAct, now time.Time) (_ Forgotten, err error) {
	defer s.db.Failing(&err, "forget machines")
	if err := needWhy(acts); err != nil {
		return Forgotten{}, err
	}
	gone := make(map[string]bool, len(machines))
	for _, m := range machines {
		gone[m] = true
	}
	var f Forgotten
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		f = Forgotten{}
		// Open conditions are few; reading them once beats a query per
		// machine when a load test's thousands of nodes go at once.
		open, err := conditions(ctx, tx, "")
		if err != nil {
			return err
		}
		at, written := sqlite.FormatTime(now), map[string]bool{}
		for _, c := range open {
			if !gone[c.Machine] {
				continue
			}
			if _, err := tx.ExecContext(ctx, `DELETE FROM conditions WHERE key = ?`, c.Key); err != nil {
				return err
			}
			if err := addHistory(ctx, tx, c, "cleared", c.Summary+" (cleared: "+why+")", at, written); err != nil {
				return err
			}
			f.Cleared = append(f.Cleared, c)
		}
		err = sqlite.InChunks(machines, func(marks string, args []any) error {
			res, err := tx.ExecContext(ctx, `DELETE FROM dropped_messages WHERE node IN (`+marks+`)`, args...)
			if err != nil {
				return err
			}
			k, err := res.RowsAffected()
			f.Drops += int(k)
			if err != nil {
				return err
			}
			_, err = tx.ExecContext(ctx, `DELETE FROM module_states WHERE node IN (`+marks+`)`, args...)
			return err
		})
		if err != nil {
			return err
		}
		if err := capHistory(ctx, tx, written); err != nil {
			return err
		}
		_, err = insertHandActs(ctx, tx, acts)
		return err
	})
	if err != nil {
		return Forgotten{}, err
	}
	return f, nil
}
