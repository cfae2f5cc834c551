// Package manifest owns a module's manifest (manifest.md): its types, how it
// is read and judged, and what a module's repository may say. It is the
// inventory's model without its store, so that a builder or a host reads a
// manifest without linking a database driver. It imports no other context.
package manifest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// Manifest is a module's description (manifest.md): what it runs, needs,
// provides, emits and consumes, and — first-class — the data it keeps.
type Manifest struct {
	Module      string        `json:"module"`
	Version     string        `json:"version"`
	Description string        `json:"description,omitempty"`
	Source      string        `json:"source,omitempty"`
	Requires    *Requirements `json:"requires,omitempty"`
	Run         *Run          `json:"run,omitempty"`
	Build       *Build        `json:"build,omitempty"`
	Prepare     *Prepare      `json:"prepare,omitempty"`
	Ports       []Port        `json:"ports,omitempty"`
	Emits       []string      `json:"emits,omitempty"`
	Consumes    []string      `json:"consumes,omitempty"`
	Provides    []Provision   `json:"provides,omitempty"`
	Needs       []Need        `json:"needs,omitempty"`
	Seats       []Seat        `json:"seats,omitempty"`
	Settings    *Settings     `json:"settings,omitempty"`
	Secrets     []Secret      `json:"secrets,omitempty"`
	// Licences are the licences it needs held ('licence use') before it
	// starts: assign warns of one not held, the plan shows it waiting.
	Licences []LicenceNeed `json:"licences,omitempty"`
	Data     []DataSpec    `json:"data,omitempty"`
	Tools    []Tool        `json:"tools,omitempty"`
	StandsOn []string      `json:"stands_on,omitempty"`
}

// Requirements are what a node must offer; judged against its reported facts.
type Requirements struct {
	Arch     []string `json:"arch,omitempty"`
	MemoryMB int64    `json:"memory_mb,omitempty"`
	Cores    int64    `json:"cores,omitempty"`
	DiskMB   int64    `json:"disk_mb,omitempty"`
	Runtimes []string `json:"runtimes,omitempty"`
}

// Run is how the module is started (manifest.md, "Running").
type Run struct {
	Command []string `json:"command"`
	// Env are non-secret environment variables; a value may name a
	// top-level setting as ${settings.NAME}, filled in per node.
	Env map[string]string `json:"env,omitempty"`
	// StopGrace is a Go duration between SIGTERM and SIGKILL (default 10s).
	StopGrace string `json:"stop_grace,omitempty"`
	// Ready says when a started module is ready.
	Ready *Ready `json:"ready,omitempty"`
}

