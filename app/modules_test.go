package app

import (
	"os"
	"path/filepath"
	"testing"
)

func writeManifest(t testing.TB, body string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "mesh.json")
	if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}
