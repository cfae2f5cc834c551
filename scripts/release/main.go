// Command release makes a release into dist/ (make release runs it): every
// program, static and stamped with the version, for every architecture; a
// .deb per package and architecture, made by nfpm; and SHA256SUMS, as
// sha256sum -c reads it. It is not shipped: nfpm runs as its own command
// (go run at the version below), so that neither nfpm nor any version of a
// module it needs enters this module's go.mod or the shipped binaries.
package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"mesh-controller/app/service"
)

// nfpm is the packager, run through the Go module proxy at a version known
// to work (the go run cache keeps it built after the first run).
const nfpm = "github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.48.0"

// Programs are the shipped programs, each cmd/<name>.
var Programs = []string{"mesh-controller", "mesh-host", "mesh-builder", "mesh-backup"}

// Arches are the architectures a release is made for.
var Arches = []string{"amd64", "arm64"}

// Package is one .deb: its programs go in /usr/bin, its units in the
// directory a package's units go.
type Package struct {
	Name        string
	Description string
	Programs    []string
	Units       []service.Unit
	Recommends  []string
}

// Packages are the .debs. The builder and the backup module go with the
// host: a host runs them as modules (a manifest's run.command may name a
// program on the host's PATH), never the controller. The packaged host
// never replaces its own executable, which is the package manager's to
// replace: its unit runs it with --no-self-upgrade.
var Packages = []Package{
	{Name: "mesh-controller", Description: "control plane of a mesh\n" +
		"mesh-controller, one static binary: its daemon, run by mesh-controller.service,\n" +
		"and the commands a person runs. The unit is installed, not enabled: as root,\n" +
		"run 'mesh-controller migrate', then 'systemctl enable --now mesh-controller'.",
		Programs: []string{"mesh-controller"},
		Units:    []service.Unit{{Program: service.Controller, Bin: "/usr/bin/mesh-controller"}}},
	{Name: "mesh-host", Description: "reference host of a mesh, with its builder and backup modules\n" +
		"mesh-host applies the declarations a mesh's controller signs, run by\n" +
		"mesh-host.service; mesh-builder and mesh-backup are the reference builder\n" +
		"and backup modules a host runs. The unit is installed, not enabled: as\n" +
		"root, join first (mesh-host join), then 'systemctl enable --now mesh-host'.",
		Programs:   []string{"mesh-host", "mesh-builder", "mesh-backup"},
		Units:      []service.Unit{{Program: service.Host, Bin: "/usr/bin/mesh-host", Args: []string{"--no-self-upgrade"}}},
		Recommends: []string{"restic", "nftables"}},
}

// Options are one release's.
type Options struct {
	// Version is stamped into every program (main.version) and, as
	// DebianVersion makes it, into every package.
	Version string
	// Out is where it all lands; it must be empty or missing.
	Out string
	// Root is the repository's top directory.
	Root     string
	Arches   []string
	Packages []string
	// Trimpath builds as make build does (-trimpath): the release's
	// binaries name no path of the machine that built them. A test turns it
	// off to build from the packages go test compiled.
	Trimpath bool
	// Log says what is being done.
	Log io.Writer
}

// validVersion is what a version may be: it goes into -ldflags and the
// release's file names as it is (an underscore would be read as their
// separator, and a Debian version has none).
var validVersion = regexp.MustCompile(`^[0-9A-Za-z][0-9A-Za-z.+~-]*$`)

// Release builds every program for every arch into o.Out, then the
// packages, then SHA256SUMS; it returns the files made, by name.
func Release(o Options) ([]string, error) {
	if !validVersion.MatchString(o.Version) {
		return nil, fmt.Errorf("version %q is not a version (letters, digits, . + ~ -): give one with VERSION=v1.2.3", o.Version)
	}
	out, err := filepath.Abs(o.Out)
	if err != nil {
		return nil, err
	}
	o.Out = out // nfpm is run elsewhere, and finds the binaries by it
	if err := emptyDir(o.Out); err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "mesh-release-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	var made []string
	for _, arch := range o.Arches {
		names, err := buildPrograms(o, arch, work)
		if err != nil {
			return nil, err
		}
		made = append(made, names...)
	}
	for _, name := range o.Packages {
		p := packageNamed(name)
		for _, arch := range o.Arches {
			deb, err := buildPackage(o, p, arch, work)
			if err != nil {
				return nil, err
			}
			made = append(made, deb)
		}
	}
	if err := writeSums(o.Out, made); err != nil {
		return nil, err
	}
	return append(made, "SHA256SUMS"), nil
}

