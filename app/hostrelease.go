package app

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"mesh-controller/app/archive"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/inventory"
)

// Host releases are mesh-host binaries the controller keeps for hosts to
// upgrade themselves to: each packed as a built module's archive is (one
// file, mesh-host, at its top), put in the broker's archive store under
// its digest, and recorded with its version in the inventory, so that a
// declaration can name it and the collection keeps it.

// hostPackage is the main package of the mesh-host binary, as its build
// records it.
const hostPackage = "mesh-controller/cmd/mesh-host"

// ErrNotHostBinary means a file given as a host release is not a
// mesh-host binary.
var ErrNotHostBinary = errors.New("not a mesh-host binary")

// HostReleaseRequest adds a host release: the binary's file, and its
// version if the binary cannot say it here (built for another machine).
type HostReleaseRequest struct {
	File    string
	Version string
}

// HostReleaseView is a host release as commands show it.
type HostReleaseView struct {
	inventory.HostRelease
	// Added says this act added it (false: it was kept already).
	Added bool `json:"added,omitempty"`
	// RunOn are the nodes whose host says it runs it; DeclaredTo those it
	// is declared to.
	RunOn      []string `json:"run_on"`
	DeclaredTo []string `json:"declared_to"`
}

// HostReleaseAdd keeps a mesh-host binary as a host release: its version
// read from it (as stamped at link time; a development build is refused,
// since a host checks the binary says the version declared), packed, put
// in the broker's archive store (a controller must serve), and recorded.
// The same binary again is no change; another binary under a version kept
// is refused.
func (c *Modules) HostReleaseAdd(ctx context.Context, r HostReleaseRequest) (HostReleaseView, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return HostReleaseView{}, err
	}
	rel, err := readHostBinary(ctx, r.File, r.Version)
	if err != nil {
		return HostReleaseView{}, err
	}
	kept, err := st.Inventory.HostReleases(ctx)
	if err != nil {
		return HostReleaseView{}, err
	}
	tmp, err := os.MkdirTemp("", "mesh-host-release-")
	if err != nil {
		return HostReleaseView{}, err
	}
	defer os.RemoveAll(tmp)
	packed, archiveFile, err := packHostBinary(r.File, tmp)
	if err != nil {
		return HostReleaseView{}, err
	}
	rel.Archive = inventory.Archive{Digest: packed.Digest, Bytes: packed.Bytes, UnpackedBytes: packed.Unpacked}
	for _, k := range kept {
		if k.Version == rel.Version && k.Archive.Digest != rel.Archive.Digest {
			return HostReleaseView{}, fmt.Errorf("mesh-host %s: %w (archive %.12s, added %s): a version names one binary; stamp this one with another version",
				rel.Version, inventory.ErrHostReleaseExists, k.Archive.Digest, k.AddedAt.Format(time.RFC3339))
		}
	}
	nc, err := c.dialBroker(ctx, st.Identity)
	if err != nil {
		return HostReleaseView{}, fmt.Errorf("host releases are kept by the serving controller's broker, and %w", err)
	}
	defer nc.Close()
	f, err := os.Open(archiveFile)
	if err != nil {
		return HostReleaseView{}, err
	}
	defer f.Close()
	if err := archive.Put(ctx, nc, packed.Digest, f); err != nil {
		return HostReleaseView{}, err
	}
	rel.Who = who()
	added, err := st.Inventory.AddHostRelease(ctx, rel, c.Now())
	if errors.Is(err, inventory.ErrHostReleaseExists) {
		return HostReleaseView{}, fmt.Errorf("mesh-host %s: %w: a version names one binary; stamp this one with another version", rel.Version, err)
	}
	if err != nil {
		return HostReleaseView{}, err
	}
	if !added {
		for _, k := range kept {
			if k.Version == rel.Version {
				rel = k
			}
		}
	}
	return HostReleaseView{HostRelease: rel, Added: added, RunOn: []string{}, DeclaredTo: []string{}}, nil
}