// Build says how a builder turns the module's source into an archive
// (manifest.md, "Running, building"): a module without it runs from what
// its host already has.
type Build struct {
	Command []string `json:"command"`
	// Outputs are the paths, relative to the checkout, packed with
	// mesh.json into the archive ("bin/" for a directory).
	Outputs []string `json:"outputs"`
	// Timeout is a Go duration; empty is DefaultBuildTimeout.
	Timeout string            `json:"timeout,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
}

// DefaultBuildTimeout is how long a build may run unless its manifest says.
const DefaultBuildTimeout = 20 * time.Minute

// MaxBuildTimeout bounds what a manifest may ask for.
const MaxBuildTimeout = 24 * time.Hour

// Prepare is how a version brings its module's data to the shape it
// needs (the seed's "prepare"): on an upgrade to this version the host
// stops the old version, snapshots the module's precious data, runs the
// command (as the module's user, in this version's directory, with its
// environment) and starts this version; one that fails or outlives its
// timeout leaves the old version running on the data as it was.
type Prepare struct {
	Command []string `json:"command"`
	// Timeout is a Go duration; empty is DefaultPrepareTimeout.
	Timeout string `json:"timeout,omitempty"`
}

// DefaultPrepareTimeout is how long a prepare may run unless its manifest
// says; MinPrepareTimeout and MaxPrepareTimeout bound what it may say.
const (
	DefaultPrepareTimeout = 10 * time.Minute
	MinPrepareTimeout     = time.Second
	MaxPrepareTimeout     = 24 * time.Hour
)

// Ready is one of: a declared port accepts TCP connections, a command
// exits 0, or a time running without exiting.
type Ready struct {
	Port    string   `json:"port,omitempty"`
	Command []string `json:"command,omitempty"`
	After   string   `json:"after,omitempty"`
}

// Port is a port the module listens on.
type Port struct {
	Name   string `json:"name"`
	Port   int    `json:"port"`
	Expose string `json:"expose,omitempty"`
}

// Provision is something the module provides to others.
type Provision struct {
	Provision   string       `json:"provision"`
	Port        int          `json:"port,omitempty"`
	PerConsumer *PerConsumer `json:"per_consumer,omitempty"`
}

// PerConsumer is what a provider keeps for each consumer.
type PerConsumer struct {
	Credential bool          `json:"credential,omitempty"`
	Data       *ConsumerData `json:"data,omitempty"`
}

// ConsumerData is the data a provider keeps per consumer, and how precious it is.
type ConsumerData struct {
	Keeps    string `json:"keeps,omitempty"`
	Precious string `json:"precious"`
}

// Need is a provision the module consumes.
type Need struct {
	Provision string `json:"provision"`
	Optional  bool   `json:"optional,omitempty"`
}

// Seat is a role the module can fill.
type Seat struct {
	Seat       string `json:"seat"`
	Delivers   string `json:"delivers,omitempty"`
	Replicated bool   `json:"replicated,omitempty"`
}

// Settings are the module's settings schema and defaults.
type Settings struct {
	Schema   json.RawMessage `json:"schema,omitempty"`
	Defaults json.RawMessage `json:"defaults,omitempty"`
}

// Secret is a secret the module uses, and who makes it.
type Secret struct {
	Name   string `json:"name"`
	MadeBy string `json:"made_by"`
}

// LicenceNeed is a licence a module needs, by the name a person gave it.
type LicenceNeed struct {
	Name string `json:"name"`
}

// DataSpec is one place the module keeps state, and how precious it is.
type DataSpec struct {
	Name     string `json:"name"`
	Path     string `json:"path"`
	Keeps    string `json:"keeps,omitempty"`
	Precious string `json:"precious"`
	// Backup is how it is backed up: a cadence word ("daily"), or an
	// object with the cadence (every), a command the host runs first
	// (before) and what the holder keeps (keep).
	Backup DataBackup `json:"backup,omitzero"`
}

// DataBackup is a data set's backup, as its manifest says it.
type DataBackup struct {
	// Every is hourly, daily or weekly; "" takes the preciousness's default.
	Every string `json:"every,omitempty"`
	// Before is run by the data's host before each backup, as the module's
	// user, in the module's directory, with its environment: a database
	// dump into the data set, say, for a module that writes while it runs.
	Before []string `json:"before,omitempty"`
	// Keep is how many snapshots of each period the holder keeps; nil
	// takes the default (24 hourly, 7 daily, 5 weekly, 12 monthly).
	Keep *Retention `json:"keep,omitempty"`
	// object says the manifest wrote it as an object: a problem with its
	// cadence is named backup.every then.
	object bool
}

// Retention is how many snapshots of each period are kept.
type Retention struct {
	Hourly  int `json:"hourly"`
	Daily   int `json:"daily"`
	Weekly  int `json:"weekly"`
	Monthly int `json:"monthly"`
}

// IsZero says the manifest said nothing of the backup.
func (b DataBackup) IsZero() bool { return b.Every == "" && len(b.Before) == 0 && b.Keep == nil }

// UnmarshalJSON takes the cadence word alone, or the object.
func (b *DataBackup) UnmarshalJSON(data []byte) error {
	var word string
	if err := json.Unmarshal(data, &word); err == nil {
		*b = DataBackup{Every: word}
		return nil
	}
	type plain DataBackup
	var p plain
	if err := json.Unmarshal(data, &p); err != nil {
		return &json.UnmarshalTypeError{Value: "not a cadence word or an object", Type: reflect.TypeFor[DataBackup]()}
	}
	*b = DataBackup(p)
	b.object = true
	return nil
}

// MarshalJSON writes the cadence word alone when that is all it says, as
// manifests written before the object was known read.
func (b DataBackup) MarshalJSON() ([]byte, error) {
	if len(b.Before) == 0 && b.Keep == nil {
		return json.Marshal(b.Every)
	}
	type plain DataBackup
	return json.Marshal(plain(b))
}

// Tool is something the module answers on mesh.tool.M.T.
type Tool struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
}

// Preciousness levels.
const (
	Irreplaceable = "irreplaceable"
	Costly        = "costly"
	Rebuildable   = "rebuildable"
)

// Problem is one thing wrong with a manifest: the field and what is wrong.
type Problem struct {
	Field string
	What  string
}

func (p Problem) String() string { return p.Field + ": " + p.What }

// shape is the fields each object of a manifest may have: any other is a
// problem (a typo must not pass silently). "[]" marks an array of objects.
var shape = map[string][]string{
	"":                             {"module", "version", "description", "source", "requires", "run", "build", "prepare", "ports", "emits", "consumes", "provides", "needs", "seats", "settings", "secrets", "licences", "data", "tools", "stands_on"},
	"requires":                     {"arch", "memory_mb", "cores", "disk_mb", "runtimes"},
	"run":                          {"command", "env", "stop_grace", "ready"},
	"run.ready":                    {"port", "command", "after"},
	"build":                        {"command", "outputs", "timeout", "env"},
	"prepare":                      {"command", "timeout"},
	"ports[]":                      {"name", "port", "expose"},
	"provides[]":                   {"provision", "port", "per_consumer"},
	"provides[].per_consumer":      {"credential", "data"},
	"provides[].per_consumer.data": {"keeps", "precious"},
	"needs[]":                      {"provision", "optional"},
	"seats[]":                      {"seat", "delivers", "replicated"},
	"settings":                     {"schema", "defaults"},
	"secrets[]":                    {"name", "made_by"},
	"licences[]":                   {"name"},
	"data[]":                       {"name", "path", "keeps", "precious", "backup"},
	"data[].backup":                {"every", "before", "keep"},
	"data[].backup.keep":           {"hourly", "daily", "weekly", "monthly"},
	"tools[]":                      {"name", "description"},
}

// unknownFields walks the raw document and reports every field the shape does not name.
func unknownFields(v any, shapeKey, path string, out *[]Problem) {
	switch x := v.(type) {
	case map[string]any:
		allowed, ok := shape[shapeKey]
		if !ok {
			return // free-form (settings schema and defaults)
		}
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if !slices.Contains(allowed, k) {
				*out = append(*out, Problem{join(path, k), "unknown field"})
				continue
			}
			child := shapeKey + "." + k
			if shapeKey == "" {
				child = k
			}
			unknownFields(x[k], child, join(path, k), out)
		}
	case []any:
		for i, e := range x {
			unknownFields(e, shapeKey+"[]", fmt.Sprintf("%s[%d]", path, i), out)
		}
	}
}

func join(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

var (
	nameRule = regexp.MustCompile(`^[a-z][a-z0-9-]{0,62}$`)
	// secretRule also allows underscores: the shared example manifests name
	// secrets admin_password, ocr_licence…
	secretRule = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,62}$`)
	semverRule = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)
)

