package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"mesh-controller/embedded/sqlite"
)

// Statements run through Prepared work as the transaction's own, across
// savepoints rolled back to (as a batch of joins uses them), on either
// engine; one that cannot be prepared says why where it is run.
func TestPrepared(t *testing.T) {
	ctx := context.Background()
	db := emptyStore(t)
	if _, err := db.Writer.ExecContext(ctx, `CREATE TABLE p (x INTEGER PRIMARY KEY, y TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	err := db.Write(ctx, func(wtx *sql.Tx) error {
		tx := sqlite.Prepared(wtx)
		defer tx.Close()
		for i := range 10 {
			if _, err := tx.ExecContext(ctx, `SAVEPOINT one`); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO p (x, y) VALUES (?, ?)`, i, "v"); err != nil {
				return err
			}
			if i%2 == 1 {
				if _, err := tx.ExecContext(ctx, `ROLLBACK TO one`); err != nil {
					return err
				}
			}
			if _, err := tx.ExecContext(ctx, `RELEASE one`); err != nil {
				return err
			}
			var n int
			if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM p WHERE x <= ?`, i).Scan(&n); err != nil || n != i/2+1 {
				t.Errorf("after %d: %d rows, %v", i, n, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var n int
	read := sqlite.Prepared(db.Reader)
	defer read.Close()
	if err := read.QueryRowContext(ctx, `SELECT count(*) FROM p`).Scan(&n); err != nil || n != 5 {
		t.Fatalf("kept %d rows, %v", n, err)
	}
	undo := errors.New("undo")
	err = db.Write(ctx, func(wtx *sql.Tx) error {
		tx := sqlite.Prepared(wtx)
		defer tx.Close()
		if _, err := tx.ExecContext(ctx, `INSERT INTO nothere VALUES (1)`); err == nil {
			t.Error("a statement on a table that does not exist was run")
		}
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM nothere`).Scan(&n); err == nil {
			t.Error("a query of a table that does not exist was answered")
		}
		return undo
	})
	if !errors.Is(err, undo) {
		t.Fatal(err)
	}
}
