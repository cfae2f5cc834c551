// Package sqlite opens a context's store (pragmas, one writer, a reader
// pool), resolves where that store is from its credential, and brings its schema
// up to date from numbered, embedded migrations. A store is a SQLite file
// unless its credential is a postgres:// URL: then the same DB type holds
// pools on PostgreSQL (embedded/postgres), and this package says what
// differs (Write's lock, the migrations' dialect, the schema's reading).
// The DB type stays here, named for the engine every mesh starts on, so
// that the contexts, which use it everywhere, did not change.
package sqlite

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"mesh-controller/embedded/postgres"
)

// Shown is the DSN as output may show it: a PostgreSQL URL's password is
// never printed.
func (l Location) Shown() string {
	if postgres.IsURL(l.DSN) {
		return postgres.Redact(l.DSN)
	}
	return l.DSN
}

// MarshalJSON writes the location with its DSN as Shown: a listing's
// --json never carries a password.
func (l Location) MarshalJSON() ([]byte, error) {
	type plain Location
	p := plain(l)
	p.DSN = l.Shown()
	return json.Marshal(p)
}

// Postgres says the store is a PostgreSQL database, named by its URL.
func (l Location) Postgres() bool { return postgres.IsURL(l.DSN) }

// Location says where one context's store is and what said so.
type Location struct {
	// Context is the context's name, e.g. "inventory".
	Context string `json:"context"`
	// DSN is the SQLite path or file: URI, as the credential gave it.
	DSN string `json:"store"`
	// From names what chose the DSN: the variable, the variable naming a file,
	// or the data dir.
	From string `json:"from"`
	// Var is the variable a person sets to move the store.
	Var string `json:"variable"`
}

// EnvVar is the variable that names a context's store, e.g. MESH_STORE_INVENTORY.
func EnvVar(context string) string {
	return "MESH_STORE_" + strings.ToUpper(context)
}

// Locate resolves a context's store: MESH_STORE_<CONTEXT>, else the file named
// by MESH_STORE_<CONTEXT>_FILE (its content, white space trimmed), else
// <dataDir>/<context>.db. getenv is passed in so tests and callers control the
// environment.
func Locate(context, dataDir string, getenv func(string) string) (Location, error) {
	v := EnvVar(context)
	loc := Location{Context: context, Var: v}
	if dsn := strings.TrimSpace(getenv(v)); dsn != "" {
		loc.DSN, loc.From = dsn, v
		return loc, nil
	}
	if file := strings.TrimSpace(getenv(v + "_FILE")); file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return loc, fmt.Errorf("read %s_FILE: %w", v, err)
		}
		dsn := strings.TrimSpace(string(b))
		if dsn == "" {
			return loc, fmt.Errorf("%s_FILE names %s, which is empty", v, file)
		}
		loc.DSN, loc.From = dsn, v+"_FILE ("+file+")"
		return loc, nil
	}
	if dataDir == "" {
		return loc, fmt.Errorf("no data dir and no %s", v)
	}
	loc.DSN, loc.From = filepath.Join(dataDir, context+".db"), "data dir"
	return loc, nil
}

// FilePath is the file system path of the store, when the DSN names one
// (a plain path, or a file: URI with a path); "" otherwise, as for a
// PostgreSQL URL.
func (l Location) FilePath() string {
	dsn := l.DSN
	if postgres.IsURL(dsn) {
		return ""
	}
	if !strings.HasPrefix(dsn, "file:") {
		return dsn
	}
	rest := strings.TrimPrefix(dsn, "file:")
	if i := strings.IndexByte(rest, '?'); i >= 0 {
		rest = rest[:i]
	}
	// file://host/path and file:///path: SQLite accepts only an empty host or localhost.
	if strings.HasPrefix(rest, "//") {
		rest = strings.TrimPrefix(rest, "//")
		rest = strings.TrimPrefix(rest, "localhost")
	}
	if rest == "" || rest == ":memory:" {
		return ""
	}
	return rest
}