// Parse reads a manifest strictly and judges it (manifest.md, "What
// module check judges"). It returns every problem, not only the first; a
// manifest with problems is not to be registered.
func Parse(data []byte) (Manifest, []Problem) {
	var raw any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&raw); err != nil {
		return Manifest{}, []Problem{{"(document)", "not JSON: " + err.Error()}}
	}
	if dec.More() {
		return Manifest{}, []Problem{{"(document)", "more than one JSON value"}}
	}
	if _, ok := raw.(map[string]any); !ok {
		return Manifest{}, []Problem{{"(document)", "not a JSON object"}}
	}
	var problems []Problem
	unknownFields(raw, "", "", &problems)
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		// A field of the wrong type: say which, as json does.
		field, what := "(document)", err.Error()
		if te, ok := err.(*json.UnmarshalTypeError); ok {
			field, what = te.Field, fmt.Sprintf("is %s, want %s", te.Value, te.Type)
		}
		return Manifest{}, append(problems, Problem{field, what})
	}
	problems = append(problems, m.judge()...)
	return m, problems
}

// MaxListed bounds every list of a manifest (data sets, secrets, ports…):
// what a declaration carries to its host is bounded the same way
// (app/protocol's Max… bounds), so that what is registered can be delivered.
const MaxListed = 1000

