package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"mesh-controller/app"
	"mesh-controller/app/archive/archivetest"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/builds"
)

// zerosManifest builds a 256 MiB file of zeros.
const zerosManifest = `{"module": "zeros", "version": "1.0.0",
  "build": {"command": ["sh", "-c", "mkdir -p bin && truncate -s 256M bin/zeros"], "outputs": ["bin/"], "timeout": "1m"},
  "run": {"command": ["bin/zeros"]}}
`

// zerosRepo makes a local bare git repository whose build makes a 256 MiB
// file of zeros (sparse, so made in no time): an archive of a few KiB that
// unpacks to 256 MiB, as the builder that filled a host's disk made.
func zerosRepo(t testing.TB) string {
	t.Helper()
	base := t.TempDir()
	bare, work := filepath.Join(base, "zeros.git"), filepath.Join(base, "work")
	git(t, base, "init", "-q", "--bare", "-b", "main", bare)
	git(t, base, "init", "-q", "-b", "main", work)
	if err := os.WriteFile(filepath.Join(work, "mesh.json"), []byte(zerosManifest), 0o644); err != nil {
		t.Fatal(err)
	}
	git(t, work, "add", ".")
	git(t, work, "commit", "-q", "-m", "zeros")
	git(t, work, "push", "-q", bare, "main")
	return bare
}

// A real builder's archive that unpacks far larger than it is: the builder
// reports its unpacked size, the controller keeps it with the build and
// the version and declares it, signed, with the digest; the host whose
// modules directory is a small disk refuses it before writing a byte, and
// the controller has the refusal, in one line with the sizes and what to
// do, as the apply's error.
func TestBuild_ArchiveTooLargeForTheHostsDisk(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	m.builderOn(t, "b1")
	web1 := m.join("web1")
	modules := filepath.Join(web1.root, protocol.ModulesDir)
	archivetest.MountSmallDisk(t, modules, 128<<20)
	free := archivetest.Free(t, modules)
	ctx := context.Background()

	a, err := m.c.Build(ctx, app.BuildRequest{Repository: zerosRepo(t)})
	if err != nil {
		t.Fatalf("build: %v\n%s", err, m.logs.String())
	}
	const unpacked int64 = 256<<20 + int64(len(zerosManifest)) // the archive carries mesh.json too
	if a.State != builds.Done || !a.Registered || a.UnpackedBytes != unpacked || a.Bytes > 64<<10 {
		t.Fatalf("the build: %+v", a)
	}
	t.Logf("a %d-byte archive that unpacks to %d", a.Bytes, a.UnpackedBytes)
	st, err := m.c.Stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inv, err := st.Inventory.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := inv.Archives["zeros@1.0.0"]; got.Digest != a.Digest || got.UnpackedBytes != unpacked {
		t.Fatalf("the registered version's archive %+v, the build's %s unpacking to %d", got, a.Digest, a.UnpackedBytes)
	}

	m.assign(t, "web1", "zeros")
	var apply *app.ApplyView
	checkFor(t, settle, func() error {
		if apply = m.node("web1").LastApply; apply == nil || apply.OK {
			return fmt.Errorf("web1 has not reported an apply refused; its last apply: %+v", apply)
		}
		return nil
	})
	for _, want := range []string{"refused: archive of zeros 1.0.0: ", "not enough free disk: it unpacks to 256.0 MiB",
		"128.0 MiB free: free space there, or give the module a node with more disk"} {
		if !strings.Contains(apply.Error, want) || strings.Contains(apply.Error, "\n") {
			t.Fatalf("the apply's error %q, want one line saying %q", apply.Error, want)
		}
	}
	// The declaration the host refused is the one that signed the size.
	d, err := st.Inventory.LatestDeclaration(ctx, "web1")
	if err != nil || d == nil {
		t.Fatalf("web1's declaration: %+v %v", d, err)
	}
	if d.Serial != apply.Serial || !strings.Contains(d.Body, `"unpacked_bytes":`+strconv.FormatInt(unpacked, 10)) {
		t.Fatalf("the declaration refused was %d; the latest, %d: %s", apply.Serial, d.Serial, d.Body)
	}
	if des, _ := os.ReadDir(filepath.Join(modules, "zeros")); len(des) != 0 {
		t.Fatalf("the refused archive left %v", des)
	}
	if got := archivetest.Free(t, modules); got != free {
		t.Fatalf("free space %d after the refusal, %d before", got, free)
	}
}
