package protocol

import (
	"fmt"
	"maps"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/semver"
)

// Bounds on one declaration. A real plan is far inside them; they keep a
// hostile or broken body from costing a host unbounded work and files.
const (
	// MaxModules is the most modules one declaration may carry.
	MaxModules = 1000
	// MaxDataSets is the most data sets one module may declare.
	MaxDataSets = 1000
	// MaxSecrets is the most secrets one module may carry.
	MaxSecrets = 1000
	// MaxBindings is the most provisions one module may be bound to.
	MaxBindings = 1000
	// MaxWaitingFor is the most secrets one module may wait for.
	MaxWaitingFor = 1000
	// MaxConsumers is the most consumers one provider module may list: a
	// provision shared by every node of a 10,000-node mesh still fits.
	MaxConsumers = 10000
	// MaxDeletions is the most deletions one declaration may ask for.
	MaxDeletions = 10000
	// MaxDeclarationBytes is the most a declaration may weigh, encoded: it
	// must cross the broker whole (its maximum payload is 8 MiB) with room
	// for the envelope.
	MaxDeclarationBytes = 4 << 20
)

// HostOwnPath is the part of a host's root the host keeps for itself (each
// module's declaration, secrets and credentials live under etc/mesh/modules).
// No data set may be it, lie inside it or contain it, so that deleting data
// never deletes what the host wrote.
const HostOwnPath = "/etc/mesh"

// HostLogPath is where a host keeps its modules' logs: no data set may be
// it, lie inside it or contain it either, so that no module is given the
// directory its host writes logs into as root.
const HostLogPath = "/var/log/mesh"

// NamePattern is ValidName's rule, as a regular expression (the HTTP
// API's OpenAPI document gives it for each name in a path).
const NamePattern = `^[a-z][a-z0-9-]{0,62}$`

// These are the same rules contexts/inventory applies to manifests
// (nameRule, secretRule); a declaration is judged by them again because a
// host trusts no name it is sent, even signed.
var (
	nameRule   = regexp.MustCompile(NamePattern)
	secretRule = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,62}$`)
	// credentialRule: consumer.<node>.<module>.<provision>, so dot-separated
	// words that are never empty (no "..", no leading or trailing dot).
	credentialRule = regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`)
)

// maxCredentialName bounds a credential name: four names of 63 and three dots.
const maxCredentialName = 255

// ValidName says whether s is a valid node, module, provision or data set
// name: a lowercase letter, then up to 62 lowercase letters, digits or dashes.
func ValidName(s string) bool { return nameRule.MatchString(s) }

// ValidSecretName says whether s is a valid secret name: like ValidName, and
// underscores are allowed too (admin_password).
func ValidSecretName(s string) bool { return secretRule.MatchString(s) }

// ValidCredentialName says whether s is a valid credential name
// (consumer.<node>.<module>.<provision>): letters, digits, dashes and
// underscores in words joined by single dots; never a slash or "..".
func ValidCredentialName(s string) bool {
	return len(s) <= maxCredentialName && credentialRule.MatchString(s)
}

// ValidVersion says whether v is a semantic version MAJOR.MINOR.PATCH, with
// an optional pre-release and build, written without a leading v (2.14.1).
func ValidVersion(v string) bool {
	if v == "" || v[0] == 'v' || !semver.IsValid("v"+v) {
		return false
	}
	// semver accepts the shorthands v1 and v1.2, which a manifest never
	// uses: the canonical form must be the version itself, build aside.
	return strings.HasPrefix("v"+v, semver.Canonical("v"+v))
}

// ValidDataPath says whether p may be a data set's path on a host: absolute,
// clean (no "..", ".", empty or trailing elements), not "/" itself.
func ValidDataPath(p string) bool {
	return path.IsAbs(p) && path.Clean(p) == p && p != "/" && !strings.ContainsRune(p, 0)
}

