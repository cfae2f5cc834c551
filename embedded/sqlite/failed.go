package sqlite

import (
	"errors"
	"fmt"
)

// Refusal makes one of a context's own errors: a rule of the context said
// no (a node that is not known, an act that lost its race), and its words
// are the whole answer a person needs. Failed passes it, and any error
// that wraps it, as it is. errors.Is finds it as it finds errors.New's.
func Refusal(text string) error { return &refusal{text} }

type refusal struct{ text string }

// IsRefusal says err is a refusal, or wraps one: made by Refusal, or by a
// package with no store (a context's model) whose error says Refused().
func IsRefusal(err error) bool {
	var r interface{ Refused() bool }
	return errors.As(err, &r) && r.Refused()
}

func (r *refusal) Error() string { return r.text }

// Refused marks it a refusal (IsRefusal).
func (r *refusal) Refused() bool { return true }

// failure is an error a store method met: what the database (or a stored
// value it could not read) said, with the store and the act it came from.
type failure struct {
	context, act string
	err          error
}

func (f *failure) Error() string { return f.context + " store: " + f.act + ": " + f.err.Error() }

func (f *failure) Unwrap() error { return f.err }

// Failed says where err came from, "<context> store: <act>: <err>", so that
// a database's words (database is locked, a lost connection, a value it
// cannot read) come with the store to look at and what it was doing. nil,
// a refusal (see Refusal), and an error already said so pass as they are.
// The act is a format, with args, as fmt.Sprintf's.
func (db *DB) Failed(err error, act string, args ...any) error {
	var f *failure
	if err == nil || IsRefusal(err) || errors.As(err, &f) {
		return err
	}
	if len(args) > 0 {
		act = fmt.Sprintf(act, args...)
	}
	return &failure{context: db.Location.Context, act: act, err: err}
}

// Failing is Failed on a method's named error, deferred: every error it
// returns says its store and act, whichever line it came from.
func (db *DB) Failing(err *error, act string, args ...any) {
	*err = db.Failed(*err, act, args...)
}
