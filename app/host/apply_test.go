package host

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"mesh-controller/app/protocol"
)

func sealed(t *testing.T, priv ed25519.PrivateKey, body map[string]any) protocol.Envelope {
	t.Helper()
	env, err := protocol.SealBody(body, func(b []byte) []byte { return ed25519.Sign(priv, b) }, "k")
	if err != nil {
		t.Fatal(err)
	}
	return env
}

func module(name, dataPath string) map[string]any {
	return map[string]any{"module": name, "version": "1.0.0", "data": []any{map[string]any{"name": "d", "path": dataPath, "precious": "costly"}}}
}

func TestApply(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	st := &State{Node: "web1", ControllerKey: pub}
	root := t.TempDir()
	decl := func(serial int, node string, mods ...any) protocol.Envelope {
		return sealed(t, priv, map[string]any{"node": node, "serial": serial, "modules": mods})
	}
	report, last := apply(st, root, applied{}, decl(1, "web1", module("a", "/srv/a")), nil, nil)
	if !report.OK || last.Serial != 1 {
		t.Fatalf("first: %+v", report)
	}
	refusals := map[string]protocol.Envelope{
		"is for node":                        decl(2, "web2", module("a", "/srv/a")),
		"not above the last applied 1":       decl(1, "web1"),
		"must be absolute and clean":         decl(2, "web1", module("a", "/srv/../etc")),
		`modules[0].module: "A/../b" is not`: decl(2, "web1", module("A/../b", "/srv/a")),
		"must be absolute and clean\x00":     decl(2, "web1", module("a", "relative/path")),
	}
	for want, env := range refusals {
		report, after := apply(st, root, last, env, nil, nil)
		if report.OK || !strings.Contains(report.Error, strings.TrimSuffix(want, "\x00")) || after.Serial != 1 {
			t.Errorf("want refusal %q, got %+v", want, report)
		}
	}
	// data is never removed, even when no longer declared
	if err := os.WriteFile(filepath.Join(root, "srv/a/keep"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	report, last = apply(st, root, last, decl(2, "web1"), nil, nil)
	if !report.OK || len(last.Files) != 0 {
		t.Fatalf("second: %+v %+v", report, last)
	}
	if _, err := os.Stat(filepath.Join(root, "srv/a/keep")); err != nil {
		t.Fatal("data was removed")
	}
	if _, err := os.Stat(filepath.Join(root, protocol.ModulesDir, "a")); !os.IsNotExist(err) {
		t.Fatal("an undeclared module's directory stayed")
	}
}

// The answer to the ask made on connecting, when a push of the same
// declaration or a newer one crossed it, is not applied or reported as a
// refusal; nor is the applied declaration pushed again exactly as signed
// (a healer re-sending it while its report was on the way). Anything else
// pushed, unsigned or for another node is left for apply to refuse and
// report.
func TestStale(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	st := &State{Node: "web1", ControllerKey: pub}
	decl := func(key ed25519.PrivateKey, serial int, node string) protocol.Envelope {
		return sealed(t, key, map[string]any{"node": node, "serial": serial, "modules": []any{}})
	}
	last := applied{Serial: 3, Signature: decl(priv, 3, "web1").Signature}
	for _, c := range []struct {
		name  string
		dl    delivery
		stale bool
	}{
		{"the applied one, pushed again", delivery{env: decl(priv, 3, "web1")}, true},
		{"another declaration of the applied serial, pushed", delivery{env: sealed(t, priv, map[string]any{"node": "web1", "serial": 3, "modules": []any{}, "issued_at": "2026-01-01T00:00:00Z"})}, false},
		{"the applied one, asked for", delivery{env: decl(priv, 3, "web1"), asked: true}, true},
		{"an older one, asked for", delivery{env: decl(priv, 2, "web1"), asked: true}, true},
		{"an older one, pushed", delivery{env: decl(priv, 2, "web1")}, false},
		{"a newer one", delivery{env: decl(priv, 4, "web1")}, false},
		{"the applied serial, signed by another key", delivery{env: decl(other, 3, "web1"), asked: true}, false},
		{"the applied serial, for another node", delivery{env: decl(priv, 3, "web2"), asked: true}, false},
	} {
		if got := stale(st, last, c.dl) != ""; got != c.stale {
			t.Errorf("%s: stale %v, want %v", c.name, got, c.stale)
		}
	}
}

// Only data directories beneath the places a host gives modules may be a
// module's; /root/.ssh made for one stays the host's.
func TestGivable(t *testing.T) {
	for p, want := range map[string]bool{"/var/lib/x": true, "/srv/x": true, "/var/log/x": true, "/root/.ssh": false, "/etc/cron.d": false,
		"/var/libx": false, "/usr/local/bin": false, "/var/lib": false} {
		if givable(p) != want {
			t.Errorf("givable(%s) = %v", p, !want)
		}
	}
}

// The backup seat's holder is given the declaration's backup lines in its
// lines file (a BackupLines document, its module's alone to read), named
// in its environment with its ports (MESH_PORT_<NAME>); lines that change
// alone rewrite the file and leave the module running; a module that no
// longer holds the seat loses the file.
func TestApply_BackupLines(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	st := &State{Node: "h1", ControllerKey: pub, BrokerURLs: []string{"nats://127.0.0.1:4222"}}
	root := t.TempDir()
	decl := func(serial int, seats []any, lines ...protocol.BackupLine) protocol.Envelope {
		return sealed(t, priv, map[string]any{"node": "h1", "serial": serial, "backup_lines": lines, "modules": []any{map[string]any{
			"module": "backup", "version": "1.0.0", "seats": seats, "holds_backup": len(seats) > 0,
			"ports": []any{map[string]any{"name": "rest", "port": 8420}, map[string]any{"name": "metrics-http", "port": 9100}},
			"run":   map[string]any{"command": []any{"sh", "-c", "env > env.txt; exec sleep 1000"}, "ready": map[string]any{"after": "100ms"}}}}})
	}
	at := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	one := protocol.BackupLine{Node: "n1", Module: "db", Data: "main", Path: "/var/lib/db", Cadence: "daily", Precious: "irreplaceable", Keep: protocol.DefaultRetention, Recipient: "age1x"}
	two := one
	two.LastBackup = &at
	dir := filepath.Join(root, protocol.ModulesDir, "backup")
	file := filepath.Join(dir, protocol.BackupLinesName)
	read := func() protocol.BackupLines {
		t.Helper()
		var l protocol.BackupLines
		b, err := os.ReadFile(file)
		if err == nil {
			err = json.Unmarshal(b, &l)
		}
		if err != nil {
			t.Fatalf("the lines file: %v", err)
		}
		return l
	}
	// Modules as their own users: the file is their group's to read.
	const nogroup = 65534
	ids := func(string) (int, int, error) { return nogroup, nogroup, nil }
	report, last := apply(st, root, applied{}, decl(1, []any{"backup"}, one), ids, nil)
	if !report.OK {
		t.Fatal(report.Error)
	}
	if l := read(); len(l.Lines) != 1 || l.Lines[0] != one {
		t.Fatalf("lines %+v", l)
	}
	var fst syscall.Stat_t
	if err := syscall.Stat(file, &fst); err != nil || fst.Mode&0o777 != 0o640 || fst.Gid != nogroup {
		t.Fatalf("the lines file is %o, group %d: %v", fst.Mode&0o777, fst.Gid, err)
	}
	if !slices.Contains(last.Files, path.Join(protocol.ModulesDir, "backup", protocol.BackupLinesName)) {
		t.Fatalf("the lines file is not remembered: %v", last.Files)
	}

	sup, _ := newSup(t)
	sup.Apply(specs(st, root, last.Runs))
	first := waitState(t, sup, "backup", protocol.StateReady)
	// Ready says the process runs, not that it has written its environment.
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		env, _ := os.ReadFile(filepath.Join(dir, "env.txt"))
		for _, want := range []string{protocol.BackupLinesEnv + "=" + file, "MESH_PORT_REST=8420", "MESH_PORT_METRICS_HTTP=9100"} {
			if !strings.Contains(string(env), want+"\n") {
				return fmt.Errorf("the module's environment has no %s:\n%s", want, env)
			}
		}
		return nil
	})

	report, last = apply(st, root, last, decl(2, []any{"backup"}, two), ids, nil)
	if !report.OK {
		t.Fatal(report.Error)
	}
	sup.Apply(specs(st, root, last.Runs))
	if l := read(); len(l.Lines) != 1 || l.Lines[0].LastBackup == nil || !l.Lines[0].LastBackup.Equal(at) {
		t.Fatalf("lines after: %+v", l)
	}
	if st, _ := stateOf(sup, "backup"); st.Pid != first.Pid || st.Serial != 1 {
		t.Fatalf("new lines restarted the module: %+v, before %+v", st, first)
	}

	// No lines: an empty list, not null.
	report, last = apply(st, root, last, decl(3, []any{"backup"}), ids, nil)
	if b, _ := os.ReadFile(file); !report.OK || !strings.Contains(string(b), `"lines": []`) {
		t.Fatalf("no lines: %s %s", b, report.Error)
	}
	report, last = apply(st, root, last, decl(4, nil), ids, nil)
	if _, err := os.Stat(file); !report.OK || !os.IsNotExist(err) {
		t.Fatalf("the seat gone, the file stays: %v %s", err, report.Error)
	}
	if sp := specs(st, root, last.Runs); slices.ContainsFunc(sp[0].Env, func(e string) bool { return strings.HasPrefix(e, protocol.BackupLinesEnv+"=") }) {
		t.Fatalf("the seat gone, its environment names the file: %v", sp[0].Env)
	}
}

