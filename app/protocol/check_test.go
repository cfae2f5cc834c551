package protocol

import (
	"fmt"
	"strings"
	"testing"
)

// good is a declaration with one of everything, and no problem.
func good() Declaration {
	return Declaration{
		Node: "web1",
		Mode: "converged",
		Modules: []DeclaredModule{{
			Module:  "paperless",
			Version: "2.14.1",
			Data: []DeclaredData{
				{Name: "media", Path: "/var/lib/paperless/media", Precious: "irreplaceable"},
				{Name: "cache", Path: "/var/cache/paperless", Precious: "rebuildable"},
			},
			Secrets:    []DeclaredSecret{{Name: "admin_password", Version: 1, Sealed: "x"}},
			Bindings:   []DeclaredBinding{{Provision: "postgres", From: "db1/postgres", CredentialName: "consumer.web1.paperless.postgres"}},
			WaitingFor: []string{"ocr_licence"},
			Prepare:    &Prepare{Command: []string{"bin/migrate"}, Timeout: "10m"},
		}, {
			Module:    "postgres",
			Version:   "16.2.0-rc.1+debian",
			Consumers: []DeclaredConsumer{{Consumer: "web2/wiki", Provision: "postgres", State: "active", CredentialName: "consumer.web2.wiki.postgres"}},
		}},
		Delete: []DeclaredDeletion{
			{Module: "old", Kind: "data", Target: "media", Path: "/var/lib/old/media"},
			{Module: "postgres", Kind: "consumer", Target: "web3/gone"},
		},
		Host: &DeclaredHost{Version: "v0.3.1-4-gabc1234-dirty", Archive: &Archive{Digest: strings.Repeat("ab", 32), Bytes: 10 << 20}},
		Taken: []DeclaredTake{{Digest: "0123456789abcdef", Module: "postgres", Units: []string{"postgresql@16-main.service"},
			Processes: []TakeProcess{{Pid: 412, Command: "postgres"}}}},
	}
}