// Problems lists every problem of a declaration body, judged by the rules a
// host applies before it touches a file: names, versions, paths, and the
// bounds above. A host refuses a declaration with any; the controller judges
// a body by the same rules before signing it. Each problem names its field
// (modules[0].data[1].path: ...). The serial and issued_at are not judged:
// they are filled in when the body is signed.
func (d Declaration) Problems() []string {
	var ps []string
	bad := func(field, format string, args ...any) {
		ps = append(ps, field+": "+fmt.Sprintf(format, args...))
	}
	name := func(field, v string) {
		switch {
		case v == "":
			bad(field, "missing")
		case !ValidName(v):
			bad(field, "%q is not a valid name: a lowercase letter, then up to 62 lowercase letters, digits or dashes", v)
		}
	}
	// nodeModule judges a node/module pair, as bindings, consumers and
	// consumer deletions name one.
	nodeModule := func(field, v string) {
		n, m, ok := strings.Cut(v, "/")
		if !ok || !ValidName(n) || !ValidName(m) {
			bad(field, "%q is not node/module, each a valid name", v)
		}
	}
	credential := func(field, v string) {
		if v != "" && !ValidCredentialName(v) {
			bad(field, "%q is not a valid credential name: words of letters, digits, dashes or underscores joined by single dots", v)
		}
	}
	dataPath := func(field, p string) {
		switch {
		case p == "":
			bad(field, "missing")
		case !ValidDataPath(p):
			bad(field, "%q must be absolute and clean, below /", p)
		case overlaps(p, HostOwnPath):
			bad(field, "%q overlaps %s, which the host keeps for itself", p, HostOwnPath)
		case overlaps(p, HostLogPath):
			bad(field, "%q overlaps %s, where the host keeps its modules' logs", p, HostLogPath)
		}
	}
	atMost := func(field string, n, max int) {
		if n > max {
			bad(field, "%d entries, at most %d", n, max)
		}
	}
	// twice reports v as done twice when an earlier entry had it, naming
	// that entry of list when list is given, and otherwise records v at i.
	// An empty v is not counted: it is reported as missing.
	twice := func(seen map[string]int, i int, field, v, done, list string) {
		j, ok := seen[v]
		switch {
		case v == "":
		case !ok:
			seen[v] = i
		case list == "":
			bad(field, "%q is %s twice", v, done)
		default:
			bad(field, "%q is %s twice (also %s[%d])", v, done, list, j)
		}
	}

	name("node", d.Node)
	switch d.Mode {
	case "", "adopted", "converged":
	default:
		bad("mode", "%q is not adopted or converged", d.Mode)
	}
	d.Host.problems(bad)
	if f := d.Filter; f != nil {
		if f.Kind != FilterNftables {
			bad("filter.kind", "%q is not %s", f.Kind, FilterNftables)
		}
		if err := OneMeshTable(f.Ruleset); err != nil {
			bad("filter.ruleset", "%v", err)
		}
	}
	atMost("modules", len(d.Modules), MaxModules)
	seenModules := map[string]int{}
	for i, m := range d.Modules {
		f := fmt.Sprintf("modules[%d]", i)
		name(f+".module", m.Module)
		twice(seenModules, i, f+".module", m.Module, "declared", "modules")
		switch {
		case m.Version == "":
			bad(f+".version", "missing")
		case !ValidVersion(m.Version):
			bad(f+".version", "%q is not a semantic version MAJOR.MINOR.PATCH, written without a v", m.Version)
		}

		atMost(f+".data", len(m.Data), MaxDataSets)
		seenData, seenPaths := map[string]int{}, map[string]int{}
		for j, ds := range m.Data {
			g := fmt.Sprintf("%s.data[%d]", f, j)
			name(g+".name", ds.Name)
			twice(seenData, j, g+".name", ds.Name, "named", "")
			dataPath(g+".path", ds.Path)
			twice(seenPaths, j, g+".path", ds.Path, "used", "")
			switch ds.Precious {
			case "irreplaceable", "costly", "rebuildable":
			default:
				bad(g+".precious", "%q is not irreplaceable, costly or rebuildable", ds.Precious)
			}
		}

		if m.Run != nil {
			for _, p := range m.Run.problems(m.Ports) {
				bad(f+".run"+p[0], "%s", p[1])
			}
		}
		if p := m.Prepare; p != nil {
			for _, pr := range p.problems() {
				bad(f+".prepare"+pr[0], "%s", pr[1])
			}
		}
		if m.MemoryMB < 0 {
			bad(f+".memory_mb", "must not be negative")
		}
		if a := m.Archive; a != nil {
			archiveProblems(f+".archive", a, bad)
		}

		atMost(f+".secrets", len(m.Secrets), MaxSecrets)
		seenSecrets := map[string]int{}
		for j, s := range m.Secrets {
			g := fmt.Sprintf("%s.secrets[%d].name", f, j)
			switch {
			case s.Name == "":
				bad(g, "missing")
			case !ValidSecretName(s.Name):
				bad(g, "%q is not a valid secret name: a lowercase letter, then up to 62 lowercase letters, digits, dashes or underscores", s.Name)
			default:
				// Only a valid name counts: an invalid one is reported
				// as such each time, never as repeated.
				twice(seenSecrets, j, g, s.Name, "named", "")
			}
		}

		atMost(f+".bindings", len(m.Bindings), MaxBindings)
		seenBindings := map[string]int{}
		for j, b := range m.Bindings {
			g := fmt.Sprintf("%s.bindings[%d]", f, j)
			name(g+".provision", b.Provision)
			twice(seenBindings, j, g+".provision", b.Provision, "bound", "")
			nodeModule(g+".from", b.From)
			credential(g+".credential_name", b.CredentialName)
		}

		atMost(f+".consumers", len(m.Consumers), MaxConsumers)
		seenConsumers := map[string]bool{}
		for j, c := range m.Consumers {
			g := fmt.Sprintf("%s.consumers[%d]", f, j)
			nodeModule(g+".consumer", c.Consumer)
			name(g+".provision", c.Provision)
			if key := c.Consumer + " " + c.Provision; seenConsumers[key] {
				bad(g, "consumer %q of %q is listed twice", c.Consumer, c.Provision)
			} else {
				seenConsumers[key] = true
			}
			credential(g+".credential_name", c.CredentialName)
		}

		for _, fl := range []struct {
			field string
			ls    []DeclaredLicence
		}{{"licences", m.Licences}, {"manages", m.Manages}} {
			field, ls := fl.field, fl.ls
			atMost(f+"."+field, len(ls), MaxSecrets)
			seen := map[string]int{}
			for j, l := range ls {
				g := fmt.Sprintf("%s.%s[%d].name", f, field, j)
				name(g, l.Name)
				if ValidName(l.Name) {
					// Only a valid name counts, as with secrets.
					twice(seen, j, g, l.Name, "named", "")
				}
			}
		}
		atMost(f+".waiting_for_licences", len(m.WaitingForLicences), MaxWaitingFor)
		for j, l := range m.WaitingForLicences {
			name(fmt.Sprintf("%s.waiting_for_licences[%d]", f, j), l)
		}

		atMost(f+".waiting_for", len(m.WaitingFor), MaxWaitingFor)
		for j, s := range m.WaitingFor {
			if !ValidSecretName(s) {
				bad(fmt.Sprintf("%s.waiting_for[%d]", f, j), "%q is not a valid secret name", s)
			}
		}
	}

	atMost("delete", len(d.Delete), MaxDeletions)
	for k, del := range d.Delete {
		f := fmt.Sprintf("delete[%d]", k)
		name(f+".module", del.Module)
		switch del.Kind {
		case "data":
			name(f+".target", del.Target)
			dataPath(f+".path", del.Path)
		case "consumer":
			nodeModule(f+".target", del.Target)
		default:
			bad(f+".kind", "%q is not data or consumer", del.Kind)
		}
	}

	for k, tk := range d.Taken {
		for _, p := range tk.problems(seenModules) {
			bad(fmt.Sprintf("taken[%d]%s", k, p[0]), "%s", p[1])
		}
	}
	return ps
}

