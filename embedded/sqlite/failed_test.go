package sqlite

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
)

// A database's error comes out saying the store and the act, once however
// many methods it passed through; a refusal, however wrapped, as it was
// said; both are still what errors.Is finds.
func TestFailed(t *testing.T) {
	db := open(t, filepath.Join(t.TempDir(), "inventory.db"), true)
	db.Location.Context = "inventory"
	_, dbErr := db.Reader.QueryContext(context.Background(), `SELECT nothing FROM no_such_table`)
	if dbErr == nil {
		t.Fatal("the query of a table that is not there worked")
	}
	err := db.Failed(dbErr, "read node %s", "web1")
	if want := "inventory store: read node web1: " + dbErr.Error(); err.Error() != want || !errors.Is(err, dbErr) {
		t.Fatalf("%q, want %q", err, want)
	}
	if again := db.Failed(err, "list nodes"); again != err {
		t.Fatalf("said twice: %q", again)
	}
	notKnown := Refusal("is not known")
	refused := fmt.Errorf("node web1 %w", notKnown)
	if got := db.Failed(refused, "read node %s", "web1"); got != refused || !errors.Is(got, notKnown) || !IsRefusal(got) {
		t.Fatalf("a refusal became %q", got)
	}
	// Failing, deferred, on a method's named error.
	method := func(fail error) (err error) {
		defer db.Failing(&err, "add node")
		return fail
	}
	if err := method(nil); err != nil {
		t.Fatal(err)
	}
	if err := method(dbErr); err.Error() != "inventory store: add node: "+dbErr.Error() {
		t.Fatalf("%q", err)
	}
	// The fence's refusal is a refusal: a deposed controller's write is
	// told so in the fence's words.
	if err := method(&FencedError{Mine: 1, Fence: 2}); !errors.Is(err, ErrLeaseLost) || err.Error() != (&FencedError{Mine: 1, Fence: 2}).Error() {
		t.Fatalf("%q", err)
	}
}