func (m *Manifest) judge() []Problem {
	var ps []Problem
	bad := func(field, format string, args ...any) { ps = append(ps, Problem{field, fmt.Sprintf(format, args...)}) }
	for _, l := range []struct {
		field string
		n     int
	}{{"ports", len(m.Ports)}, {"emits", len(m.Emits)}, {"consumes", len(m.Consumes)}, {"provides", len(m.Provides)}, {"needs", len(m.Needs)},
		{"seats", len(m.Seats)}, {"secrets", len(m.Secrets)}, {"data", len(m.Data)}, {"tools", len(m.Tools)}, {"stands_on", len(m.StandsOn)}, {"licences", len(m.Licences)}} {
		if l.n > MaxListed {
			bad(l.field, "%d entries, at most %d: a module's declaration must reach its host whole", l.n, MaxListed)
		}
	}
	name := func(field, value string) {
		if !nameRule.MatchString(value) {
			bad(field, "%q is not a valid name: a lowercase letter, then up to 62 lowercase letters, digits or dashes", value)
		}
	}
	switch {
	case m.Module == "":
		bad("module", "missing")
	default:
		name("module", m.Module)
	}
	switch {
	case m.Version == "":
		bad("version", "missing")
	case !semverRule.MatchString(m.Version):
		bad("version", "%q is not a semantic version (MAJOR.MINOR.PATCH)", m.Version)
	}
	if what := repositoryCredential(m.Source); what != "" {
		// The manifest is kept, declared and printed: the credential would be too.
		bad("source", "%v (%s): %s", ErrRepositoryCredential, what, RepositoryCredentialHint)
	}
	if r := m.Requires; r != nil {
		for _, n := range []struct {
			f string
			v int64
		}{{"memory_mb", r.MemoryMB}, {"cores", r.Cores}, {"disk_mb", r.DiskMB}} {
			if n.v < 0 {
				bad("requires."+n.f, "must not be negative")
			}
		}
	}
	seenPorts := map[int]string{}
	for i, p := range m.Ports {
		f := fmt.Sprintf("ports[%d]", i)
		name(f+".name", p.Name)
		if p.Port < 1 || p.Port > 65535 {
			bad(f+".port", "%d is outside 1-65535", p.Port)
		} else if other, ok := seenPorts[p.Port]; ok {
			bad(f+".port", "%d is claimed twice (also by %s)", p.Port, other)
		} else {
			seenPorts[p.Port] = p.Name
		}
		if p.Expose != "" && !slices.Contains([]string{"overlay", "public", "local"}, p.Expose) {
			bad(f+".expose", "%q is not overlay, public or local", p.Expose)
		}
	}
	for i, s := range m.Emits {
		f := fmt.Sprintf("emits[%d]", i)
		if !validSubject(s, false) {
			if strings.ContainsAny(s, "*>") {
				bad(f, "%q has a wildcard: a module emits on exact subjects", s)
			} else {
				bad(f, "%q is not a valid NATS subject", s)
			}
		}
	}
	for i, s := range m.Consumes {
		if !validSubject(s, true) {
			bad(fmt.Sprintf("consumes[%d]", i), "%q is not a valid NATS subject", s)
		}
	}
	for i, p := range m.Provides {
		f := fmt.Sprintf("provides[%d]", i)
		name(f+".provision", p.Provision)
		if p.Port != 0 && (p.Port < 1 || p.Port > 65535) {
			bad(f+".port", "%d is outside 1-65535", p.Port)
		}
		if pc := p.PerConsumer; pc != nil && pc.Data != nil {
			precious(f+".per_consumer.data.precious", pc.Data.Precious, bad)
		}
	}
	for i, n := range m.Needs {
		name(fmt.Sprintf("needs[%d].provision", i), n.Provision)
	}
	for i, s := range m.Seats {
		name(fmt.Sprintf("seats[%d].seat", i), s.Seat)
	}
	seenSecrets := map[string]bool{}
	for i, s := range m.Secrets {
		f := fmt.Sprintf("secrets[%d]", i)
		if !secretRule.MatchString(s.Name) {
			bad(f+".name", "%q is not a valid secret name: a lowercase letter, then up to 62 lowercase letters, digits, dashes or underscores", s.Name)
		}
		if seenSecrets[s.Name] {
			bad(f+".name", "%q is named twice", s.Name)
		}
		seenSecrets[s.Name] = true
		if s.MadeBy != "mesh" && s.MadeBy != "person" {
			bad(f+".made_by", "%q is not mesh or person", s.MadeBy)
		}
	}
	seenLicences := map[string]bool{}
	for i, l := range m.Licences {
		f := fmt.Sprintf("licences[%d].name", i)
		name(f, l.Name)
		if seenLicences[l.Name] {
			bad(f, "%q is named twice", l.Name)
		}
		seenLicences[l.Name] = true
	}
	seenData, seenPaths := map[string]bool{}, map[string]bool{}
	for i, d := range m.Data {
		f := fmt.Sprintf("data[%d]", i)
		name(f+".name", d.Name)
		if seenData[d.Name] {
			bad(f+".name", "%q is named twice", d.Name)
		}
		seenData[d.Name] = true
		switch {
		case d.Path == "":
			bad(f+".path", "missing")
		case !strings.HasPrefix(d.Path, "/") || strings.Contains(d.Path, "/../") || strings.HasSuffix(d.Path, "/..") || d.Path == "/":
			bad(f+".path", "%q must be an absolute path below /", d.Path)
		case path.Clean(d.Path) != d.Path:
			// A host refuses any other: judged here, not found at assign.
			bad(f+".path", "%q must be written clean: %q", d.Path, path.Clean(d.Path))
		case seenPaths[d.Path]:
			bad(f+".path", "%q is used twice", d.Path)
		case overlapsHost(d.Path):
			bad(f+".path", "%q overlaps /etc/mesh or /var/log/mesh, which a host keeps for itself", d.Path)
		}
		seenPaths[d.Path] = true
		precious(f+".precious", d.Precious, bad)
		field := f + ".backup"
		if d.Backup.object {
			field += ".every"
		}
		if d.Backup.Every != "" && !slices.Contains([]string{"hourly", "daily", "weekly"}, d.Backup.Every) {
			bad(field, "%q is not hourly, daily or weekly", d.Backup.Every)
		}
		if b := d.Backup.Before; len(b) > 0 && (b[0] == "" || len(b) > MaxListed) {
			bad(f+".backup.before", "a command names its program first, in at most %d words", MaxListed)
		}
		if k := d.Backup.Keep; k != nil {
			if k.Hourly < 0 || k.Daily < 0 || k.Weekly < 0 || k.Monthly < 0 || k.Hourly+k.Daily+k.Weekly+k.Monthly == 0 {
				bad(f+".backup.keep", "keeps no snapshot: give at least one of hourly, daily, weekly, monthly, none negative")
			}
		}
	}
	if m.Run != nil {
		m.judgeRun(bad)
	}
	if m.Build != nil {
		m.judgeBuild(bad)
	}
	if m.Prepare != nil {
		m.judgePrepare(bad)
	}
	for i, t := range m.Tools {
		name(fmt.Sprintf("tools[%d].name", i), t.Name)
	}
	for i, s := range m.StandsOn {
		name(fmt.Sprintf("stands_on[%d]", i), s)
	}
	if s := m.Settings; s != nil {
		sch, err := m.SettingsSchema()
		if err != nil {
			bad("settings.schema", "does not compile: %s", oneLine(err.Error()))
		} else if len(s.Defaults) > 0 {
			for _, p := range validate(sch, s.Defaults) {
				bad("settings.defaults"+p.Field, "%s", p.What)
			}
		}
	}
	return ps
}

