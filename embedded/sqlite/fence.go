package sqlite

import (
	"context"
	"database/sql"
	"fmt"
)

// ErrLeaseLost means a newer controller took the lease over: a write made
// under an older generation is refused by the store (identity.ErrLeaseLost
// is this same error).
var ErrLeaseLost = Refusal("the lease was taken over")

// fenceKey carries a write's lease generation in its context.
type fenceKey struct{}

// WithFence marks every write made with ctx as the serving controller's
// under lease generation g: Write checks, in the write's own transaction,
// that the store's fence (table fence, one row) is not above g. A store
// written through a fenced ctx must have that table. Writes without it (a
// person's commands, migrations) are not fenced.
func WithFence(ctx context.Context, g int64) context.Context {
	return context.WithValue(ctx, fenceKey{}, g)
}

// FenceOf is the lease generation ctx carries, if any.
func FenceOf(ctx context.Context) (int64, bool) {
	g, ok := ctx.Value(fenceKey{}).(int64)
	return g, ok
}

// FencedError is a write refused by a store's fence.
type FencedError struct {
	// Mine is the generation the write carried; Fence the store's.
	Mine, Fence int64
}

func (e *FencedError) Error() string {
	return fmt.Sprintf("%v: this controller's generation is %d, the store's fence %d", ErrLeaseLost, e.Mine, e.Fence)
}

// Unwrap is ErrLeaseLost.
func (e *FencedError) Unwrap() error { return ErrLeaseLost }

// checkFence refuses the transaction if the store's fence is above the
// generation ctx carries. It is an UPDATE, not a SELECT, so that on an
// engine with row locks it also holds the fence row until the transaction
// ends: a takeover raising the fence waits for a write already checked, and
// a write checked after the raise sees it.
func checkFence(ctx context.Context, tx *sql.Tx) error {
	g, ok := FenceOf(ctx)
	if !ok {
		return nil
	}
	res, err := tx.ExecContext(ctx, `UPDATE fence SET generation = generation WHERE id = 1 AND generation <= ?`, g)
	if err != nil {
		return fmt.Errorf("check the fence: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 1 {
		return err
	}
	var fence int64
	if err := tx.QueryRowContext(ctx, `SELECT generation FROM fence WHERE id = 1`).Scan(&fence); err != nil {
		return fmt.Errorf("read the fence: %w", err)
	}
	return &FencedError{Mine: g, Fence: fence}
}

// RaiseFence raises the store's fence to g (never lowers it), so that
// writes carrying an older generation are refused from now on. A new
// holder of the lease raises every store's before it serves.
func (db *DB) RaiseFence(ctx context.Context, g int64) error {
	return db.Write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE fence SET generation = ? WHERE id = 1 AND generation < ?`, g, g)
		return err
	})
}

// Fence is the store's fence: the highest generation raised.
func (db *DB) Fence(ctx context.Context) (int64, error) {
	var g int64
	err := db.Reader.QueryRowContext(ctx, `SELECT generation FROM fence WHERE id = 1`).Scan(&g)
	return g, err
}

// Exec runs one statement in its own write transaction, so that it is
// fenced as Write is.
func (db *DB) Exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	var res sql.Result
	err := db.Write(ctx, func(tx *sql.Tx) error {
		var err error
		res, err = tx.ExecContext(ctx, query, args...)
		return err
	})
	return res, err
}
