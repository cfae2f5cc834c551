package host

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"mesh-controller/app/archive"
	"mesh-controller/app/protocol"
)

// runRecord is what the host keeps of each declared module to run it: what
// the supervisor needs, remembered in applied.json so that a host started
// again runs what it was last declared before it hears the controller.
type runRecord struct {
	Module  string `json:"module"`
	Version string `json:"version"`
	Serial  int64  `json:"serial"`
	// DeclaredAt is when the controller issued that declaration.
	DeclaredAt time.Time     `json:"declared_at"`
	Digest     string        `json:"digest"`
	Run        *protocol.Run `json:"run,omitempty"`
	// Archive is the built archive it runs from, unpacked in its version's
	// directory; Kept are the versions whose directories are kept (this
	// one and the one before: a roll-back finds it there).
	Archive *protocol.Archive `json:"archive,omitempty"`
	Kept    []string          `json:"kept,omitempty"`
	Ports   []protocol.Port   `json:"ports,omitempty"`
	// MemoryMB is the manifest's requires.memory_mb.
	MemoryMB   int64    `json:"memory_mb,omitempty"`
	WaitingFor []string `json:"waiting_for,omitempty"`
	// Data are its data sets' paths as declared; Settings says it has
	// settings.json; Creds its own broker user; Sealed its sealed files
	// (relative to the root).
	Data     map[string]string `json:"data,omitempty"`
	Settings bool              `json:"settings,omitempty"`
	Creds    bool              `json:"creds,omitempty"`
	Sealed   []string          `json:"sealed,omitempty"`
	// Licences are the licences it holds, each named in its environment.
	Licences []string `json:"licences,omitempty"`
	// Manages are the licences whose refresh tokens it holds.
	Manages []string `json:"manages,omitempty"`
	// BackupLines says it holds the backup seat: its host writes the
	// declaration's backup lines to its lines file (MESH_BACKUP_LINES).
	BackupLines bool `json:"backup_lines,omitempty"`
}

// runRecords are the modules of a verified declaration as the host runs
// them. A module whose part of the declaration is byte for byte what it was
// keeps its digest and the serial that started it: the supervisor leaves it
// running.
func runRecords(d protocol.Declaration, raw []json.RawMessage, last []runRecord) []runRecord {
	before := map[string]runRecord{}
	for _, r := range last {
		before[r.Module] = r
	}
	out := make([]runRecord, 0, len(d.Modules))
	for i, m := range d.Modules {
		sum := sha256.Sum256(runPart(raw[i]))
		r := runRecord{Module: m.Module, Version: m.Version, Serial: d.Serial, DeclaredAt: d.IssuedAt, Digest: hex.EncodeToString(sum[:]), Run: m.Run, Ports: m.Ports,
			MemoryMB: m.MemoryMB, WaitingFor: slices.Clip(m.WaitingFor), Data: map[string]string{}, Creds: m.BrokerCreds != ""}
		if old, ok := before[m.Module]; ok && old.Digest == r.Digest {
			r.Serial, r.DeclaredAt = old.Serial, old.DeclaredAt
		}
		if m.Archive != nil {
			a := *m.Archive
			r.Archive = &a
			r.Kept = []string{m.Version}
			if old, ok := before[m.Module]; ok && old.Archive != nil {
				if old.Version != m.Version {
					r.Kept = []string{old.Version, m.Version}
				} else {
					r.Kept = old.Kept // the one before stays kept
				}
			}
		}
		_, settings := protocol.DocumentFiles(m)
		r.Settings = settings != ""
		r.BackupLines = holdsBackupSeat(m)
		for _, ds := range m.Data {
			r.Data[ds.Name] = ds.Path
		}
		for _, sf := range protocol.SealedFiles(d.Node, m) {
			r.Sealed = append(r.Sealed, sf.Rel)
		}
		for _, l := range m.Licences {
			r.Licences = append(r.Licences, l.Name)
		}
		for _, l := range m.Manages {
			r.Manages = append(r.Manages, l.Name)
		}
		// A licence its manifest needs and it does not hold keeps it from
		// starting, as a secret not given yet does.
		for _, l := range m.WaitingForLicences {
			r.WaitingFor = append(r.WaitingFor, "licence "+l)
		}
		out = append(out, r)
	}
	return out
}