func TestDeclaration_Problems(t *testing.T) {
	if ps := good().Problems(); len(ps) != 0 {
		t.Fatalf("a good declaration has problems: %q", ps)
	}
	if ps := (Declaration{Node: "web1"}).Problems(); len(ps) != 0 {
		t.Fatalf("an empty declaration has problems: %q", ps)
	}

	// Each case breaks one thing of a good declaration; the problem must
	// name the field and say what is wrong with it.
	cases := []struct {
		name   string
		change func(d *Declaration)
		field  string
		says   string
	}{
		{"node missing", func(d *Declaration) { d.Node = "" }, "node", "missing"},
		{"node invalid", func(d *Declaration) { d.Node = "Web1" }, "node", "not a valid name"},
		{"node path", func(d *Declaration) { d.Node = "../web1" }, "node", "not a valid name"},
		{"mode", func(d *Declaration) { d.Mode = "owned" }, "mode", "not adopted or converged"},
		{"host version missing", func(d *Declaration) { d.Host = &DeclaredHost{} }, "host.version", "not a host version"},
		{"host version with a line break", func(d *Declaration) { d.Host = &DeclaredHost{Version: "v1\nv2"} }, "host.version", "not a host version"},
		{"host archive digest", func(d *Declaration) {
			d.Host = &DeclaredHost{Version: "v0.3.1", Archive: &Archive{Digest: "../x", Bytes: 1}}
		}, "host.archive.digest", "not a sha256"},
		{"take of a module not declared", func(d *Declaration) { d.Taken[0].Module = "mysql" }, "taken[0].module", "not a module declared here"},
		{"take of an option", func(d *Declaration) { d.Taken[0].Units[0] = "--all.service" }, "taken[0].units[0]", "not a service unit's name"},
		{"take of a timer", func(d *Declaration) { d.Taken[0].Units[0] = "backup.timer" }, "taken[0].units[0]", "not a service unit's name"},
		{"take of init", func(d *Declaration) { d.Taken[0].Processes[0].Pid = 1 }, "taken[0].processes[0]", "not a process a take may stop"},
		{"take without a command", func(d *Declaration) { d.Taken[0].Processes[0].Command = "" }, "taken[0].processes[0]", "not a process a take may stop"},
		{"module missing", func(d *Declaration) { d.Modules[0].Module = "" }, "modules[0].module", "missing"},
		{"module path", func(d *Declaration) { d.Modules[0].Module = "../../etc" }, "modules[0].module", "not a valid name"},
		{"module slash", func(d *Declaration) { d.Modules[0].Module = "a/b" }, "modules[0].module", "not a valid name"},
		{"module too long", func(d *Declaration) { d.Modules[0].Module = "a" + strings.Repeat("b", 63) }, "modules[0].module", "not a valid name"},
		{"module twice", func(d *Declaration) { d.Modules[1].Module = "paperless" }, "modules[1].module", "declared twice (also modules[0])"},
		{"prepare without a command", func(d *Declaration) { d.Modules[0].Prepare.Command = nil }, "modules[0].prepare.command", "missing"},
		{"prepare of an empty program", func(d *Declaration) { d.Modules[0].Prepare.Command = []string{""} }, "modules[0].prepare.command[0]", "is empty"},
		{"prepare for a week", func(d *Declaration) { d.Modules[0].Prepare.Timeout = "168h" }, "modules[0].prepare.timeout", `"168h" is not a duration in [1s, 24h0m0s]`},
		{"prepare timeout not a duration", func(d *Declaration) { d.Modules[0].Prepare.Timeout = "soon" }, "modules[0].prepare.timeout", "not a duration"},
		{"version missing", func(d *Declaration) { d.Modules[0].Version = "" }, "modules[0].version", "missing"},
		{"version with v", func(d *Declaration) { d.Modules[0].Version = "v2.14.1" }, "modules[0].version", "not a semantic version"},
		{"version short", func(d *Declaration) { d.Modules[0].Version = "2.14" }, "modules[0].version", "not a semantic version"},
		{"version leading zero", func(d *Declaration) { d.Modules[0].Version = "02.14.1" }, "modules[0].version", "not a semantic version"},
		{"version words", func(d *Declaration) { d.Modules[0].Version = "latest" }, "modules[0].version", "not a semantic version"},
		{"data name missing", func(d *Declaration) { d.Modules[0].Data[1].Name = "" }, "modules[0].data[1].name", "missing"},
		{"data name path", func(d *Declaration) { d.Modules[0].Data[1].Name = "../x" }, "modules[0].data[1].name", "not a valid name"},
		{"data name twice", func(d *Declaration) { d.Modules[0].Data[1].Name = "media" }, "modules[0].data[1].name", "named twice"},
		{"data path missing", func(d *Declaration) { d.Modules[0].Data[1].Path = "" }, "modules[0].data[1].path", "missing"},
		{"data path relative", func(d *Declaration) { d.Modules[0].Data[1].Path = "../../etc" }, "modules[0].data[1].path", `"../../etc" must be absolute and clean`},
		{"data path dotdot", func(d *Declaration) { d.Modules[0].Data[1].Path = "/var/../../etc" }, "modules[0].data[1].path", "must be absolute and clean"},
		{"data path dot", func(d *Declaration) { d.Modules[0].Data[1].Path = "/var/./x" }, "modules[0].data[1].path", "must be absolute and clean"},
		{"data path double slash", func(d *Declaration) { d.Modules[0].Data[1].Path = "//var/x" }, "modules[0].data[1].path", "must be absolute and clean"},
		{"data path trailing slash", func(d *Declaration) { d.Modules[0].Data[1].Path = "/var/x/" }, "modules[0].data[1].path", "must be absolute and clean"},
		{"data path root", func(d *Declaration) { d.Modules[0].Data[1].Path = "/" }, "modules[0].data[1].path", "must be absolute and clean"},
		{"data path nul", func(d *Declaration) { d.Modules[0].Data[1].Path = "/var/x\x00y" }, "modules[0].data[1].path", "must be absolute and clean"},
		{"data path host's own", func(d *Declaration) { d.Modules[0].Data[1].Path = "/etc/mesh/modules/postgres" }, "modules[0].data[1].path", "overlaps /etc/mesh"},
		{"data path above host's own", func(d *Declaration) { d.Modules[0].Data[1].Path = "/etc" }, "modules[0].data[1].path", "overlaps /etc/mesh"},
		{"data path twice", func(d *Declaration) { d.Modules[0].Data[1].Path = "/var/lib/paperless/media" }, "modules[0].data[1].path", "used twice"},
		{"precious missing", func(d *Declaration) { d.Modules[0].Data[0].Precious = "" }, "modules[0].data[0].precious", "not irreplaceable, costly or rebuildable"},
		{"precious other", func(d *Declaration) { d.Modules[0].Data[0].Precious = "priceless" }, "modules[0].data[0].precious", "not irreplaceable, costly or rebuildable"},
		{"secret missing", func(d *Declaration) { d.Modules[0].Secrets[0].Name = "" }, "modules[0].secrets[0].name", "missing"},
		{"secret path", func(d *Declaration) { d.Modules[0].Secrets[0].Name = "../../../outside" }, "modules[0].secrets[0].name", "not a valid secret name"},
		{"secret slash", func(d *Declaration) { d.Modules[0].Secrets[0].Name = "a/b" }, "modules[0].secrets[0].name", "not a valid secret name"},
		{"secret dot", func(d *Declaration) { d.Modules[0].Secrets[0].Name = "a.tmp" }, "modules[0].secrets[0].name", "not a valid secret name"},
		{"secret twice", func(d *Declaration) {
			d.Modules[0].Secrets = append(d.Modules[0].Secrets, DeclaredSecret{Name: "admin_password"})
		}, "modules[0].secrets[1].name", "named twice"},
		{"managed licence path", func(d *Declaration) {
			d.Modules[0].Manages = []DeclaredLicence{{Name: "../x", Version: 1, Sealed: "x"}}
		}, "modules[0].manages[0].name", "not a valid name"},
		{"managed licence twice", func(d *Declaration) {
			d.Modules[0].Manages = []DeclaredLicence{{Name: "chat", Version: 1, Sealed: "x"}, {Name: "chat", Version: 1, Sealed: "y"}}
		}, "modules[0].manages[1].name", "named twice"},
		{"binding provision path", func(d *Declaration) { d.Modules[0].Bindings[0].Provision = "../x" }, "modules[0].bindings[0].provision", "not a valid name"},
		{"binding provision missing", func(d *Declaration) { d.Modules[0].Bindings[0].Provision = "" }, "modules[0].bindings[0].provision", "missing"},
		{"binding twice", func(d *Declaration) {
			d.Modules[0].Bindings = append(d.Modules[0].Bindings, DeclaredBinding{Provision: "postgres", From: "db2/postgres"})
		}, "modules[0].bindings[1].provision", "bound twice"},
		{"binding from one name", func(d *Declaration) { d.Modules[0].Bindings[0].From = "db1" }, "modules[0].bindings[0].from", "not node/module"},
		{"binding from three names", func(d *Declaration) { d.Modules[0].Bindings[0].From = "db1/postgres/x" }, "modules[0].bindings[0].from", "not node/module"},
		{"binding from path", func(d *Declaration) { d.Modules[0].Bindings[0].From = "../.." }, "modules[0].bindings[0].from", "not node/module"},
		{"binding credential slash", func(d *Declaration) { d.Modules[0].Bindings[0].CredentialName = "consumer/../../x" }, "modules[0].bindings[0].credential_name", "not a valid credential name"},
		{"binding credential dotdot", func(d *Declaration) { d.Modules[0].Bindings[0].CredentialName = "consumer..x" }, "modules[0].bindings[0].credential_name", "not a valid credential name"},
		{"binding credential leading dot", func(d *Declaration) { d.Modules[0].Bindings[0].CredentialName = ".x" }, "modules[0].bindings[0].credential_name", "not a valid credential name"},
		{"binding credential too long", func(d *Declaration) { d.Modules[0].Bindings[0].CredentialName = strings.Repeat("a", 256) }, "modules[0].bindings[0].credential_name", "not a valid credential name"},
		{"consumer path", func(d *Declaration) { d.Modules[1].Consumers[0].Consumer = "../x" }, "modules[1].consumers[0].consumer", "not node/module"},
		{"consumer no module", func(d *Declaration) { d.Modules[1].Consumers[0].Consumer = "web2" }, "modules[1].consumers[0].consumer", "not node/module"},
		{"consumer provision", func(d *Declaration) { d.Modules[1].Consumers[0].Provision = "a/b" }, "modules[1].consumers[0].provision", "not a valid name"},
		{"consumer credential", func(d *Declaration) { d.Modules[1].Consumers[0].CredentialName = "a/b" }, "modules[1].consumers[0].credential_name", "not a valid credential name"},
		{"consumer twice", func(d *Declaration) {
			d.Modules[1].Consumers = append(d.Modules[1].Consumers, d.Modules[1].Consumers[0])
		}, "modules[1].consumers[1]", "listed twice"},
		{"waiting for", func(d *Declaration) { d.Modules[0].WaitingFor[0] = "../x" }, "modules[0].waiting_for[0]", "not a valid secret name"},
		{"deletion kind", func(d *Declaration) { d.Delete[0].Kind = "everything" }, "delete[0].kind", "not data or consumer"},
		{"deletion module", func(d *Declaration) { d.Delete[0].Module = "../x" }, "delete[0].module", "not a valid name"},
		{"deletion data target", func(d *Declaration) { d.Delete[0].Target = "../../victim" }, "delete[0].target", "not a valid name"},
		{"deletion data path missing", func(d *Declaration) { d.Delete[0].Path = "" }, "delete[0].path", "missing"},
		{"deletion data path", func(d *Declaration) { d.Delete[0].Path = "/../../victim" }, "delete[0].path", "must be absolute and clean"},
		{"deletion data path relative", func(d *Declaration) { d.Delete[0].Path = "victim" }, "delete[0].path", "must be absolute and clean"},
		{"deletion data path root", func(d *Declaration) { d.Delete[0].Path = "/" }, "delete[0].path", "must be absolute and clean"},
		{"deletion data path host's own", func(d *Declaration) { d.Delete[0].Path = "/etc/mesh" }, "delete[0].path", "overlaps /etc/mesh"},
		{"deletion consumer target", func(d *Declaration) { d.Delete[1].Target = "../x" }, "delete[1].target", "not node/module"},
		{"deletion consumer target one name", func(d *Declaration) { d.Delete[1].Target = "web3" }, "delete[1].target", "not node/module"},
		{"too many modules", func(d *Declaration) {
			for i := range MaxModules + 1 {
				d.Modules = append(d.Modules, DeclaredModule{Module: fmt.Sprintf("m%d", i), Version: "1.0.0"})
			}
		}, "modules", fmt.Sprintf("at most %d", MaxModules)},
		{"too many data sets", func(d *Declaration) {
			for i := range MaxDataSets + 1 {
				d.Modules[1].Data = append(d.Modules[1].Data, DeclaredData{Name: fmt.Sprintf("d%d", i), Path: fmt.Sprintf("/srv/%d", i), Precious: "costly"})
			}
		}, "modules[1].data", fmt.Sprintf("at most %d", MaxDataSets)},
		{"too many secrets", func(d *Declaration) {
			for i := range MaxSecrets + 1 {
				d.Modules[1].Secrets = append(d.Modules[1].Secrets, DeclaredSecret{Name: fmt.Sprintf("s%d", i)})
			}
		}, "modules[1].secrets", fmt.Sprintf("at most %d", MaxSecrets)},
		{"too many bindings", func(d *Declaration) {
			for i := range MaxBindings + 1 {
				d.Modules[1].Bindings = append(d.Modules[1].Bindings, DeclaredBinding{Provision: fmt.Sprintf("p%d", i), From: "a/b"})
			}
		}, "modules[1].bindings", fmt.Sprintf("at most %d", MaxBindings)},
		{"too many consumers", func(d *Declaration) {
			for i := range MaxConsumers + 1 {
				d.Modules[1].Consumers = append(d.Modules[1].Consumers, DeclaredConsumer{Consumer: fmt.Sprintf("n%d/m", i), Provision: "postgres"})
			}
		}, "modules[1].consumers", fmt.Sprintf("at most %d", MaxConsumers)},
		{"too many waiting", func(d *Declaration) {
			for i := range MaxWaitingFor + 1 {
				d.Modules[1].WaitingFor = append(d.Modules[1].WaitingFor, fmt.Sprintf("s%d", i))
			}
		}, "modules[1].waiting_for", fmt.Sprintf("at most %d", MaxWaitingFor)},
		{"too many deletions", func(d *Declaration) {
			for range MaxDeletions + 1 {
				d.Delete = append(d.Delete, DeclaredDeletion{Module: "old", Kind: "consumer", Target: "a/b"})
			}
		}, "delete", fmt.Sprintf("at most %d", MaxDeletions)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := good()
			c.change(&d)
			ps := d.Problems()
			for _, p := range ps {
				if strings.HasPrefix(p, c.field+": ") && strings.Contains(p, c.says) {
					return
				}
			}
			t.Fatalf("want a problem %q saying %q, got %q", c.field, c.says, ps)
		})
	}

	t.Run("every problem listed", func(t *testing.T) {
		d := good()
		d.Node, d.Modules[0].Secrets[0].Name, d.Delete[0].Path = "", "../x", "x"
		if ps := d.Problems(); len(ps) != 3 {
			t.Fatalf("want 3 problems, got %q", ps)
		}
	})
	t.Run("the message", func(t *testing.T) {
		d := good()
		d.Modules[0].Data[1].Path = "../../etc"
		ps := d.Problems()
		if want := `modules[0].data[1].path: "../../etc" must be absolute and clean, below /`; len(ps) != 1 || ps[0] != want {
			t.Fatalf("got %q, want %q", ps, want)
		}
	})
}