var (
	envNameRule = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)
	// settingRef is ${settings.NAME}: a value filled in from the node's
	// effective settings.
	settingRef = regexp.MustCompile(`\$\{([^}]*)\}`)
)

// maxRunWords bounds a command's words and a module's env entries.
const maxRunWords = 100

// judgeRun judges run (manifest.md, "Running"): the command, env, stop_grace
// and ready, every problem reported.
func (m *Manifest) judgeRun(bad func(string, string, ...any)) {
	r := m.Run
	command := func(field string, words []string) {
		judgeCommand(bad, field, words, "the program to start and its arguments",
			"name the program (an absolute path, a path in the module's directory, or a name on the host's PATH)")
	}
	command("run.command", r.Command)
	if len(r.Env) > maxRunWords {
		bad("run.env", "%d variables, at most %d", len(r.Env), maxRunWords)
	}
	props := m.settingNames()
	for _, k := range slices.Sorted(maps.Keys(r.Env)) {
		f := "run.env." + k
		switch {
		case !envNameRule.MatchString(k):
			bad(f, "%q is not a valid variable name: a letter or underscore, then letters, digits or underscores", k)
		case strings.HasPrefix(k, "MESH_") || k == "PATH" || k == "HOME":
			bad(f, "%s is set by the host: MESH_*, PATH and HOME cannot be declared", k)
		}
		v := r.Env[k]
		if strings.ContainsRune(v, 0) {
			bad(f, "contains a NUL byte")
		}
		for _, ref := range settingRef.FindAllStringSubmatch(v, -1) {
			name, ok := strings.CutPrefix(ref[1], "settings.")
			switch {
			case !ok || name == "":
				bad(f, "%q: only ${settings.NAME} is filled in (env is not secret: a secret is a file, never a variable)", ref[0])
			case props != nil && !props[name]:
				bad(f, "%q: the settings schema has no property %s", ref[0], name)
			}
		}
	}
	duration := func(field, v string) {
		if v == "" {
			return
		}
		d, err := time.ParseDuration(v)
		switch {
		case err != nil:
			bad(field, "%q is not a duration (like 10s or 1m30s)", v)
		case d <= 0 || d > 10*time.Minute:
			bad(field, "%s is outside (0, 10m]", v)
		}
	}
	duration("run.stop_grace", r.StopGrace)
	if rd := r.Ready; rd != nil {
		set := 0
		for _, b := range []bool{rd.Port != "", rd.Command != nil, rd.After != ""} {
			if b {
				set++
			}
		}
		if set != 1 {
			bad("run.ready", "say exactly one of port, command or after (%d given)", set)
		}
		if rd.Port != "" && !slices.ContainsFunc(m.Ports, func(p Port) bool { return p.Name == rd.Port }) {
			bad("run.ready.port", "%q is not a declared port's name", rd.Port)
		}
		if rd.Command != nil {
			command("run.ready.command", rd.Command)
		}
		duration("run.ready.after", rd.After)
	}
}

