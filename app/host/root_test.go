package host

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"filippo.io/age"

	"mesh-controller/app/host/roottest"
	"mesh-controller/app/protocol"
)

// attackedHost is a host with a root, and beside the root an "outside"
// directory the host must never write or delete in, whatever it is sent.
type attackedHost struct {
	t       *testing.T
	st      *State
	priv    ed25519.PrivateKey
	root    string
	outside string
	last    applied
	serial  int
	before  map[string]string
}

func newAttackedHost(t *testing.T) *attackedHost {
	t.Helper()
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	h := &attackedHost{t: t, st: &State{Node: "web1", ControllerKey: pub, Age: id}, priv: priv,
		root: filepath.Join(base, "root"), outside: filepath.Join(base, "outside")}
	// What an attack would overwrite or delete: a file, a data directory, a
	// module directory, a provider's consumer files.
	for rel, content := range map[string]string{
		"file":                               "outside, untouched",
		"victim/keep":                        "precious, outside",
		"victim/module.json":                 "not the host's",
		"victim/consumers/web2_wiki/keep":    "not the host's",
		"media/keep":                         "outside media",
		"etc/mesh/modules/a/module.json":     "outside, in a tree like the root's",
		"etc/mesh/modules/a/consumers/x/key": "outside",
	} {
		h.write(filepath.Join(h.outside, rel), content)
	}
	if err := os.MkdirAll(h.root, 0o755); err != nil {
		t.Fatal(err)
	}
	h.before = roottest.Tree(t, h.outside)
	return h
}

func (h *attackedHost) write(full, content string) {
	h.t.Helper()
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(full, []byte(content), 0o600); err != nil {
		h.t.Fatal(err)
	}
}

// plant makes rel beneath the root a symbolic link to target.
func (h *attackedHost) plant(rel, target string) {
	h.t.Helper()
	full := filepath.Join(h.root, rel)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		h.t.Fatal(err)
	}
	if err := os.RemoveAll(full); err != nil {
		h.t.Fatal(err)
	}
	if err := os.Symlink(target, full); err != nil {
		h.t.Fatal(err)
	}
}

// seal seals a value to this host as the controller would.
func (h *attackedHost) seal(l protocol.Label) string {
	h.t.Helper()
	s, err := protocol.SealSecret(protocol.NewSecret([]byte("s3cret "+l.Name)), l, h.st.Age.Recipient())
	if err != nil {
		h.t.Fatal(err)
	}
	return s
}

// send signs a declaration with the controller's key, as a controller
// would (the attacks are hostile bodies, correctly signed), and applies it.
func (h *attackedHost) send(body map[string]any) protocol.AppliedBody {
	h.t.Helper()
	h.serial++
	body["node"], body["serial"] = h.st.Node, h.serial
	report, next := apply(h.st, h.root, h.last, sealed(h.t, h.priv, body), nil, nil)
	if report.OK {
		h.last = next
	}
	return report
}

// outsideUntouched fails the test if anything outside the root changed.
func (h *attackedHost) outsideUntouched() {
	h.t.Helper()
	roottest.Unchanged(h.t, "outside the root, ", h.before, roottest.Tree(h.t, h.outside))
}

// refused fails the test unless the report refuses and says why.
func refused(t *testing.T, report protocol.AppliedBody, says string) {
	t.Helper()
	if report.OK || !strings.HasPrefix(report.Error, "refused: ") || !strings.Contains(report.Error, says) {
		t.Fatalf("want a refusal saying %q, got ok=%v %q", says, report.OK, report.Error)
	}
}

// mod is a declared module with its fields.
func mod(name string, fields map[string]any) map[string]any {
	m := map[string]any{"module": name, "version": "1.0.0"}
	for k, v := range fields {
		m[k] = v
	}
	return m
}

