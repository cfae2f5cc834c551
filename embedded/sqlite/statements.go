package sqlite

import (
	"context"
	"database/sql"
)

// Statements runs a transaction's statements, each prepared once however
// many rows it is run for: through the transaction itself a statement is
// parsed again each time, which is most of the cost of a change to ten
// thousand nodes. Close releases them; the transaction must still be open.
type Statements struct {
	tx       *sql.Tx
	prepared map[string]*sql.Stmt
}

// NewStatements is an empty set of statements on tx.
func NewStatements(tx *sql.Tx) *Statements {
	return &Statements{tx: tx, prepared: map[string]*sql.Stmt{}}
}

// ExecContext runs query with args, prepared the first time it is run.
func (s *Statements) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	st, ok := s.prepared[query]
	if !ok {
		var err error
		if st, err = s.tx.PrepareContext(ctx, query); err != nil {
			return nil, err
		}
		s.prepared[query] = st
	}
	return st.ExecContext(ctx, args...)
}

// QueryRowContext runs a query that gives one row, prepared the first time.
func (s *Statements) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	st, ok := s.prepared[query]
	if !ok {
		var err error
		if st, err = s.tx.PrepareContext(ctx, query); err != nil {
			// The row says the error when scanned, as the transaction's would.
			return s.tx.QueryRowContext(ctx, query, args...)
		}
		s.prepared[query] = st
	}
	return st.QueryRowContext(ctx, args...)
}

// Close closes every statement prepared.
func (s *Statements) Close() {
	for _, st := range s.prepared {
		st.Close()
	}
	clear(s.prepared)
}