// judgeBuild judges build: a command, outputs that are clean relative
// paths inside the checkout, a timeout in (0, 24h], env that leaves PATH
// and HOME to the builder; every problem reported.
func (m *Manifest) judgeBuild(bad func(string, string, ...any)) {
	b := m.Build
	judgeCommand(bad, "build.command", b.Command, "the program that builds it and its arguments", "name the program")
	if len(b.Outputs) == 0 {
		bad("build.outputs", "missing: the paths the archive carries, such as \"bin/\"")
	}
	if len(b.Outputs) > MaxListed {
		bad("build.outputs", "%d entries, at most %d", len(b.Outputs), MaxListed)
	}
	seen := map[string]bool{}
	for i, o := range b.Outputs {
		f := fmt.Sprintf("build.outputs[%d]", i)
		clean := path.Clean(o)
		switch {
		case o == "" || strings.ContainsRune(o, 0):
			bad(f, "is empty")
		case path.IsAbs(o) || clean == ".." || strings.HasPrefix(clean, "../") || clean == ".":
			bad(f, "%q must be a path inside the checkout, such as bin/", o)
		case clean == "mesh.json":
			bad(f, "mesh.json is always in the archive: do not list it")
		case seen[clean]:
			bad(f, "%q is listed twice", o)
		}
		seen[clean] = true
	}
	if b.Timeout != "" {
		d, err := time.ParseDuration(b.Timeout)
		switch {
		case err != nil:
			bad("build.timeout", "%q is not a duration (like 20m)", b.Timeout)
		case d <= 0 || d > MaxBuildTimeout:
			bad("build.timeout", "%s is outside (0, 24h]", b.Timeout)
		}
	}
	if len(b.Env) > maxRunWords {
		bad("build.env", "%d variables, at most %d", len(b.Env), maxRunWords)
	}
	for _, k := range slices.Sorted(maps.Keys(b.Env)) {
		switch {
		case !envNameRule.MatchString(k):
			bad("build.env."+k, "%q is not a valid variable name", k)
		case k == "PATH" || k == "HOME":
			bad("build.env."+k, "%s is set by the builder", k)
		}
		if strings.ContainsRune(b.Env[k], 0) {
			bad("build.env."+k, "contains a NUL byte")
		}
	}
}

