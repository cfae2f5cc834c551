package host

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"mesh-controller/app/protocol"
)

// A host release whose binary does not verify is refused, in one line
// saying why, before anything is replaced: the host's executable is what
// it was, no upgrade is recorded and no previous binary kept.
func TestUpgradeSelf_RefusesWhatDoesNotVerify(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	exe := filepath.Join(dir, "bin", "mesh-host")
	if err := os.MkdirAll(filepath.Dir(exe), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exe, []byte("the binary running"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := &Runner{State: &State{Dir: filepath.Join(dir, "state"), Node: "web1"}, exe: exe, SelfUpgrade: true}
	files := map[string]string{}
	release := func(body string) protocol.Archive {
		file, a := packed(t, map[string]string{protocol.HostBinaryName: body})
		files[a.Digest] = file
		return a
	}
	notRun := release("not a program")
	other := release("#!/bin/sh\necho mesh-host v0.0.1\n")
	wrongDigest := other
	wrongDigest.Digest = strings.Repeat("ab", 32)
	files[wrongDigest.Digest] = files[other.Digest]
	for _, c := range []struct {
		name    string
		archive *protocol.Archive
		says    string
	}{
		{"its digest is not the one declared", &wrongDigest, "refused: archive of mesh-host v2.0.0: receive archive"},
		{"it does not run", &notRun, "refused: mesh-host v2.0.0: the binary does not run here: "},
		{"it says another version", &other, `refused: mesh-host v2.0.0: the binary says "mesh-host v0.0.1", not mesh-host v2.0.0`},
		{"no archive, none kept", nil, "refused: mesh-host v2.0.0 is declared without an archive, and this host keeps no binary of it"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := r.upgradeSelf(nil, 7, protocol.DeclaredHost{Version: "v2.0.0", Archive: c.archive}, fromFiles(t, files))
			if err == nil || !strings.HasPrefix(err.Error(), c.says) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("refused with %v, want it to begin %q", err, c.says)
			}
			if b, _ := os.ReadFile(exe); string(b) != "the binary running" {
				t.Fatal("the executable was replaced")
			}
			for _, f := range []string{r.upgradePath(fileUpgrade), r.upgradePath("previous")} {
				if _, err := os.Stat(f); err == nil {
					t.Fatalf("%s was written", f)
				}
			}
		})
	}
}