// unitRule is a systemd service unit's name as a take may stop one: never
// an option (no leading dash), never a path.
var unitRule = regexp.MustCompile(`^[A-Za-z0-9_:@][A-Za-z0-9_:@.\\-]{0,250}\.service$`)

// problems judges a cutover, as field suffix and what is wrong: its module
// declared, its units service names, its processes real pids with a command.
func (t DeclaredTake) problems(declared map[string]int) [][2]string {
	var ps [][2]string
	if _, ok := declared[t.Module]; !ok {
		ps = append(ps, [2]string{".module", fmt.Sprintf("%q is not a module declared here", t.Module)})
	}
	if len(t.Units)+len(t.Processes) > 2*MaxLookHolders {
		ps = append(ps, [2]string{"", fmt.Sprintf("%d units and processes, at most %d", len(t.Units)+len(t.Processes), 2*MaxLookHolders)})
	}
	for i, u := range t.Units {
		if !unitRule.MatchString(u) {
			ps = append(ps, [2]string{fmt.Sprintf(".units[%d]", i), fmt.Sprintf("%q is not a service unit's name", u)})
		}
	}
	for i, p := range t.Processes {
		if p.Pid <= 1 || p.Command == "" || len(p.Command) > 256 {
			ps = append(ps, [2]string{fmt.Sprintf(".processes[%d]", i), fmt.Sprintf("pid %d (%q) is not a process a take may stop", p.Pid, p.Command)})
		}
	}
	return ps
}