// judgeCommand judges a command a host or builder execs: its words, at
// most maxRunWords, the first naming the program, none with a NUL byte;
// missing says what the command is, empty how to name the program.
func judgeCommand(bad func(string, string, ...any), field string, words []string, missing, empty string) {
	switch {
	case len(words) == 0:
		bad(field, "missing: %s", missing)
	case len(words) > maxRunWords:
		bad(field, "%d words, at most %d", len(words), maxRunWords)
	case strings.TrimSpace(words[0]) == "":
		bad(field+"[0]", "is empty: %s", empty)
	}
	for i, w := range words {
		if strings.ContainsRune(w, 0) {
			bad(fmt.Sprintf("%s[%d]", field, i), "contains a NUL byte")
		}
	}
}

// judgePrepare judges prepare: a command, and a timeout that is a
// duration within [MinPrepareTimeout, MaxPrepareTimeout]; every problem
// reported.
func (m *Manifest) judgePrepare(bad func(string, string, ...any)) {
	p := m.Prepare
	judgeCommand(bad, "prepare.command", p.Command, "the program that brings the data to this version's shape, and its arguments",
		"name the program (a path in the version's directory, or a name on the host's PATH)")
	if p.Timeout != "" {
		d, err := time.ParseDuration(p.Timeout)
		switch {
		case err != nil:
			bad("prepare.timeout", "%q is not a duration (like 10m)", p.Timeout)
		case d < MinPrepareTimeout || d > MaxPrepareTimeout:
			bad("prepare.timeout", "%s is outside [1s, 24h]", p.Timeout)
		}
	}
}