func TestValidNames(t *testing.T) {
	for _, c := range []struct {
		check func(string) bool
		name  string
		good  []string
		bad   []string
	}{
		{ValidName, "ValidName", []string{"a", "web-1", "a" + strings.Repeat("b", 62)},
			[]string{"", "1a", "-a", "A", "a_b", "a.b", "a/b", "..", "a b", "a" + strings.Repeat("b", 63)}},
		{ValidSecretName, "ValidSecretName", []string{"admin_password", "ocr-licence", "a"},
			[]string{"", "_a", "a/b", "a.b", "..", "A"}},
		{ValidCredentialName, "ValidCredentialName", []string{"consumer.web1.paperless.postgres", "consumer.web_1.a-b.C"},
			[]string{"", "a..b", ".a", "a.", "a/b", "../x", "a b"}},
		{ValidVersion, "ValidVersion", []string{"1.0.0", "2.14.1", "0.0.1-rc.1", "1.2.3+build.5", "1.2.3-beta+exp.sha.5114f85"},
			[]string{"", "v1.0.0", "1", "1.2", "1.2.3.4", "01.2.3", "1.2.3-", "x.y.z"}},
		{ValidDataPath, "ValidDataPath", []string{"/srv", "/var/lib/x"},
			[]string{"", "/", "srv", "/srv/", "/srv/../etc", "/srv/.", "//srv"}},
	} {
		for _, s := range c.good {
			if !c.check(s) {
				t.Errorf("%s(%q) = false, want true", c.name, s)
			}
		}
		for _, s := range c.bad {
			if c.check(s) {
				t.Errorf("%s(%q) = true, want false", c.name, s)
			}
		}
	}
}