// Issue 11 item 4: correctly signed declarations whose names and paths
// would make the host write or delete outside its root are refused before
// any file is touched, beneath the root or outside it.
func TestApply_HostileDeclarationRefused(t *testing.T) {
	// up leaves the root from etc/mesh/modules/<m>/<dir>/ and enters outside.
	const up = "../../../../../../outside"
	cases := []struct {
		name string
		body func(h *attackedHost) map[string]any
		says string
	}{
		{"secret name leaves the root", func(h *attackedHost) map[string]any {
			name := up + "/pwned"
			return map[string]any{"modules": []any{mod("a", map[string]any{"secrets": []any{map[string]any{"name": name, "version": 1,
				"sealed": h.seal(protocol.Label{Node: "web1", Module: "a", Name: name, Version: 1})}}})}}
		}, `modules[0].secrets[0].name: "../../../../../../outside/pwned" is not a valid secret name`},
		{"secret name climbs", func(h *attackedHost) map[string]any {
			name := "../../../outside"
			return map[string]any{"modules": []any{mod("a", map[string]any{"secrets": []any{map[string]any{"name": name, "version": 1,
				"sealed": h.seal(protocol.Label{Node: "web1", Module: "a", Name: name, Version: 1})}}})}}
		}, "modules[0].secrets[0].name"},
		{"binding provision leaves the root", func(h *attackedHost) map[string]any {
			return map[string]any{"modules": []any{mod("a", map[string]any{"bindings": []any{map[string]any{"provision": up + "/pwned",
				"from": "db1/postgres", "credential_name": "consumer.web1.a.postgres",
				"credential": h.seal(protocol.Label{Node: "db1", Module: "postgres", Name: "consumer.web1.a.postgres"})}}})}}
		}, "modules[0].bindings[0].provision"},
		{"binding credential name with slashes", func(h *attackedHost) map[string]any {
			name := "consumer/../../" + up
			return map[string]any{"modules": []any{mod("a", map[string]any{"bindings": []any{map[string]any{"provision": "postgres",
				"from": "db1/postgres", "credential_name": name,
				"credential": h.seal(protocol.Label{Node: "db1", Module: "postgres", Name: name})}}})}}
		}, "modules[0].bindings[0].credential_name"},
		{"binding from a path", func(h *attackedHost) map[string]any {
			return map[string]any{"modules": []any{mod("a", map[string]any{"bindings": []any{map[string]any{"provision": "postgres", "from": "../.."}}})}}
		}, "modules[0].bindings[0].from"},
		{"consumer ../x", func(h *attackedHost) map[string]any {
			return map[string]any{"modules": []any{mod("a", map[string]any{"consumers": []any{map[string]any{"consumer": "../x",
				"provision": "postgres", "state": "active", "credential_name": "consumer.x.y.postgres",
				"credential": h.seal(protocol.Label{Node: "web1", Module: "a", Name: "consumer.x.y.postgres"})}}})}}
		}, `modules[0].consumers[0].consumer: "../x"`},
		{"consumer provision leaves the root", func(h *attackedHost) map[string]any {
			return map[string]any{"modules": []any{mod("a", map[string]any{"consumers": []any{map[string]any{"consumer": "web2/wiki",
				"provision": up + "/pwned", "state": "active", "credential_name": "consumer.web2.wiki.postgres",
				"credential": h.seal(protocol.Label{Node: "web1", Module: "a", Name: "consumer.web2.wiki.postgres"})}}})}}
		}, "modules[0].consumers[0].provision"},
		{"consumer deletion of a module outside", func(h *attackedHost) map[string]any {
			return map[string]any{"delete": []any{map[string]any{"module": "../../../../outside/victim", "kind": "consumer", "target": "web2/wiki"}}}
		}, "delete[0].module"},
		{"consumer deletion target ..", func(h *attackedHost) map[string]any {
			return map[string]any{"delete": []any{map[string]any{"module": "a", "kind": "consumer", "target": ".."}}}
		}, "delete[0].target"},
		{"data deletion target ../../victim", func(h *attackedHost) map[string]any {
			return map[string]any{"delete": []any{map[string]any{"module": "a", "kind": "data", "target": "../../victim", "path": "/srv/a"}}}
		}, "delete[0].target"},
		{"data deletion path /../../victim", func(h *attackedHost) map[string]any {
			return map[string]any{"delete": []any{map[string]any{"module": "a", "kind": "data", "target": "media", "path": "/../../victim"}}}
		}, "delete[0].path"},
		{"data deletion path relative", func(h *attackedHost) map[string]any {
			return map[string]any{"delete": []any{map[string]any{"module": "a", "kind": "data", "target": "media", "path": "../outside/victim"}}}
		}, "delete[0].path"},
		{"data deletion of the host's own files", func(h *attackedHost) map[string]any {
			return map[string]any{"delete": []any{map[string]any{"module": "a", "kind": "data", "target": "media", "path": "/etc/mesh"}}}
		}, "delete[0].path"},
		{"deletion of another kind", func(h *attackedHost) map[string]any {
			return map[string]any{"delete": []any{map[string]any{"module": "a", "kind": "everything", "target": "media"}}}
		}, "delete[0].kind"},
		{"data path climbs", func(h *attackedHost) map[string]any {
			return map[string]any{"modules": []any{module("a", "/srv/../../outside/made")}}
		}, "modules[0].data[0].path"},
		{"data path relative", func(h *attackedHost) map[string]any {
			return map[string]any{"modules": []any{module("a", up+"/made")}}
		}, "modules[0].data[0].path"},
		{"data path with //", func(h *attackedHost) map[string]any {
			return map[string]any{"modules": []any{module("a", "//outside/made")}}
		}, "modules[0].data[0].path"},
		{"data path in the host's own files", func(h *attackedHost) map[string]any {
			return map[string]any{"modules": []any{module("a", "/etc/mesh/modules/b")}}
		}, "modules[0].data[0].path"},
		{"module name climbs", func(h *attackedHost) map[string]any {
			return map[string]any{"modules": []any{module("../../../../outside/victim", "/srv/a")}}
		}, "modules[0].module"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newAttackedHost(t)
			report := h.send(c.body(h))
			refused(t, report, c.says)
			if h.last.Serial != 0 {
				t.Fatal("a refused declaration moved the applied serial")
			}
			h.outsideUntouched()
			if entries, _ := os.ReadDir(h.root); len(entries) != 0 {
				t.Fatalf("a refused declaration touched the root: %v", roottest.Tree(t, h.root))
			}
		})
	}

	t.Run("a long list of problems is cut short", func(t *testing.T) {
		h := newAttackedHost(t)
		var mods []any
		for range 30 {
			mods = append(mods, module("Bad", "/srv/x"))
		}
		report := h.send(map[string]any{"modules": mods})
		refused(t, report, "more)")
		if len(report.Error) > 4000 {
			t.Fatalf("the report carries %d bytes of problems", len(report.Error))
		}
	})
}