// settingNames are the top-level properties the settings schema names, or
// nil when it names none (any name may then be set).
func (m *Manifest) settingNames() map[string]bool {
	if m.Settings == nil || len(m.Settings.Schema) == 0 {
		return nil
	}
	var sch struct {
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if json.Unmarshal(m.Settings.Schema, &sch) != nil || len(sch.Properties) == 0 {
		return nil
	}
	out := map[string]bool{}
	for k := range sch.Properties {
		out[k] = true
	}
	return out
}

func precious(field, level string, bad func(string, string, ...any)) {
	switch level {
	case Irreplaceable, Costly, Rebuildable:
	case "":
		bad(field, "missing: say how precious it is (irreplaceable, costly or rebuildable)")
	default:
		bad(field, "%q is not irreplaceable, costly or rebuildable", level)
	}
}

// validSubject says whether s is a NATS subject: dot-separated tokens, none
// empty, no white space; with wildcards, a token may be * and the last may
// be >, and no token may hold them otherwise.
func validSubject(s string, wildcards bool) bool {
	if s == "" || strings.ContainsAny(s, " \t\r\n") {
		return false
	}
	tokens := strings.Split(s, ".")
	for i, t := range tokens {
		switch {
		case t == "":
			return false
		case wildcards && (t == "*" || (t == ">" && i == len(tokens)-1)):
		case strings.ContainsAny(t, "*>"):
			return false
		}
	}
	return true
}

// ValidName says whether s is a valid name (node, module, provision, seat,
// data set): the same rule as app/protocol's ValidName, which a test keeps
// equal (contexts import no app package).
func ValidName(s string) bool { return nameRule.MatchString(s) }

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// SettingsSchema compiles the manifest's settings schema (an empty one
// allows any object).
func (m *Manifest) SettingsSchema() (*jsonschema.Schema, error) {
	doc := any(map[string]any{"type": "object"})
	if m.Settings != nil && len(m.Settings.Schema) > 0 {
		var err error
		if doc, err = jsonschema.UnmarshalJSON(bytes.NewReader(m.Settings.Schema)); err != nil {
			return nil, err
		}
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("mesh:///settings.json", doc); err != nil {
		return nil, err
	}
	return c.Compile("mesh:///settings.json")
}

// ValidateSettings judges a settings document against the manifest's schema;
// each problem's field is the JSON pointer of the offending value.
func (m *Manifest) ValidateSettings(doc json.RawMessage) ([]Problem, error) {
	sch, err := m.SettingsSchema()
	if err != nil {
		return nil, err
	}
	return validate(sch, doc), nil
}

var printer = message.NewPrinter(language.English)

// Validate judges a settings document against a compiled schema (see
// SettingsSchema); each problem's field is the JSON pointer of the value.
func Validate(sch *jsonschema.Schema, doc json.RawMessage) []Problem { return validate(sch, doc) }

func validate(sch *jsonschema.Schema, doc json.RawMessage) []Problem {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return []Problem{{"", "not JSON: " + err.Error()}}
	}
	err = sch.Validate(v)
	ve, ok := err.(*jsonschema.ValidationError)
	if !ok {
		if err != nil {
			return []Problem{{"", err.Error()}}
		}
		return nil
	}
	var ps []Problem
	var leaves func(e *jsonschema.ValidationError)
	leaves = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			ps = append(ps, Problem{"/" + strings.Join(e.InstanceLocation, "/"), e.ErrorKind.LocalizedString(printer)})
			return
		}
		for _, c := range e.Causes {
			leaves(c)
		}
	}
	leaves(ve)
	return ps
}

// hostPaths are what a host keeps for itself beneath its root (app/protocol's
// HostOwnPath and HostLogPath): no data set may be one, lie inside one or
// contain one.
var hostPaths = []string{"/etc/mesh", "/var/log/mesh"}

func overlapsHost(p string) bool {
	p = strings.TrimSuffix(p, "/")
	for _, h := range hostPaths {
		if p == h || strings.HasPrefix(p, h+"/") || strings.HasPrefix(h, p+"/") {
			return true
		}
	}
	return false
}