// A declaration the controller signed in a newer major than this host
// reads is refused before anything is touched, in one line saying so and
// what to do, with its serial; one of a newer minor is applied, what it
// adds ignored.
func TestApply_Protocol(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	st := &State{Node: "web1", ControllerKey: pub}
	root := t.TempDir()
	v, err := protocol.ParseVersion(protocol.Version)
	if err != nil {
		t.Fatal(err)
	}
	newer := protocol.Ver{Major: v.Major + 1}.String()
	report, after := apply(st, root, applied{}, sealed(t, priv, map[string]any{"node": "web1", "serial": 3, "protocol": newer,
		"modules": []any{module("a", "/srv/a")}}), nil, nil)
	want := "refused: declaration speaks protocol " + newer + "; this host reads " + strings.Split(protocol.Version, ".")[0] + ".x: upgrade the host"
	if report.OK || report.Error != want || report.Serial != 3 || after.Serial != 0 {
		t.Fatalf("a newer major: %+v\nwant %s", report, want)
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Fatalf("a refused declaration touched the root: %v", entries)
	}
	minor := protocol.Ver{Major: v.Major, Minor: v.Minor + 1}.String()
	report, after = apply(st, root, applied{}, sealed(t, priv, map[string]any{"node": "web1", "serial": 4, "protocol": minor,
		"modules": []any{module("a", "/srv/a")}, "something_new": map[string]any{"x": 1}}), nil, nil)
	if !report.OK || after.Serial != 4 {
		t.Fatalf("a newer minor: %+v", report)
	}
}