// Issue 11 item 5: links planted beneath the root (as a module running on
// the host could plant them) are never followed: a legitimate declaration
// refuses to write through them, a cleanup refuses to delete through them,
// and nothing outside the root changes.
func TestApply_PlantedLinksNotFollowed(t *testing.T) {
	// full is a legitimate module a: settings, a secret, a binding, a data set.
	full := func(h *attackedHost) map[string]any {
		return map[string]any{"modules": []any{mod("a", map[string]any{
			"settings": map[string]any{"workers": 2},
			"secrets": []any{map[string]any{"name": "admin_password", "version": 1,
				"sealed": h.seal(protocol.Label{Node: "web1", Module: "a", Name: "admin_password", Version: 1})}},
			"bindings": []any{map[string]any{"provision": "postgres", "from": "db1/postgres", "credential_name": "consumer.web1.a.postgres",
				"credential": h.seal(protocol.Label{Node: "db1", Module: "postgres", Name: "consumer.web1.a.postgres"})}},
			"data": []any{map[string]any{"name": "media", "path": "/var/lib/a/media", "precious": "irreplaceable"}},
		})}}
	}
	deleteMedia := map[string]any{"modules": []any{}, "delete": []any{
		map[string]any{"module": "a", "kind": "data", "target": "media", "path": "/var/lib/a/media"}}}

	t.Run("module directory is a link outside", func(t *testing.T) {
		h := newAttackedHost(t)
		h.plant("etc/mesh/modules/a", filepath.Join(h.outside, "victim"))
		refused(t, h.send(full(h)), "etc/mesh/modules/a is a symbolic link")
		h.outsideUntouched()
	})
	t.Run("a directory above the modules is a link outside", func(t *testing.T) {
		h := newAttackedHost(t)
		h.plant("etc", filepath.Join(h.outside, "etc"))
		refused(t, h.send(full(h)), "etc is a symbolic link")
		h.outsideUntouched()
	})
	t.Run("secrets directory is a link outside", func(t *testing.T) {
		h := newAttackedHost(t)
		h.plant("etc/mesh/modules/a/secrets", filepath.Join(h.outside, "victim"))
		refused(t, h.send(full(h)), "etc/mesh/modules/a/secrets is a symbolic link")
		h.outsideUntouched()
	})
	t.Run("secrets directory is a link inside the root", func(t *testing.T) {
		// os.Root would follow this one: it stays beneath the root.
		h := newAttackedHost(t)
		if err := os.MkdirAll(filepath.Join(h.root, "srv/readable"), 0o755); err != nil {
			t.Fatal(err)
		}
		h.plant("etc/mesh/modules/a/secrets", "../../../../srv/readable")
		refused(t, h.send(full(h)), "etc/mesh/modules/a/secrets is a symbolic link")
		if entries, _ := os.ReadDir(filepath.Join(h.root, "srv/readable")); len(entries) != 0 {
			t.Fatal("a secret was written through a link inside the root")
		}
	})
	t.Run("a file is a link outside", func(t *testing.T) {
		h := newAttackedHost(t)
		h.plant("etc/mesh/modules/a/secrets/admin_password", filepath.Join(h.outside, "file"))
		refused(t, h.send(full(h)), "etc/mesh/modules/a/secrets/admin_password is a symbolic link")
		h.outsideUntouched()
	})
	t.Run("the old temporary files are links outside", func(t *testing.T) {
		// The host once wrote <file>.tmp and renamed it; a link there made it
		// write a module's files and secrets outside. Its temporary files are
		// now made exclusively under random names, so these links are never
		// touched and the declaration applies.
		h := newAttackedHost(t)
		for _, rel := range []string{"module.json", "settings.json", "secrets/admin_password", "bindings/postgres.credential"} {
			h.plant("etc/mesh/modules/a/"+rel+".tmp", filepath.Join(h.outside, "file"))
		}
		if report := h.send(full(h)); !report.OK {
			t.Fatalf("a legitimate declaration was refused: %s", report.Error)
		}
		h.outsideUntouched()
		b, err := os.ReadFile(filepath.Join(h.root, "etc/mesh/modules/a/secrets/admin_password"))
		if err != nil || string(b) != "s3cret admin_password" {
			t.Fatalf("the secret: %q, %v", b, err)
		}
		if info, err := os.Lstat(filepath.Join(h.root, "etc/mesh/modules/a/module.json")); err != nil || !info.Mode().IsRegular() {
			t.Fatalf("module.json is not a regular file: %v", err)
		}
	})
	t.Run("data directory's parent is a link outside", func(t *testing.T) {
		h := newAttackedHost(t)
		h.plant("var/lib", filepath.Join(h.outside, "victim"))
		refused(t, h.send(full(h)), "var/lib is a symbolic link")
		h.outsideUntouched()
	})
	t.Run("cleanup delete through a link to outside data", func(t *testing.T) {
		h := newAttackedHost(t)
		if report := h.send(full(h)); !report.OK {
			t.Fatal(report.Error)
		}
		// var/lib/a now leads outside, where a media/ with a file waits.
		h.plant("var/lib/a", h.outside)
		if sets := dataReport(h.root, h.last).Sets; len(sets) != 1 || sets[0].Bytes != 0 {
			t.Fatalf("the data report measured through a link: %+v", sets)
		}
		refused(t, h.send(deleteMedia), "var/lib/a is a symbolic link")
		h.outsideUntouched()
	})
	t.Run("cleanup delete of a data directory that is a link", func(t *testing.T) {
		h := newAttackedHost(t)
		if report := h.send(full(h)); !report.OK {
			t.Fatal(report.Error)
		}
		h.plant("var/lib/a/media", filepath.Join(h.outside, "media"))
		refused(t, h.send(deleteMedia), "var/lib/a/media is a symbolic link")
		h.outsideUntouched()
		if _, err := os.Lstat(filepath.Join(h.root, "var/lib/a/media")); err != nil {
			t.Fatal("the refused deletion removed the link anyway")
		}
	})
	t.Run("cleanup delete removes links inside the data as links", func(t *testing.T) {
		h := newAttackedHost(t)
		if report := h.send(full(h)); !report.OK {
			t.Fatal(report.Error)
		}
		media := filepath.Join(h.root, "var/lib/a/media")
		h.write(filepath.Join(media, "scans/1.pdf"), "scan")
		h.plant("var/lib/a/media/scans/outside", h.outside)
		h.plant("var/lib/a/media/file", filepath.Join(h.outside, "file"))
		if report := h.send(deleteMedia); !report.OK {
			t.Fatal(report.Error)
		}
		if _, err := os.Lstat(media); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("the data set was not deleted: %v", err)
		}
		h.outsideUntouched()
	})
	t.Run("consumer deletion through a link", func(t *testing.T) {
		h := newAttackedHost(t)
		h.plant("etc/mesh/modules/a/consumers", filepath.Join(h.outside, "victim/consumers"))
		refused(t, h.send(map[string]any{"delete": []any{map[string]any{"module": "a", "kind": "consumer", "target": "web2/wiki"}}}),
			"etc/mesh/modules/a/consumers is a symbolic link")
		h.outsideUntouched()
	})
	t.Run("removing undeclared files through a link", func(t *testing.T) {
		h := newAttackedHost(t)
		if report := h.send(full(h)); !report.OK {
			t.Fatal(report.Error)
		}
		// module a's directory now leads outside, where a module.json waits.
		h.plant("etc/mesh/modules/a", filepath.Join(h.outside, "victim"))
		refused(t, h.send(map[string]any{"modules": []any{}}), "etc/mesh/modules/a is a symbolic link")
		h.outsideUntouched()
	})
	t.Run("an undeclared file that became a link is removed as a link", func(t *testing.T) {
		h := newAttackedHost(t)
		if report := h.send(full(h)); !report.OK {
			t.Fatal(report.Error)
		}
		h.plant("etc/mesh/modules/a/secrets/admin_password", filepath.Join(h.outside, "file"))
		if report := h.send(map[string]any{"modules": []any{}}); !report.OK {
			t.Fatal(report.Error)
		}
		h.outsideUntouched()
		if _, err := os.Lstat(filepath.Join(h.root, "etc/mesh/modules/a")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("the undeclared module's directory stayed: %v", err)
		}
	})
}