// How a module is run is judged like every other field: a host execs no
// empty program and lets no declared variable override its own.
func TestProblems_Run(t *testing.T) {
	d := Declaration{Node: "web1", Modules: []DeclaredModule{{Module: "hello", Version: "1.0.0", MemoryMB: -1,
		Run: &Run{Command: []string{""}, Env: map[string]string{"MESH_NODE": "x", "PATH": "/tmp", "a b": "c"}, StopGrace: "forever",
			Ready: &Ready{Port: "http", After: "1s"}}}}}
	got := strings.Join(d.Problems(), "\n")
	for _, w := range []string{
		"modules[0].run.command[0]: is empty",
		"modules[0].run.env.MESH_NODE: is set by the host",
		"modules[0].run.env.PATH: is set by the host",
		"modules[0].run.env.a b: not a valid variable name",
		`modules[0].run.stop_grace: "forever" is not a duration`,
		"modules[0].run.ready: exactly one of after, command or port, not 2",
		`modules[0].run.ready.port: "http" is not a declared port`,
		"modules[0].memory_mb: must not be negative",
	} {
		if !strings.Contains(got, w) {
			t.Errorf("missing %q in:\n%s", w, got)
		}
	}
}

// An archive's unpacked size is judged with its digest and size: 0 is an
// archive from before it was kept, past MaxUnpackedBytes or negative is
// a problem.
func TestProblems_ArchiveUnpackedBytes(t *testing.T) {
	digest := strings.Repeat("ab", 32)
	for _, c := range []struct {
		unpacked int64
		bad      bool
	}{{0, false}, {1, false}, {MaxUnpackedBytes, false}, {-1, true}, {MaxUnpackedBytes + 1, true}} {
		d := Declaration{Node: "web1", Modules: []DeclaredModule{{Module: "m", Version: "1.0.0",
			Archive: &Archive{Digest: digest, Bytes: 1, UnpackedBytes: c.unpacked}}}}
		got := strings.Join(d.Problems(), "; ")
		if strings.Contains(got, "modules[0].archive.unpacked_bytes: ") != c.bad {
			t.Errorf("unpacked_bytes %d: problems %q", c.unpacked, got)
		}
	}
}

// A data set may not be or hold the directory its host writes module logs
// into as root.
func TestProblems_DataOverlapsLogs(t *testing.T) {
	for _, p := range []string{"/var/log/mesh", "/var/log/mesh/x", "/var/log", "/var"} {
		d := Declaration{Node: "web1", Modules: []DeclaredModule{{Module: "m", Version: "1.0.0", Data: []DeclaredData{{Name: "d", Path: p, Precious: "rebuildable"}}}}}
		if got := strings.Join(d.Problems(), "; "); !strings.Contains(got, "where the host keeps its modules' logs") {
			t.Errorf("%s: %q", p, got)
		}
	}
}