// emptyDir makes dir, or checks that it holds nothing: a release directory
// holds one release, every file of it in SHA256SUMS.
func emptyDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		return err
	}
	if len(entries) > 0 {
		return fmt.Errorf("%s is not empty: remove it (make release does) or give another -out", dir)
	}
	return nil
}

// BinaryName is a program's file in the release: mesh-host_v1.2.3_linux_arm64.
func BinaryName(program, version, arch string) string {
	return fmt.Sprintf("%s_%s_linux_%s", program, version, arch)
}

// buildPrograms builds every program for one arch, static (CGO_ENABLED=0)
// and stamped, with one go build (its packages compiled once, linked in
// parallel), into work, then moves them into o.Out under their release names.
func buildPrograms(o Options, arch, work string) ([]string, error) {
	fmt.Fprintf(o.Log, "building %s for linux/%s (static, stamped %s)\n", strings.Join(Programs, ", "), arch, o.Version)
	dir := filepath.Join(work, "bin-"+arch)
	args := []string{"build", "-o", dir + string(filepath.Separator), "-ldflags", "-s -w -X main.version=" + o.Version}
	if o.Trimpath {
		args = append(args, "-trimpath")
	}
	for _, p := range Programs {
		args = append(args, "./cmd/"+p)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = o.Root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build for linux/%s: %v\n%s", arch, err, out)
	}
	var names []string
	for _, p := range Programs {
		name := BinaryName(p, o.Version, arch)
		if err := os.Rename(filepath.Join(dir, p), filepath.Join(o.Out, name)); err != nil {
			return nil, err
		}
		names = append(names, name)
	}
	return names, nil
}

func packageNamed(name string) Package {
	for _, p := range Packages {
		if p.Name == name {
			return p
		}
	}
	panic("release: no package " + name) // main checked the names
}

// nfpmConfig is the part of nfpm's configuration a package uses; nfpm
// reads it as YAML, of which JSON is a part.
type nfpmConfig struct {
	Name          string         `json:"name"`
	Arch          string         `json:"arch"`
	Platform      string         `json:"platform"`
	Version       string         `json:"version"`
	VersionSchema string         `json:"version_schema"`
	Section       string         `json:"section"`
	Priority      string         `json:"priority"`
	Maintainer    string         `json:"maintainer"`
	Description   string         `json:"description"`
	Recommends    []string       `json:"recommends,omitempty"`
	Contents      []nfpmContent  `json:"contents"`
	Scripts       map[string]any `json:"scripts"`
}

type nfpmContent struct {
	Src      string `json:"src"`
	Dst      string `json:"dst"`
	FileInfo struct {
		Mode int `json:"mode"`
	} `json:"file_info"`
}

// Maintainer is the packages' Maintainer field.
const Maintainer = "mesh-controller maintainers <maintainers@mesh-controller.invalid>"

