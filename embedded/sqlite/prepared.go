package sqlite

import (
	"context"
	"database/sql"
)

// Statements runs a transaction's (or a pool's) statements each prepared
// once, on first use, and used again after: work that runs the same few
// statements for each of a batch of hundreds (a rack joining at once)
// parses each of them once, not once an item, which on SQLite costs about
// as much as running them. It has the methods of *sql.Tx that run
// statements, so code written for a transaction takes it as it is. Close
// it before the transaction ends.
type Statements struct {
	tx    preparer
	stmts map[string]*sql.Stmt
}

// Runner runs statements: a *sql.Tx, a *sql.DB, or Statements over
// either. Code that takes one runs the same within a transaction and
// within a batch whose statements are prepared once.
type Runner interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
	QueryRowContext(context.Context, string, ...any) *sql.Row
}

var _ Runner = (*Statements)(nil)

// preparer is a *sql.Tx or a *sql.DB.
type preparer interface {
	PrepareContext(context.Context, string) (*sql.Stmt, error)
	QueryRowContext(context.Context, string, ...any) *sql.Row
}

// Prepared is tx (a *sql.Tx or a *sql.DB) whose statements are prepared
// once each.
func Prepared(tx preparer) *Statements {
	return &Statements{tx: tx, stmts: map[string]*sql.Stmt{}}
}

func (s *Statements) stmt(ctx context.Context, query string) (*sql.Stmt, error) {
	if st, ok := s.stmts[query]; ok {
		return st, nil
	}
	st, err := s.tx.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	s.stmts[query] = st
	return st, nil
}

// ExecContext runs query, prepared once.
func (s *Statements) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	st, err := s.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	return st.ExecContext(ctx, args...)
}

// QueryContext runs query, prepared once.
func (s *Statements) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	st, err := s.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	return st.QueryContext(ctx, args...)
}

// QueryRowContext runs query, prepared once. A statement that cannot be
// prepared is run by the transaction itself, whose row then carries the
// error (a *sql.Row cannot be made with one).
func (s *Statements) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	st, err := s.stmt(ctx, query)
	if err != nil {
		return s.tx.QueryRowContext(ctx, query, args...)
	}
	return st.QueryRowContext(ctx, args...)
}

// Close lets go of the prepared statements.
func (s *Statements) Close() {
	for _, st := range s.stmts {
		st.Close()
	}
	clear(s.stmts)
}
