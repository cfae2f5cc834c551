package licences

import (
	"os"
	"testing"

	"mesh-controller/embedded/sqlite/sqlitetest"
)

// Every test runs on SQLite, then again with its stores on PostgreSQL.
func TestMain(m *testing.M) { os.Exit(sqlitetest.Main(m)) }