// buildPackage makes one .deb with nfpm and returns its file name in o.Out.
func buildPackage(o Options, p Package, arch, work string) (string, error) {
	fmt.Fprintf(o.Log, "packaging %s for %s\n", p.Name, arch)
	dir := filepath.Join(work, p.Name+"-"+arch)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	cfg := nfpmConfig{Name: p.Name, Arch: arch, Platform: "linux", Version: DebianVersion(o.Version), VersionSchema: "none",
		Section: "admin", Priority: "optional", Maintainer: Maintainer, Description: p.Description, Recommends: p.Recommends,
		Scripts: map[string]any{}}
	add := func(src, dst string, mode int) {
		c := nfpmContent{Src: src, Dst: dst}
		c.FileInfo.Mode = mode
		cfg.Contents = append(cfg.Contents, c)
	}
	for _, prog := range p.Programs {
		add(filepath.Join(o.Out, BinaryName(prog, o.Version, arch)), "/usr/bin/"+prog, 0o755)
	}
	var unitNames []string
	for _, u := range p.Units {
		text, err := u.Render()
		if err != nil {
			return "", err
		}
		src := filepath.Join(dir, u.Program.UnitName())
		if err := os.WriteFile(src, text, 0o644); err != nil {
			return "", err
		}
		add(src, service.PackageUnitDir+"/"+u.Program.UnitName(), 0o644)
		unitNames = append(unitNames, u.Program.UnitName())
	}
	for script, text := range MaintainerScripts(unitNames) {
		src := filepath.Join(dir, script)
		if err := os.WriteFile(src, []byte(text), 0o755); err != nil {
			return "", err
		}
		cfg.Scripts[script] = src
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return "", err
	}
	config := filepath.Join(dir, "nfpm.yaml")
	if err := os.WriteFile(config, b, 0o644); err != nil {
		return "", err
	}
	before, err := os.ReadDir(o.Out)
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "run", nfpm, "package", "--config", config, "--packager", "deb", "--target", o.Out+string(filepath.Separator))
	cmd.Dir = dir // outside this module: nfpm's own go.mod decides its dependencies
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GOOS=", "GOARCH=")
	if epoch := sourceDate(o.Root); epoch != "" && os.Getenv("SOURCE_DATE_EPOCH") == "" {
		cmd.Env = append(cmd.Env, "SOURCE_DATE_EPOCH="+epoch)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("nfpm package %s for %s: %v\n%s", p.Name, arch, err, out)
	}
	after, err := os.ReadDir(o.Out)
	if err != nil {
		return "", err
	}
	for _, e := range after {
		if !slices.ContainsFunc(before, func(b os.DirEntry) bool { return b.Name() == e.Name() }) && strings.HasSuffix(e.Name(), ".deb") {
			return e.Name(), nil
		}
	}
	return "", fmt.Errorf("nfpm made no .deb of %s for %s in %s", p.Name, arch, o.Out)
}

// sourceDate is the commit's time, in seconds: what nfpm dates the files
// in a package with, so that the same commit makes the same .deb.
func sourceDate(root string) string {
	cmd := exec.Command("git", "log", "-1", "--format=%ct")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// MaintainerScripts are a package's postinst, prerm and postrm: systemd
// is told of the units as they come and go (daemon-reload), a unit is
// stopped when its package is removed, and nothing is enabled, started or
// restarted: a controller needs its stores migrated and a host needs to
// join before either serves, and restarting a host restarts its modules,
// which a person chooses the time of. Purging deletes no data: the stores
// and a host's keys in /var/lib stay. On a machine without systemd
// running (a container, a chroot) they do nothing.
func MaintainerScripts(units []string) map[string]string {
	if len(units) == 0 {
		return nil
	}
	const head = "#!/bin/sh\nset -e\n"
	systemd := `[ -d /run/systemd/system ]`
	list := strings.Join(units, " ")
	return map[string]string{
		"postinstall": head + "if [ \"$1\" = configure ] && " + systemd + "; then\n" +
			"\tsystemctl daemon-reload || true\n" +
			"\tfor unit in " + list + "; do\n" +
			"\t\tif systemctl is-active --quiet \"$unit\"; then\n" +
			"\t\t\techo \"$unit runs the binary it started with: systemctl restart $unit when it suits\"\n" +
			"\t\tfi\n" +
			"\tdone\n" +
			"fi\n",
		"preremove": head + "if [ \"$1\" = remove ] && " + systemd + "; then\n" +
			"\tsystemctl stop " + list + " || true\n" +
			"fi\n",
		"postremove": head + "if { [ \"$1\" = remove ] || [ \"$1\" = purge ]; } && " + systemd + "; then\n" +
			"\tsystemctl daemon-reload || true\n" +
			"fi\n",
	}
}

// describe is git describe's shape: a tag, commits since, the commit.
var describe = regexp.MustCompile(`^(.+)-(\d+)-(g[0-9a-f]+)$`)

// commit is git describe --always's shape where no tag is reachable.
var commit = regexp.MustCompile(`^[0-9a-f]{7,40}$`)

// DebianVersion is a version as a package's Version field, ordered as
// dpkg orders them: v1.2.3 is 1.2.3; git describe's v1.2.3-4-gabc1234 is
// 1.2.3+4.gabc1234 (after 1.2.3, before 1.2.4); a pre-release v1.3.0-rc1
// is 1.3.0~rc1 (before 1.3.0); -dirty becomes +dirty; a commit alone, or
// any version that does not start with a digit, is 0.0.0+ it.
func DebianVersion(v string) string {
	v = strings.TrimPrefix(v, "v")
	dirty := strings.HasSuffix(v, "-dirty")
	v = strings.TrimSuffix(v, "-dirty")
	var plus []string
	if m := describe.FindStringSubmatch(v); m != nil {
		v, plus = strings.TrimPrefix(m[1], "v"), []string{m[2], m[3]}
	}
	switch {
	case plus == nil && commit.MatchString(v), v == "" || v[0] < '0' || v[0] > '9':
		v, plus = "0.0.0", append([]string{strings.ReplaceAll(v, "-", ".")}, plus...)
	default:
		// A hyphen would split off a Debian revision: a pre-release sorts
		// before its release with ~.
		v = strings.ReplaceAll(v, "-", "~")
	}
	if dirty {
		plus = append(plus, "dirty")
	}
	if plus = slices.DeleteFunc(plus, func(p string) bool { return p == "" }); len(plus) > 0 {
		sep := "+"
		if strings.Contains(v, "+") {
			sep = "."
		}
		v += sep + strings.Join(plus, ".")
	}
	return v
}

// writeSums writes SHA256SUMS in out: one "<sha256>  <file>" line a file,
// as sha256sum writes and sha256sum -c reads.
func writeSums(out string, files []string) error {
	var b bytes.Buffer
	sorted := slices.Sorted(slices.Values(files))
	for _, name := range sorted {
		f, err := os.Open(filepath.Join(out, name))
		if err != nil {
			return err
		}
		h := sha256.New()
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s  %s\n", hex.EncodeToString(h.Sum(nil)), name)
	}
	return os.WriteFile(filepath.Join(out, "SHA256SUMS"), b.Bytes(), 0o644)
}

// gitDescribe is the version make release stamps unless VERSION is given.
func gitDescribe(root string) (string, error) {
	cmd := exec.Command("git", "describe", "--tags", "--always", "--dirty")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git describe: %v: give the version with -version (VERSION=v1.2.3 on make's line)", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// moduleRoot is the directory of this module's go.mod, found from dir.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %v", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside the repository: run it from there (make release)")
	}
	return filepath.Dir(mod), nil
}