// overlaps says whether one of two clean absolute paths is the other or
// lies inside it.
func overlaps(a, b string) bool {
	return a == b || strings.HasPrefix(a, b+"/") || strings.HasPrefix(b, a+"/")
}

// MaxRunWords bounds a declared command's words and env entries.
const MaxRunWords = 100

var (
	envNameRule = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)
	digestRule  = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// problems judges a prepare, as field suffix and what is wrong: a command
// the host execs, a timeout within its bounds.
func (p *Prepare) problems() [][2]string {
	var ps [][2]string
	ps = append(ps, commandProblems(".command", p.Command)...)
	if p.Timeout != "" {
		if d, err := time.ParseDuration(p.Timeout); err != nil || d < MinPrepareTimeout || d > MaxPrepareTimeout {
			ps = append(ps, [2]string{".timeout", fmt.Sprintf("%q is not a duration in [%s, %s]", p.Timeout, MinPrepareTimeout, MaxPrepareTimeout)})
		}
	}
	return ps
}

// commandProblems judges a command the host execs: words, the first
// naming the program, no NUL byte.
func commandProblems(field string, words []string) [][2]string {
	var ps [][2]string
	switch {
	case len(words) == 0:
		ps = append(ps, [2]string{field, "missing"})
	case len(words) > MaxRunWords:
		ps = append(ps, [2]string{field, fmt.Sprintf("%d words, at most %d", len(words), MaxRunWords)})
	case words[0] == "":
		ps = append(ps, [2]string{field + "[0]", "is empty"})
	}
	for i, w := range words {
		if strings.ContainsRune(w, 0) {
			ps = append(ps, [2]string{fmt.Sprintf("%s[%d]", field, i), "contains a NUL byte"})
		}
	}
	return ps
}

// problems judges how a module is run, as field suffix and what is wrong:
// what the host execs and the environment it gives (never a shell, never a
// variable of its own overridden).
func (r *Run) problems(ports []Port) [][2]string {
	var ps [][2]string
	bad := func(field, format string, args ...any) {
		ps = append(ps, [2]string{field, fmt.Sprintf(format, args...)})
	}
	command := func(field string, words []string) {
		ps = append(ps, commandProblems(field, words)...)
	}
	command(".command", r.Command)
	if len(r.Env) > MaxRunWords {
		bad(".env", "%d variables, at most %d", len(r.Env), MaxRunWords)
	}
	for _, k := range slices.Sorted(maps.Keys(r.Env)) {
		switch {
		case !envNameRule.MatchString(k):
			bad(".env."+k, "not a valid variable name")
		case strings.HasPrefix(k, "MESH_") || k == "PATH" || k == "HOME":
			bad(".env."+k, "is set by the host")
		}
		if strings.ContainsRune(r.Env[k], 0) {
			bad(".env."+k, "contains a NUL byte")
		}
	}
	duration := func(field, v string) {
		if v == "" {
			return
		}
		if d, err := time.ParseDuration(v); err != nil || d <= 0 || d > 10*time.Minute {
			bad(field, "%q is not a duration in (0, 10m]", v)
		}
	}
	duration(".stop_grace", r.StopGrace)
	if rd := r.Ready; rd != nil {
		n := 0
		for _, set := range []bool{rd.After != "", rd.Command != nil, rd.Port != ""} {
			if set {
				n++
			}
		}
		if n != 1 {
			bad(".ready", "exactly one of after, command or port, not %d", n)
		}
		if rd.Command != nil {
			command(".ready.command", rd.Command)
		}
		duration(".ready.after", rd.After)
		if rd.Port != "" && !slices.ContainsFunc(ports, func(p Port) bool { return p.Name == rd.Port }) {
			bad(".ready.port", "%q is not a declared port", rd.Port)
		}
	}
	return ps
}
