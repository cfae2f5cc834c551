package host

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"mesh-controller/app/protocol"
	"mesh-controller/app/restic"
	"mesh-controller/app/restic/restictest"
)

// The restic fact: the version of the restic on the PATH, asked again when
// that program changes; "" and why when there is none (the controller
// then says to install it on a node with precious data).
func TestFacts_Restic(t *testing.T) {
	restictest.Need(t)
	fact := func() protocol.Fact {
		t.Helper()
		for _, f := range Facts(t.TempDir()).Facts {
			if f.Name == protocol.FactRestic {
				return f
			}
		}
		t.Fatal("no restic fact")
		return protocol.Fact{}
	}
	want, err := restic.Version(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if f := fact(); f.Value != want || f.Why != "restic version" {
		t.Fatalf("Debian's restic: %+v", f)
	}
	dir := t.TempDir()
	t.Setenv("PATH", dir)
	if f := fact(); f.Value != "" || f.Why != "restic not found on PATH" {
		t.Fatalf("no restic: %+v", f)
	}
	prog := filepath.Join(dir, "restic")
	for _, v := range []string{"9.9.9", "9.9.10"} {
		if err := os.WriteFile(prog, []byte("#!/bin/sh\necho restic "+v+" compiled with go1.19 on linux/amd64\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		if f := fact(); f.Value != v || f.Why != "restic version" {
			t.Fatalf("restic %s: %+v", v, f)
		}
	}
}