// bindingsFile is, beside module.json, where a module finds each provision
// it is bound to (MESH_BINDINGS).
const bindingsFile = protocol.BindingsFile

// boundProvision is one provision in bindings.json.
type boundProvision struct {
	// From is the provider as node/module; Address is node:port (the node's
	// name, as the mesh's overlay names it), when the provider gives a port.
	From    string `json:"from"`
	Address string `json:"address,omitempty"`
	// Credential is the absolute path of the credential file, if any.
	Credential string `json:"credential,omitempty"`
}

// bindingsDocument is a module's bindings.json for a host whose root is root.
func bindingsDocument(root string, m protocol.DeclaredModule) json.RawMessage {
	doc := map[string]boundProvision{}
	dir := path.Join(protocol.ModulesDir, m.Module)
	for _, b := range m.Bindings {
		bp := boundProvision{From: b.From}
		if node, _, ok := strings.Cut(b.From, "/"); ok && b.Port > 0 {
			bp.Address = node + ":" + itoa(b.Port)
		}
		if b.Credential != "" {
			bp.Credential = filepath.Join(root, filepath.FromSlash(path.Join(dir, "bindings", b.Provision+".credential")))
		}
		doc[b.Provision] = bp
	}
	out, _ := json.Marshal(doc)
	return out
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// specs are the supervisor's specs for the modules of a declaration, under
// a root, for a host whose broker is at brokerURLs.
func specs(st *State, root string, records []runRecord) []ModuleSpec {
	out := make([]ModuleSpec, 0, len(records))
	for _, r := range records {
		if r.Run == nil || len(r.Run.Command) == 0 {
			continue // nothing to run: its files are all it has
		}
		workDir, env := moduleEnv(st, root, r)
		ports := map[string]int{}
		for _, p := range r.Ports {
			ports[p.Name] = p.Port
		}
		grace, _ := time.ParseDuration(r.Run.StopGrace) // judged by Problems; "" is the default
		archive := ""
		if r.Archive != nil {
			archive = r.Archive.Digest
		}
		out = append(out, ModuleSpec{Module: r.Module, Version: r.Version, Archive: archive, Serial: r.Serial, Fingerprint: r.Digest, Dir: workDir,
			Command: r.Run.Command, Env: env, Ready: r.Run.Ready, Ports: ports, StopGrace: grace, MemoryMB: r.MemoryMB,
			WaitingFor: r.WaitingFor})
	}
	return out
}

// moduleEnv is where a module runs and its whole environment: what the
// supervisor starts it with, and what its backup's before hook runs with.
// Each declared port is MESH_PORT_<NAME> (its name upper-cased, '-' as
// '_'); the backup seat's holder has MESH_BACKUP_LINES, its lines file,
// which its host rewrites whenever the lines change without restarting
// it: the module reads the file again when it changes.
func moduleEnv(st *State, root string, r runRecord) (workDir string, env []string) {
	abs := func(rel string) string { return filepath.Join(root, filepath.FromSlash(rel)) }
	dir := abs(path.Join(protocol.ModulesDir, r.Module))
	// A built module runs from its archive's directory; HOME stays its
	// module's directory.
	workDir = dir
	if r.Archive != nil {
		workDir = abs(versionDir(r.Module, r.Version))
	}
	env = []string{
		"MESH_NODE=" + st.Node, "MESH_MODULE=" + r.Module, "MESH_VERSION=" + r.Version,
		"MESH_SECRETS_DIR=" + filepath.Join(dir, "secrets"),
		"MESH_BINDINGS=" + filepath.Join(dir, bindingsFile),
		"MESH_BROKER=" + strings.Join(st.BrokerURLs, ","),
		"PATH=" + hostPath(), "HOME=" + dir,
	}
	if r.Settings {
		env = append(env, "MESH_SETTINGS="+filepath.Join(dir, "settings.json"))
	}
	if r.Creds {
		env = append(env, "MESH_BROKER_CREDS="+filepath.Join(dir, protocol.BrokerCredsName))
	}
	if r.BackupLines {
		env = append(env, protocol.BackupLinesEnv+"="+filepath.Join(dir, protocol.BackupLinesName))
	}
	names := make([]string, 0, len(r.Data))
	for name := range r.Data {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		p := abs(strings.TrimPrefix(r.Data[name], "/"))
		env = append(env, envName("MESH_DATA_", name)+"="+p)
	}
	for _, p := range r.Ports {
		env = append(env, envName("MESH_PORT_", p.Name)+"="+strconv.Itoa(p.Port))
	}
	for _, l := range r.Licences {
		env = append(env, protocol.LicenceEnv(l)+"="+abs(protocol.LicenceFile(r.Module, l)))
	}
	for _, l := range r.Manages {
		env = append(env, protocol.RefreshEnv(l)+"="+abs(protocol.RefreshFile(r.Module, l)))
	}
	if r.Run != nil {
		keys := make([]string, 0, len(r.Run.Env))
		for k := range r.Run.Env {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			env = append(env, k+"="+r.Run.Env[k])
		}
	}
	return workDir, env
}

// envName is a variable of a family named for a data set or port: the
// name upper-cased, '-' as '_'.
func envName(prefix, name string) string {
	return prefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// hostPath is the host's PATH, which a module's bare command is looked up
// on and which it inherits.
func hostPath() string {
	if p := os.Getenv("PATH"); p != "" {
		return p
	}
	return "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
}

// logsChunk bounds one answer of a log, well under a host's largest
// message.
const logsChunk = 256 << 10

// chunks splits lines into answers of at most logsChunk bytes, each line
// clipped to protocol.MaxLogLine.
func chunks(lines []string) [][]string {
	var out [][]string
	var cur []string
	size := 0
	for _, l := range lines {
		if len(l) > protocol.MaxLogLine {
			l = l[:protocol.MaxLogLine]
		}
		if size+len(l) > logsChunk && len(cur) > 0 {
			out = append(out, cur)
			cur, size = nil, 0
		}
		cur = append(cur, l)
		size += len(l) + 4
	}
	return append(out, cur)
}

// answerLogs answers the controller's request for a module's log: the last
// lines, then, when following, each new part as a request to the asker,
// until nobody answers one or the host stops.
func (r *Runner) answerLogs(ctx context.Context, nc *nats.Conn, m *nats.Msg) {
	var ask protocol.LogsAsk
	if err := json.Unmarshal(m.Data, &ask); err != nil || m.Reply == "" || !protocol.ValidName(ask.Module) {
		r.respond(nc, m.Reply, protocol.LogsAnswer{Error: "a logs request names one module", End: true})
		return
	}
	n := min(max(ask.Lines, 0), protocol.MaxLogLines)
	if !ask.Follow {
		lines, err := r.sup.Tail(ask.Module, n)
		if err != nil {
			r.respond(nc, m.Reply, r.noLog(ask.Module, err))
			return
		}
		parts := chunks(lines)
		for i, p := range parts {
			r.respond(nc, m.Reply, protocol.LogsAnswer{Lines: p, End: i == len(parts)-1})
		}
		return
	}
	sent := false
	send := func(lines []string) error {
		sent = true
		for _, p := range chunks(lines) {
			b, _ := json.Marshal(protocol.LogsAnswer{Lines: p})
			if _, err := nc.Request(m.Reply, b, protocol.AnswerTimeout); err != nil {
				return err // the follower is gone
			}
		}
		return nil
	}
	// The last lines and the new ones come from one Follow, so a line
	// written between them is neither lost nor sent twice.
	if err := r.sup.Follow(ctx, ask.Module, n, send); err != nil && !sent {
		r.respond(nc, m.Reply, r.noLog(ask.Module, err))
	}
}

// noLog is the answer when a module's log cannot be read.
func (r *Runner) noLog(module string, err error) protocol.LogsAnswer {
	return protocol.LogsAnswer{Error: "no log of " + module + " on " + r.State.Node + ": " + err.Error(), End: true}
}

func (r *Runner) respond(nc *nats.Conn, reply string, a protocol.LogsAnswer) {
	if reply == "" {
		return
	}
	if a.Lines == nil {
		a.Lines = []string{}
	}
	b, _ := json.Marshal(a)
	if err := nc.Publish(reply, b); err != nil {
		r.warnf("answer a logs request: %v", err)
	}
}

// adoptRuns runs what the declaration this host applied last declares, when
// it was applied by a mesh-host that kept no runs (one from before modules
// were run): the answer to the ask made on connecting carries it again, and
// its modules start without its files being written again. It says whether
// it took the delivery; r.mu is held.
func (r *Runner) adoptRuns(dl delivery) bool {
	if !dl.asked || r.last.Serial == 0 || r.last.Runs != nil {
		return false
	}
	d, err := r.State.Verify(dl.env)
	if err != nil || d.Node != r.State.Node || d.Serial != r.last.Serial || len(d.Problems()) > 0 {
		return false
	}
	var raw struct {
		Modules []json.RawMessage `json:"modules"`
	}
	if json.Unmarshal([]byte(dl.env.Declaration), &raw) != nil || len(raw.Modules) != len(d.Modules) {
		return false
	}
	if !slices.ContainsFunc(d.Modules, func(m protocol.DeclaredModule) bool { return m.Run != nil }) {
		return false // nothing to run: the declaration stands as applied
	}
	next := r.last
	next.Runs = runRecords(d, raw.Modules, nil)
	if err := saveApplied(r.State.Dir, next); err != nil {
		r.warnf("remember the modules of declaration %d: %v", d.Serial, err)
		return true
	}
	r.last = next
	r.logf("declaration %d, applied before this host ran modules, now runs %d of them", d.Serial, len(specs(r.State, r.Root, next.Runs)))
	r.sup.Apply(specs(r.State, r.Root, next.Runs))
	return true
}

// fetcher brings archives from the controller over nc (a piece at a time,
// from the broker's object store: archive.Fetch) into the state dir, each
// verified against its digest before it is used.
func (r *Runner) fetcher(nc *nats.Conn) fetcher {
	return func(a protocol.Archive) (string, error) {
		// Ended with the host too: a fetch of minutes does not hold it.
		ctx, cancel := context.WithTimeout(r.ctx, archiveFetchTimeout(a.Bytes))
		defer cancel()
		tmp := filepath.Join(r.State.Dir, "archives")
		if err := os.MkdirAll(tmp, 0o700); err != nil {
			return "", err
		}
		// Streamed from the broker into a file, hashed on the way.
		pr, pw := io.Pipe()
		go func() {
			_, err := archive.Fetch(ctx, nc, protocol.NodeSubject(r.State.Node, protocol.ArchiveRead), a.Digest, pw)
			pw.CloseWithError(err)
		}()
		file, size, err := archive.Receive(pr, tmp, a.Digest, protocol.MaxArchiveBytes)
		pr.Close()
		if err != nil {
			return "", fmt.Errorf("fetch %s: %w", a.Digest, err)
		}
		if size != a.Bytes {
			os.Remove(file)
			return "", fmt.Errorf("%w: %d bytes, declared %d", archive.ErrDigest, size, a.Bytes)
		}
		r.metrics.fetchedArchive(size)
		return file, nil
	}
}

// archiveFetchTimeout allows a minute, plus a second per 10 MB.
func archiveFetchTimeout(bytes int64) time.Duration {
	return time.Minute + time.Duration(bytes/10_000_000)*time.Second
}