// readHostBinary reads what a file given as a host release is: a mesh-host
// binary (as its build records), for which system, and its version:
// stamped in its build record, else as it says when run here ('mesh-host
// version', when built for this machine), else as given. A version given
// that is not the one it says is refused.
func readHostBinary(ctx context.Context, file, given string) (inventory.HostRelease, error) {
	if given != "" && !protocol.ValidHostVersion(given) {
		return inventory.HostRelease{}, fmt.Errorf("--as %q is not a host version: 1 to %d printable characters", given, protocol.MaxHostVersion)
	}
	bi, err := buildinfo.ReadFile(file)
	if err != nil {
		if inner := errors.Unwrap(err); inner != nil {
			err = inner // its words name the file again
		}
		return inventory.HostRelease{}, fmt.Errorf("%s is %w: not a Go program (%v)", file, ErrNotHostBinary, err)
	}
	if bi.Path != hostPackage {
		return inventory.HostRelease{}, fmt.Errorf("%s is %w: it is the Go program %s", file, ErrNotHostBinary, orUnknown(bi.Path))
	}
	rel := inventory.HostRelease{}
	stamped := ""
	for _, s := range bi.Settings {
		switch s.Key {
		case "GOOS":
			rel.OS = s.Value
		case "GOARCH":
			rel.Arch = s.Value
		case "-ldflags":
			stamped = stampedVersion(s.Value)
		}
	}
	if stamped == "" && rel.OS == runtime.GOOS && rel.Arch == runtime.GOARCH {
		if stamped, err = askVersion(ctx, file); err != nil {
			return rel, err
		}
	}
	switch {
	case stamped == "development build" || (stamped == "" && given == ""):
		return rel, fmt.Errorf("%s says no version (a development build): a host checks that the binary says the version declared; build it with -ldflags '-X main.version=VERSION' (make build stamps git describe)", file)
	case stamped != "" && given != "" && stamped != given:
		return rel, fmt.Errorf("%s says it is mesh-host %s, not %s: leave --as out, or give the binary of %s", file, stamped, given, given)
	case stamped != "" && !protocol.ValidHostVersion(stamped):
		return rel, fmt.Errorf("%s says it is mesh-host %q, which is not a host version", file, stamped)
	case stamped != "":
		rel.Version = stamped
	default:
		rel.Version = given
	}
	return rel, nil
}

// stampedVersion is the version -ldflags stamps (-X main.version=V), ""
// if none.
func stampedVersion(ldflags string) string {
	f := strings.Fields(ldflags)
	for i, w := range f {
		x := w
		if w == "-X" && i+1 < len(f) {
			x = f[i+1]
		} else if v, ok := strings.CutPrefix(w, "-X="); ok {
			x = v
		} else {
			continue
		}
		if v, ok := strings.CutPrefix(strings.Trim(x, `'"`), "main.version="); ok {
			return v
		}
	}
	return ""
}

// askVersion runs 'FILE version' (no environment, ten seconds at most)
// and reads the version it says.
func askVersion(ctx context.Context, file string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	abs, err := filepath.Abs(file)
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, abs, "version")
	cmd.Env = []string{}
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s does not say its version ('%s version': %v): give it with --as VERSION", file, file, err)
	}
	v, ok := strings.CutPrefix(strings.TrimSpace(out.String()), "mesh-host ")
	if !ok {
		return "", fmt.Errorf("%s is %w: 'version' says %.60q", file, ErrNotHostBinary, out.String())
	}
	return v, nil
}

// packHostBinary packs file as a host release's archive (one file,
// protocol.HostBinaryName, executable) into dir, and returns what it
// packed and the archive's file.
func packHostBinary(file, dir string) (archive.Packed, string, error) {
	tree := filepath.Join(dir, "tree")
	if err := os.Mkdir(tree, 0o700); err != nil {
		return archive.Packed{}, "", err
	}
	if err := copyFile(file, filepath.Join(tree, protocol.HostBinaryName), 0o755); err != nil {
		return archive.Packed{}, "", err
	}
	out := filepath.Join(dir, "mesh-host.tar.zst")
	f, err := os.OpenFile(out, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
	if err != nil {
		return archive.Packed{}, "", err
	}
	defer f.Close()
	packed, err := archive.Pack(f, tree, []string{protocol.HostBinaryName})
	if err != nil {
		return archive.Packed{}, "", err
	}
	return packed, out, f.Close()
}

// copyFile copies a regular file to a new file of mode perm.
func copyFile(from, to string, perm os.FileMode) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	if fi, err := in.Stat(); err != nil {
		return err
	} else if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", from)
	}
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// HostReleases lists the host releases kept, newest first, each with the
// nodes that run it and those it is declared to.
func (c *Modules) HostReleases(ctx context.Context) ([]HostReleaseView, error) {
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return nil, err
	}
	rels, err := st.Inventory.HostReleases(ctx)
	if err != nil {
		return nil, err
	}
	runs, err := c.hostVersions(ctx, st, snap)
	if err != nil {
		return nil, err
	}
	out := make([]HostReleaseView, 0, len(rels))
	for _, r := range rels {
		v := HostReleaseView{HostRelease: r, RunOn: []string{}, DeclaredTo: []string{}}
		for _, name := range snap.NodeNames {
			if runs[name] == r.Version {
				v.RunOn = append(v.RunOn, name)
			}
			if snap.Nodes[name].HostRelease == r.Version {
				v.DeclaredTo = append(v.DeclaredTo, name)
			}
		}
		sort.Strings(v.RunOn)
		out = append(out, v)
	}
	return out, nil
}
