package e2e

import (
	"os"
	"testing"
)

// TestMain removes the programs the tests built once they have all run.
func TestMain(m *testing.M) {
	code := m.Run()
	if dir, err := programsDir(); err == nil {
		os.RemoveAll(dir)
	}
	os.Exit(code)
}
