package identity

import (
	"context"
	"database/sql"
	"time"

	"mesh-controller/embedded/sqlite"
)

// ErrNoBrokerKeys means the store has no broker keys: it has not been migrated.
var ErrNoBrokerKeys = sqlite.Refusal("no broker keys")

// BrokerSeeds are the broker's nkey seeds by role: operator, account, system.
type BrokerSeeds struct {
	Operator, Account, System []byte
}

// EnsureBrokerKeys stores the broker's seeds made by makeSeeds unless the
// store has them already; made says whether this call stored them.
func (s *Store) EnsureBrokerKeys(ctx context.Context, makeSeeds func() (BrokerSeeds, error), now time.Time) (made bool, err error) {
	defer s.db.Failing(&err, "make broker keys")
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM broker_keys`).Scan(&n); err != nil {
			return err
		}
		if n == 3 {
			return nil
		}
		seeds, err := makeSeeds()
		if err != nil {
			return err
		}
		for role, seed := range map[string][]byte{"operator": seeds.Operator, "account": seeds.Account, "system": seeds.System} {
			if _, err := tx.ExecContext(ctx, `INSERT INTO broker_keys (role, seed, created_at) VALUES (?, ?, ?) ON CONFLICT (role) DO UPDATE SET seed = excluded.seed, created_at = excluded.created_at`,
				role, seed, sqlite.FormatTime(now)); err != nil {
				return err
			}
		}
		made = true
		return nil
	})
	if err != nil {
		return false, err
	}
	return made, nil
}

// BrokerSeeds returns the broker's seeds, or ErrNoBrokerKeys.
func (s *Store) BrokerSeeds(ctx context.Context) (_ BrokerSeeds, err error) {
	defer s.db.Failing(&err, "read broker keys")
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT role, seed FROM broker_keys`)
	if err != nil {
		return BrokerSeeds{}, err
	}
	defer rows.Close()
	var seeds BrokerSeeds
	for rows.Next() {
		var role string
		var seed []byte
		if err := rows.Scan(&role, &seed); err != nil {
			return BrokerSeeds{}, err
		}
		switch role {
		case "operator":
			seeds.Operator = seed
		case "account":
			seeds.Account = seed
		case "system":
			seeds.System = seed
		}
	}
	if err := rows.Err(); err != nil {
		return BrokerSeeds{}, err
	}
	if seeds.Operator == nil || seeds.Account == nil || seeds.System == nil {
		return BrokerSeeds{}, ErrNoBrokerKeys
	}
	return seeds, nil
}
