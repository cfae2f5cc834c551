package service

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// systemdAnalyze is systemd-analyze, or skips (fails under make test, which
// brings Debian's systemd).
func systemdAnalyze(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("MESH_TEST_TOOLS") != "" || os.Getenv("CI") != "" {
			t.Fatal("systemd-analyze is missing: make test installs Debian's systemd")
		}
		t.Skip("systemd-analyze is missing: apt-get install --no-install-recommends systemd")
	}
	return p
}

// TestUnit_Verify checks both units as systemd reads them: systemd-analyze
// verify finds an unknown or misspelt option, a bad value, and an ExecStart
// binary that is not there.
func TestUnit_Verify(t *testing.T) {
	t.Parallel()
	analyze := systemdAnalyze(t)
	dir := t.TempDir()
	for _, p := range Programs {
		bin := filepath.Join(dir, "bin dir", string(p))
		os.MkdirAll(filepath.Dir(bin), 0o755)
		if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		text, err := Unit{Program: p, Bin: bin}.Render()
		if err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(dir, p.UnitName())
		if err := os.WriteFile(file, text, 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(analyze, "verify", "--man=no", file).CombinedOutput()
		if err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("systemd-analyze verify %s: %v\n%s\n%s", p.UnitName(), err, out, text)
		}
	}
}
