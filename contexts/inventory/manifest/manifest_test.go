package manifest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// The example manifests are the inventory's test data (its store tests
// register them too).
func TestParse_Examples(t *testing.T) {
	files, _ := filepath.Glob("../testdata/*.json")
	if len(files) < 5 {
		t.Fatalf("examples: %v", files)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		m, ps := Parse(b)
		if len(ps) > 0 {
			t.Errorf("%s: %v", f, ps)
		}
		if m.Module == "" || len(m.Data) == 0 {
			t.Errorf("%s: parsed %+v", f, m)
		}
	}
}

func TestParse_EveryProblem(t *testing.T) {
	doc := `{
	  "module": "Paper_less", "version": "2.14", "colour": "blue",
	  "requires": {"arch": ["amd64"], "gpu": true},
	  "ports": [{"name": "http", "port": 8000}, {"name": "alt", "port": 8000}, {"name": "x", "port": 70000}],
	  "emits": ["documents.*", "bad..subject"],
	  "consumes": ["ok.>", "a.>.b"],
	  "secrets": [{"name": "pw", "made_by": "robot"}],
	  "licences": [{"name": "translation"}, {"name": "Translation"}, {"name": "translation"}, {"name": "x", "token": "t"}],
	  "settings": {"schema": {"type": "object", "properties": {"workers": {"type": "integer", "minimum": 1}}}, "defaults": {"workers": 0}},
	  "data": [
	    {"name": "media", "path": "/var/media", "precious": "priceless", "backup": "monthly"},
	    {"name": "media", "path": "/var/media"},
	    {"name": "rel", "path": "relative", "precious": "costly", "extra": 1}
	  ]
	}`
	_, ps := Parse([]byte(doc))
	var got []string
	for _, p := range ps {
		got = append(got, p.String())
	}
	sort.Strings(got)
	want := []string{
		`colour: unknown field`,
		`requires.gpu: unknown field`,
		`data[2].extra: unknown field`,
		`module: "Paper_less" is not a valid name`,
		`version: "2.14" is not a semantic version`,
		`ports[1].port: 8000 is claimed twice (also by http)`,
		`ports[2].port: 70000 is outside 1-65535`,
		`emits[0]: "documents.*" has a wildcard`,
		`emits[1]: "bad..subject" is not a valid NATS subject`,
		`consumes[1]: "a.>.b" is not a valid NATS subject`,
		`secrets[0].made_by: "robot" is not mesh or person`,
		`licences[1].name: "Translation" is not a valid name`,
		`licences[2].name: "translation" is named twice`,
		`licences[3].token: unknown field`,
		`settings.defaults/workers: `,
		`data[0].precious: "priceless" is not irreplaceable, costly or rebuildable`,
		`data[0].backup: "monthly" is not hourly, daily or weekly`,
		`data[1].name: "media" is named twice`,
		`data[1].path: "/var/media" is used twice`,
		`data[1].precious: missing`,
		`data[2].path: "relative" must be an absolute path`,
	}
	all := strings.Join(got, "\n")
	for _, w := range want {
		if !strings.Contains(all, w) {
			t.Errorf("missing problem %q in:\n%s", w, all)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d problems, want %d:\n%s", len(got), len(want), all)
	}
}

func TestParse_NotAManifest(t *testing.T) {
	for doc, want := range map[string]string{
		`{"module": `:                   "not JSON",
		`[1]`:                           "not a JSON object",
		`{"module": "a", "version": 1}`: "version: is number, want string",
		`{}`:                            "module: missing",
		`{"module":"a","version":"1.0.0","settings":{"schema":{"type":"nonsense"}}}`: "settings.schema: does not compile",
	} {
		_, ps := Parse([]byte(doc))
		if len(ps) == 0 || !strings.Contains(ps[0].String()+"|"+func() string {
			var s []string
			for _, p := range ps {
				s = append(s, p.String())
			}
			return strings.Join(s, "|")
		}(), want) {
			t.Errorf("%s: got %v, want %q", doc, ps, want)
		}
	}
}

// FuzzParse: no input panics the parser, and a manifest it accepts
// survives being written out and read again.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("../testdata/*.json")
	for _, file := range files {
		b, _ := os.ReadFile(file)
		f.Add(b)
	}
	f.Add([]byte(`{"module":"a","version":"1.0.0","data":[{"name":"d","path":"/x","precious":"costly"}]}`))
	f.Add([]byte(`{"module":"a","version":"2.0.0","prepare":{"command":["bin/migrate","--to","2"],"timeout":"90s"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, ps := Parse(data)
		if len(ps) > 0 {
			return
		}
		again, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if _, ps := Parse(again); len(ps) > 0 {
			t.Fatalf("accepted %s but not its re-encoding %s: %v", data, again, ps)
		}
	})
}

// Every problem of run (manifest.md, "Running") is reported at once.
func TestParse_RunEveryProblem(t *testing.T) {
	doc := `{
	  "module": "hello", "version": "1.0.0",
	  "ports": [{"name": "http", "port": 8080}],
	  "settings": {"schema": {"type": "object", "properties": {"greeting": {"type": "string"}}}},
	  "run": {"command": ["", "x"], "stop_grace": "soon", "colour": 1,
	          "env": {"MESH_NODE": "x", "2BAD": "y", "GOOD": "${settings.greeting}", "MISSING": "${settings.nope}", "LEAK": "${secrets.pw}"},
	          "ready": {"port": "admin", "after": "-1s", "wait": true}}
	}`
	_, ps := Parse([]byte(doc))
	var got []string
	for _, p := range ps {
		got = append(got, p.String())
	}
	joined := strings.Join(got, "\n")
	for _, w := range []string{
		`run.colour: unknown field`,
		`run.ready.wait: unknown field`,
		`run.command[0]: is empty`,
		`run.stop_grace: "soon" is not a duration`,
		`run.env.MESH_NODE: MESH_NODE is set by the host`,
		`run.env.2BAD: "2BAD" is not a valid variable name`,
		`run.env.MISSING: "${settings.nope}": the settings schema has no property nope`,
		`run.env.LEAK: "${secrets.pw}": only ${settings.NAME} is filled in`,
		`run.ready: say exactly one of port, command or after (2 given)`,
		`run.ready.port: "admin" is not a declared port's name`,
		`run.ready.after: -1s is outside (0, 10m]`,
	} {
		if !strings.Contains(joined, w) {
			t.Errorf("missing %q in:\n%s", w, joined)
		}
	}
	if strings.Contains(joined, "run.env.GOOD") {
		t.Errorf("a good env entry was judged bad:\n%s", joined)
	}
	if len(got) != 11 {
		t.Errorf("%d problems, want 11:\n%s", len(got), joined)
	}
	_, ps = Parse([]byte(`{"module": "hello", "version": "1.0.0", "run": {}}`))
	if len(ps) != 1 || !strings.Contains(ps[0].String(), "run.command: missing") {
		t.Errorf("empty run: %v", ps)
	}
}

// A data set may not be what a host keeps for itself.
func TestParse_DataOverlapsHost(t *testing.T) {
	for _, p := range []string{"/etc/mesh/x", "/var/log/mesh", "/var/log"} {
		_, ps := Parse([]byte(`{"module": "m", "version": "1.0.0", "data": [{"name": "d", "path": "` + p + `", "precious": "costly"}]}`))
		if len(ps) != 1 || !strings.Contains(ps[0].String(), "which a host keeps for itself") {
			t.Errorf("%s: %v", p, ps)
		}
	}
}

// Every problem of build is reported at once.
func TestParse_BuildEveryProblem(t *testing.T) {
	_, ps := Parse([]byte(`{"module": "m", "version": "1.0.0",
	  "build": {"command": [], "outputs": ["/abs", "../up", "bin/", "bin", "mesh.json"], "timeout": "forever", "env": {"PATH": "/x", "GOOS": "linux"}, "cache": true}}`))
	var got []string
	for _, p := range ps {
		got = append(got, p.String())
	}
	joined := strings.Join(got, "\n")
	for _, w := range []string{
		`build.cache: unknown field`,
		`build.command: missing`,
		`build.outputs[0]: "/abs" must be a path inside the checkout`,
		`build.outputs[1]: "../up" must be a path inside the checkout`,
		`build.outputs[3]: "bin" is listed twice`,
		`build.outputs[4]: mesh.json is always in the archive`,
		`build.timeout: "forever" is not a duration`,
		`build.env.PATH: PATH is set by the builder`,
	} {
		if !strings.Contains(joined, w) {
			t.Errorf("missing %q in:\n%s", w, joined)
		}
	}
	if len(got) != 8 {
		t.Errorf("%d problems, want 8:\n%s", len(got), joined)
	}
	m, ps := Parse([]byte(`{"module": "m", "version": "1.0.0", "build": {"command": ["go", "build", "-o", "bin/m", "."], "outputs": ["bin/"], "timeout": "5m"}}`))
	if len(ps) != 0 || m.Build == nil || m.Build.Outputs[0] != "bin/" {
		t.Fatalf("a good build section: %v %+v", ps, m.Build)
	}
}

// A data set's backup is a cadence word, or an object with the cadence, a
// command to run first and what to keep; each part judged, and written
// back as the word alone when that is all it says.
func TestParse_DataBackup(t *testing.T) {
	doc := func(backup string) []byte {
		return []byte(`{"module": "db", "version": "1.0.0", "data": [{"name": "pg", "path": "/var/lib/db", "precious": "irreplaceable", "backup": ` + backup + `}]}`)
	}
	m, ps := Parse(doc(`{"every": "hourly", "before": ["bin/dump", "--into", "/var/lib/db/dump"], "keep": {"hourly": 48, "daily": 7, "weekly": 0, "monthly": 3}}`))
	if len(ps) != 0 {
		t.Fatalf("problems: %v", ps)
	}
	if b := m.Data[0].Backup; b.Every != "hourly" || len(b.Before) != 3 || b.Keep == nil || b.Keep.Hourly != 48 || b.Keep.Monthly != 3 {
		t.Fatalf("backup %+v", b)
	}
	m, ps = Parse(doc(`"weekly"`))
	if len(ps) != 0 || m.Data[0].Backup.Every != "weekly" {
		t.Fatalf("the word alone: %+v %v", m.Data[0].Backup, ps)
	}
	if out, err := json.Marshal(m.Data[0]); err != nil || !strings.Contains(string(out), `"backup":"weekly"`) {
		t.Fatalf("written back as %s, %v", out, err)
	}
	for _, c := range []struct{ backup, field string }{
		{`"nightly"`, "data[0].backup"},
		{`{"every": "nightly"}`, "data[0].backup.every"},
		{`{"every": "daily", "before": [""]}`, "data[0].backup.before"},
		{`{"keep": {"hourly": 0}}`, "data[0].backup.keep"},
		{`{"keep": {"daily": -1, "weekly": 2}}`, "data[0].backup.keep"},
		{`{"every": "daily", "after": ["x"]}`, "data[0].backup.after"},
		{`{"keep": {"yearly": 2}}`, "data[0].backup.keep.yearly"},
		{`3`, "data.backup"},
	} {
		_, ps := Parse(doc(c.backup))
		if !slices.ContainsFunc(ps, func(p Problem) bool { return p.Field == c.field }) {
			t.Errorf("backup %s: problems %v, want one on %s", c.backup, ps, c.field)
		}
	}
}

// A data path a host would refuse (not clean: a trailing slash, a double
// slash, a dot) is refused where the manifest is judged, not at assign.
func TestParse_DataPathsAreClean(t *testing.T) {
	for p, clean := range map[string]string{"/srv/x/": "/srv/x", "/srv//x": "/srv/x", "/srv/./x": "/srv/x"} {
		_, ps := Parse([]byte(`{"module": "a", "version": "1.0.0", "data": [{"name": "d", "path": "` + p + `", "precious": "rebuildable"}]}`))
		want := `data[0].path: "` + p + `" must be written clean: "` + clean + `"`
		if len(ps) != 1 || ps[0].String() != want {
			t.Errorf("%s: problems %v, want %s", p, ps, want)
		}
	}
	if _, ps := Parse([]byte(`{"module": "a", "version": "1.0.0", "data": [{"name": "d", "path": "/srv/x", "precious": "rebuildable"}]}`)); len(ps) != 0 {
		t.Errorf("a clean path refused: %v", ps)
	}
}

// prepare is judged whole: a command, a timeout that parses, within
// [1s, 24h]; each problem one line naming its field. Absent, the timeout
// is the default.
func TestParse_Prepare(t *testing.T) {
	for doc, want := range map[string][]string{
		`{"command": []}`: {`prepare.command: missing: the program that brings the data to this version's shape`},
		`{"command": [" ", "x"], "timeout": "soon"}`: {`prepare.command[0]: is empty`, `prepare.timeout: "soon" is not a duration (like 10m)`},
		`{"command": ["bin/m"], "timeout": "500ms"}`: {`prepare.timeout: 500ms is outside [1s, 24h]`},
		`{"command": ["bin/m"], "timeout": "25h"}`:   {`prepare.timeout: 25h is outside [1s, 24h]`},
		`{"command": ["bin/m"], "retries": 3}`:       {`prepare.retries: unknown field`},
		`{"command": ["bin/m"], "timeout": "24h"}`:   nil,
		`{"command": ["bin/m"]}`:                     nil,
	} {
		_, ps := Parse([]byte(`{"module": "m", "version": "2.0.0", "prepare": ` + doc + `}`))
		var got []string
		for _, p := range ps {
			got = append(got, p.String())
		}
		if len(got) != len(want) {
			t.Errorf("%s: %q, want %q", doc, got, want)
			continue
		}
		for i, w := range want {
			if !strings.HasPrefix(got[i], w) {
				t.Errorf("%s: %q, want %q", doc, got[i], w)
			}
		}
	}
	if DefaultPrepareTimeout != 10*time.Minute {
		t.Errorf("the default prepare timeout is %s", DefaultPrepareTimeout)
	}
}
