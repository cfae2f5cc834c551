package service

import (
	"errors"
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

// TestInstall_NotRoot: a user who is not root is refused before anything
// is written, unless the files go beneath --destdir or it is a dry run.
func TestInstall_NotRoot(t *testing.T) {
	t.Parallel()
	var out, next strings.Builder
	o := Options{Unit: Unit{Program: Controller, Bin: "/usr/bin/mesh-controller"}, Out: &out, Next: &next, Euid: 1000}
	for name, act := range map[string]func(Options) error{"install": Install, "uninstall": Uninstall} {
		err := act(o)
		if !errors.Is(err, ErrNotRoot) {
			t.Fatalf("%s as uid 1000: %v, want ErrNotRoot", name, err)
		}
		if want := name + " needs root: it writes /etc/systemd/system and /var/lib/mesh-controller; run it as root (sudo mesh-controller " + name + ")"; !strings.HasPrefix(err.Error(), want) {
			t.Errorf("%s: %q", name, err)
		}
	}
	if out.Len() > 0 || next.Len() > 0 {
		t.Fatalf("refused, yet said %q %q", out.String(), next.String())
	}
	dest := t.TempDir()
	o.DestDir = dest
	if err := Install(o); err != nil {
		t.Fatalf("beneath --destdir as uid 1000: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dest, "etc/systemd/system/mesh-controller.service")); err != nil {
		t.Fatal(err)
	}
	o.DestDir, o.DryRun = "", true
	if err := Install(o); err != nil {
		t.Fatalf("a dry run as uid 1000: %v", err)
	}
}