// The state dir is written the same way: a link at the old temporary name
// is never written through.
func TestWriteFile_Exclusive(t *testing.T) {
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	if err := os.WriteFile(outside, []byte("untouched"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "state")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, fileApplied+".tmp")); err != nil {
		t.Fatal(err)
	}
	if err := saveApplied(dir, applied{Serial: 7}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(outside); string(b) != "untouched" {
		t.Fatalf("written through the link: %q", b)
	}
	a, err := loadApplied(dir)
	if err != nil || a.Serial != 7 {
		t.Fatalf("got %+v, %v", a, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Fatalf("a temporary file was left: %v", entries)
	}
}

func TestRoot_Split(t *testing.T) {
	for _, rel := range []string{"", ".", "..", "/etc", "a/../b", "a//b", "a/./b", "a/", "../a", "a/..", "a\x00b"} {
		if _, err := split(rel); !errors.Is(err, ErrNotBeneath) {
			t.Errorf("split(%q): %v, want ErrNotBeneath", rel, err)
		}
	}
	if names, err := split("etc/mesh/modules/a"); err != nil || len(names) != 4 {
		t.Fatalf("got %q, %v", names, err)
	}
	r := root{dir: t.TempDir()}
	for _, op := range []func(string) error{
		func(rel string) error { return r.writeFile(rel, nil, 0o755) },
		func(rel string) error { return r.mkdirAll(rel, 0o755) },
		r.removeAll, r.removeFile, r.check,
	} {
		if err := op("../escape"); !errors.Is(err, ErrNotBeneath) {
			t.Errorf("../escape: %v, want ErrNotBeneath", err)
		}
	}
	if _, err := os.Lstat(filepath.Join(filepath.Dir(r.dir), "escape")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal("a path outside the root was made")
	}
}

// Each operation of the root refuses links by itself, not only the check
// apply makes first: a link swapped in after the check is refused too.
func TestRoot_RefusesLinks(t *testing.T) {
	h := newAttackedHost(t)
	r := root{dir: h.root}
	h.plant("a", filepath.Join(h.outside, "victim"))
	h.plant("b/c", filepath.Join(h.outside, "media"))
	for name, err := range map[string]error{
		"write through a link":       r.writeFile("a/new", []byte("x"), 0o755),
		"write over a link":          r.writeFile("b/c", []byte("x"), 0o755),
		"mkdir through a link":       r.mkdirAll("a/new/dir", 0o755),
		"mkdir at a link":            r.mkdirAll("b/c", 0o755),
		"remove through a link":      r.removeFile("a/module.json"),
		"remove all through a link":  r.removeAll("a/consumers"),
		"remove all at a link":       r.removeAll("b/c"),
		"remove a dir through links": r.removeEmptyDir("a/consumers/web2_wiki"),
	} {
		if !errors.Is(err, ErrSymlink) {
			t.Errorf("%s: %v, want ErrSymlink", name, err)
		}
	}
	if n := r.size("b/c"); n != 0 {
		t.Errorf("measured %d bytes through a link", n)
	}
	h.outsideUntouched()
}

// A host that applied a hostile declaration before names were judged
// remembers a file outside its root; it neither removes that file nor
// refuses every later declaration because of it.
func TestApply_RememberedFileOutsideLeftAlone(t *testing.T) {
	h := newAttackedHost(t)
	h.last = applied{Serial: 1, Files: []string{"../outside/file", "etc/mesh/modules/a/../../../../outside/file", "/etc/passwd"}}
	h.serial = 1
	if report := h.send(map[string]any{"modules": []any{module("b", "/srv/b")}}); !report.OK {
		t.Fatal(report.Error)
	}
	h.outsideUntouched()
	for _, f := range h.last.Files {
		if !strings.HasPrefix(f, protocol.ModulesDir+"/b/") {
			t.Fatalf("still remembered: %q", f)
		}
	}
}

// A restore's scratch goes in the nearest directory above the data set
// that is the host's alone: not one a module owns or may write in.
func TestRoot_HostsOwn(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give a directory away")
	}
	dir := t.TempDir()
	r := root{dir: dir}
	for _, rel := range []string{"var/lib/x/sub/deeper", "var/lib/open/sub"} {
		if err := r.mkdirAll(rel, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chown(filepath.Join(dir, "var/lib/x"), 65534, 65534)
	os.Chmod(filepath.Join(dir, "var/lib/open"), 0o777)
	// var/lib/x/sub is the host's, but beneath a module's directory.
	for rel, want := range map[string]string{"var/lib/db": "var/lib", "var/lib/x/sub": "var/lib", "var/lib/x/sub/deeper/d": "var/lib",
		"var/lib/open/sub": "var/lib", "db": "."} {
		if got, err := r.hostsOwn(rel); err != nil || got != want {
			t.Errorf("hostsOwn(%s) = %q, %v; want %q", rel, got, err, want)
		}
	}
}