// list splits a comma-separated flag, refusing a word not in known.
func list(flagName, value string, known []string) ([]string, error) {
	var out []string
	for _, w := range strings.Split(value, ",") {
		if w = strings.TrimSpace(w); w == "" {
			continue
		}
		if !slices.Contains(known, w) {
			return nil, fmt.Errorf("-%s %s: not one of %s", flagName, w, strings.Join(known, ", "))
		}
		out = append(out, w)
	}
	return out, nil
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	var packageNames []string
	for _, p := range Packages {
		packageNames = append(packageNames, p.Name)
	}
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	fs.SetOutput(stderr)
	version := fs.String("version", "", "the version stamped (default: git describe --tags --always --dirty)")
	out := fs.String("out", "dist", "where the release lands (must be empty or missing)")
	arches := fs.String("arch", strings.Join(Arches, ","), "the architectures, separated by commas")
	packages := fs.String("package", strings.Join(packageNames, ","), "the .debs made, separated by commas (none: -package '')")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	usage := func(err error) int {
		fmt.Fprintf(stderr, "release: %v, see 'go run ./scripts/release -h'\n", err)
		return 2
	}
	if fs.NArg() > 0 {
		return usage(fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	}
	o := Options{Version: *version, Out: *out, Trimpath: true, Log: stderr}
	var err error
	if o.Arches, err = list("arch", *arches, Arches); err != nil {
		return usage(err)
	}
	if o.Packages, err = list("package", *packages, packageNames); err != nil {
		return usage(err)
	}
	fail := func(err error) int { fmt.Fprintf(stderr, "release: %v\n", err); return 1 }
	if o.Root, err = moduleRoot(); err != nil {
		return fail(err)
	}
	if o.Version == "" {
		if o.Version, err = gitDescribe(o.Root); err != nil {
			return fail(err)
		}
	}
	made, err := Release(o)
	if err != nil {
		return fail(err)
	}
	for _, f := range made {
		fmt.Fprintln(stdout, filepath.Join(*out, f))
	}
	return 0
}
