package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// needTool finds a program the test runs: missing, it fails the test under
// make test (MESH_TEST_TOOLS=1) and skips it elsewhere, saying why.
func needTool(t *testing.T, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	msg := name + " is missing: apt-get install --no-install-recommends " + pkg
	if os.Getenv("MESH_TEST_TOOLS") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// The amd64 release of the controller's package, as make release makes it
// (without -trimpath, so that go build links the packages go test
// compiled): SHA256SUMS says every file and sha256sum -c agrees, every
// binary is static and says the version stamped, and the .deb holds the
// binary and its unit naming /usr/bin; then, under make test or when
// MESH_TEST_DPKG=1 asks, the .deb is installed with dpkg -i, its
// mesh-controller run, and purged, leaving the machine as it was.
func TestRelease_ControllerAMD64(t *testing.T) {
	dpkgDeb := needTool(t, "dpkg-deb", "dpkg")
	const version = "v9.8.7-test.1"
	out := t.TempDir()
	made, err := Release(Options{Version: version, Out: out, Root: filepath.Join("..", ".."), Arches: []string{"amd64"},
		Packages: []string{"mesh-controller"}, Log: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	deb := "mesh-controller_9.8.7~test.1_amd64.deb"
	want := []string{"SHA256SUMS", deb}
	for _, p := range Programs {
		want = append(want, BinaryName(p, version, "amd64"))
	}
	entries, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	slices.Sort(want)
	slices.Sort(made)
	if !slices.Equal(got, want) || !slices.Equal(made, want) {
		t.Fatalf("the release holds %v and says it made %v, want %v", got, made, want)
	}

	t.Run("sums", func(t *testing.T) {
		f, err := os.Open(filepath.Join(out, "SHA256SUMS"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var listed []string
		for s := bufio.NewScanner(f); s.Scan(); {
			sum, name, ok := strings.Cut(s.Text(), "  ")
			if !ok {
				t.Fatalf("SHA256SUMS line %q is not '<sha256>  <file>'", s.Text())
			}
			b, err := os.ReadFile(filepath.Join(out, name))
			if err != nil {
				t.Fatal(err)
			}
			if h := sha256.Sum256(b); hex.EncodeToString(h[:]) != sum {
				t.Errorf("SHA256SUMS says %s of %s; it is %x", sum, name, h)
			}
			listed = append(listed, name)
		}
		if w := slices.DeleteFunc(slices.Clone(want), func(n string) bool { return n == "SHA256SUMS" }); !slices.Equal(listed, w) {
			t.Errorf("SHA256SUMS lists %v, want %v in order", listed, w)
		}
		cmd := exec.Command(needTool(t, "sha256sum", "coreutils"), "-c", "--strict", "SHA256SUMS")
		cmd.Dir = out
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("sha256sum -c: %v\n%s", err, b)
		}
	})

	t.Run("static and stamped", func(t *testing.T) {
		for _, p := range Programs {
			bin := filepath.Join(out, BinaryName(p, version, "amd64"))
			f, err := elf.Open(bin)
			if err != nil {
				t.Fatal(err)
			}
			for _, prog := range f.Progs {
				if prog.Type == elf.PT_INTERP || prog.Type == elf.PT_DYNAMIC {
					t.Errorf("%s has a %s program header: it is linked dynamically", p, prog.Type)
				}
			}
			if f.Machine != elf.EM_X86_64 {
				t.Errorf("%s is for %s, want x86-64", p, f.Machine)
			}
			f.Close()
			for _, args := range [][]string{{"--version"}, {"version"}} {
				b, err := exec.Command(bin, args...).CombinedOutput()
				if err != nil || string(b) != p+" "+version+"\n" {
					t.Errorf("%s %s: %v, printed %q, want %q", p, args[0], err, b, p+" "+version+"\n")
				}
			}
		}
	})

	t.Run("deb", func(t *testing.T) {
		path := filepath.Join(out, deb)
		fields, err := exec.Command(dpkgDeb, "-f", path, "Package", "Version", "Architecture").Output()
		if err != nil {
			t.Fatal(err)
		}
		if w := "Package: mesh-controller\nVersion: 9.8.7~test.1\nArchitecture: amd64\n"; string(fields) != w {
			t.Errorf("dpkg-deb -f says\n%s\nwant\n%s", fields, w)
		}
		list, err := exec.Command(dpkgDeb, "-c", path).Output()
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range []string{"-rwxr-xr-x root/root .* ./usr/bin/mesh-controller\n", "-rw-r--r-- root/root .* ./usr/lib/systemd/system/mesh-controller.service\n"} {
			if !matches(string(list), w) {
				t.Errorf("dpkg-deb -c lists no %q:\n%s", w, list)
			}
		}
		files := debFiles(t, dpkgDeb, path)
		bin, err := os.ReadFile(filepath.Join(out, BinaryName("mesh-controller", version, "amd64")))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(files["./usr/bin/mesh-controller"], bin) {
			t.Error("the .deb's /usr/bin/mesh-controller is not the release's binary")
		}
		if unit := string(files["./usr/lib/systemd/system/mesh-controller.service"]); !strings.Contains(unit, "\nExecStart=/usr/bin/mesh-controller serve\n") {
			t.Errorf("the packaged unit does not run /usr/bin/mesh-controller serve:\n%s", unit)
		}
		postinst, err := exec.Command(dpkgDeb, "-I", path, "postinst").Output()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(postinst), "systemctl daemon-reload") || strings.Contains(string(postinst), "enable") {
			t.Errorf("postinst must tell systemd of the unit and enable nothing:\n%s", postinst)
		}
	})

	t.Run("dpkg -i", func(t *testing.T) {
		if os.Getenv("MESH_TEST_TOOLS") == "" && os.Getenv("MESH_TEST_DPKG") == "" {
			t.Skip("installs a package on this machine: runs under make test, or with MESH_TEST_DPKG=1")
		}
		dpkg := needTool(t, "dpkg", "dpkg")
		if os.Geteuid() != 0 {
			t.Fatal("dpkg -i needs root: run the test as root (CI and make test in CI are)")
		}
		if st, _ := exec.Command("dpkg-query", "-W", "-f", "${db:Status-Status}", "mesh-controller").Output(); len(st) > 0 && string(st) != "not-installed" {
			t.Fatalf("a mesh-controller package is on this machine (%s): the test would replace it; remove it (dpkg --purge mesh-controller) first", st)
		}
		for _, f := range []string{"/usr/bin/mesh-controller", "/usr/lib/systemd/system/mesh-controller.service"} {
			if _, err := os.Lstat(f); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("%s is on this machine, of no package: the test would replace it; move it away first", f)
			}
		}
		purge := func() ([]byte, error) { return exec.Command(dpkg, "--purge", "mesh-controller").CombinedOutput() }
		t.Cleanup(func() { purge() }) // left as found, whatever failed
		if b, err := exec.Command(dpkg, "-i", filepath.Join(out, deb)).CombinedOutput(); err != nil {
			t.Fatalf("dpkg -i: %v\n%s", err, b)
		}
		b, err := exec.Command("/usr/bin/mesh-controller", "version").CombinedOutput()
		if err != nil || string(b) != "mesh-controller "+version+"\n" {
			t.Errorf("/usr/bin/mesh-controller version: %v, printed %q", err, b)
		}
		if v, _ := exec.Command("dpkg-query", "-W", "-f", "${Version} ${db:Status-Status}", "mesh-controller").Output(); string(v) != "9.8.7~test.1 installed" {
			t.Errorf("dpkg-query says mesh-controller is %q, want installed at 9.8.7~test.1", v)
		}
		if _, err := os.Stat("/usr/lib/systemd/system/mesh-controller.service"); err != nil {
			t.Error(err)
		}
		if b, err := purge(); err != nil {
			t.Fatalf("dpkg --purge: %v\n%s", err, b)
		}
		for _, f := range []string{"/usr/bin/mesh-controller", "/usr/lib/systemd/system/mesh-controller.service"} {
			if _, err := os.Lstat(f); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s is left after dpkg --purge (%v)", f, err)
			}
		}
	})
}

// matches reports whether a line of text matches pattern, where ".*"
// stands for anything on the line.
func matches(text, pattern string) bool {
	before, after, _ := strings.Cut(pattern, ".*")
	for _, line := range strings.SplitAfter(text, "\n") {
		if strings.HasPrefix(line, before) && strings.HasSuffix(line, after) {
			return true
		}
	}
	return false
}

// debFiles are a .deb's regular files by path, as dpkg-deb unpacks them.
func debFiles(t *testing.T, dpkgDeb, deb string) map[string][]byte {
	t.Helper()
	b, err := exec.Command(dpkgDeb, "--fsys-tarfile", deb).Output()
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for r := tar.NewReader(bytes.NewReader(b)); ; {
		h, err := r.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if files[h.Name], err = io.ReadAll(r); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestDebianVersion(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"v1.2.3", "1.2.3"},
		{"1.2.3", "1.2.3"},
		{"v0.2.0-80-g805452d", "0.2.0+80.g805452d"},
		{"v0.2.0-80-g805452d-dirty", "0.2.0+80.g805452d.dirty"},
		{"v1.2.3-dirty", "1.2.3+dirty"},
		{"v1.3.0-rc1", "1.3.0~rc1"},
		{"v1.3.0-rc.1-2-gabcdef0", "1.3.0~rc.1+2.gabcdef0"},
		{"v1.2.3+build5", "1.2.3+build5"},
		{"v1.2.3+build5-dirty", "1.2.3+build5.dirty"},
		{"805452d", "0.0.0+805452d"},
		{"805452d-dirty", "0.0.0+805452d.dirty"},
		{"v", "0.0.0"},
		{"next-1-gabcdef0", "0.0.0+next.1.gabcdef0"},
	} {
		if got := DebianVersion(c.in); got != c.want {
			t.Errorf("DebianVersion(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	// dpkg agrees on the order the mapping means to keep.
	dpkg, err := exec.LookPath("dpkg")
	if err != nil {
		return
	}
	ordered := []string{"805452d", "v1.2.3", "v1.2.3-4-gabcdef0", "v1.2.3-4-gabcdef0-dirty", "v1.3.0-rc1", "v1.3.0-rc1-2-gabcdef0", "v1.3.0"}
	for i := 1; i < len(ordered); i++ {
		a, b := DebianVersion(ordered[i-1]), DebianVersion(ordered[i])
		if err := exec.Command(dpkg, "--compare-versions", a, "lt", b).Run(); err != nil {
			t.Errorf("dpkg does not order %s (%s) before %s (%s)", a, ordered[i-1], b, ordered[i])
		}
	}
}

// Refused before anything is built: an unknown arch or package and a
// stray argument are usage errors (2); a version that is not one and a
// release directory already holding something are refusals (1).
func TestRun_Refusals(t *testing.T) {
	full := t.TempDir()
	if err := os.WriteFile(filepath.Join(full, "old.deb"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args   []string
		status int
		stderr string
	}{
		{[]string{"-arch", "sparc"}, 2, "release: -arch sparc: not one of amd64, arm64, see 'go run ./scripts/release -h'\n"},
		{[]string{"-package", "mesh-agent"}, 2, "release: -package mesh-agent: not one of mesh-controller, mesh-host, see 'go run ./scripts/release -h'\n"},
		{[]string{"dist"}, 2, "release: unexpected argument \"dist\", see 'go run ./scripts/release -h'\n"},
		{[]string{"-version", "1.2 beta", "-out", t.TempDir()}, 1, "release: version \"1.2 beta\" is not a version (letters, digits, . + ~ -): give one with VERSION=v1.2.3\n"},
		{[]string{"-version", "v1.2.3", "-out", full}, 1, "release: " + full + " is not empty: remove it (make release does) or give another -out\n"},
	} {
		var stdout, stderr bytes.Buffer
		if st := run(c.args, &stdout, &stderr); st != c.status || stderr.String() != c.stderr || stdout.Len() > 0 {
			t.Errorf("release %v: exit %d, stderr %q, stdout %q; want exit %d, stderr %q", c.args, st, stderr.String(), stdout.String(), c.status, c.stderr)
		}
	}
}
