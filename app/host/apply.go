package host

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"mesh-controller/app/protocol"
)

// applied is what the host remembers of the last declaration it applied.
type applied struct {
	Serial int64 `json:"serial"`
	// Files are the files it wrote, relative to the root; removed when a later
	// declaration no longer declares them.
	Files []string `json:"files"`
	// Data are the data sets declared, for data reports; never removed by the host.
	Data []dataSet `json:"data"`
	// Deleted are the deletions carried out, reported until no longer declared.
	Deleted []protocol.DeclaredDeletion `json:"deleted,omitempty"`
}

type dataSet struct {
	Module   string `json:"module"`
	Name     string `json:"name"`
	Path     string `json:"path"`
	Precious string `json:"precious"`
}

func loadApplied(dir string) (applied, error) {
	var a applied
	b, err := os.ReadFile(filepath.Join(dir, fileApplied))
	if errors.Is(err, os.ErrNotExist) {
		return a, nil
	}
	if err != nil {
		return a, err
	}
	return a, json.Unmarshal(b, &a)
}

func saveApplied(dir string, a applied) error {
	b, err := json.MarshalIndent(a, "", "  ")
	if err != nil {
		return err
	}
	return writeFile(filepath.Join(dir, fileApplied), b)
}

var moduleName = regexp.MustCompile(`^[a-z][a-z0-9-]{0,62}$`)

// modulesDir is where, under the root, each module's part of the declaration is written.
const modulesDir = "etc/mesh/modules"

// Files lists, for one declared module, the files the host writes under its
// root (relative, slash-separated): its part of the declaration, and its
// settings when it has any.
func Files(m protocol.DeclaredModule) []string {
	dir := path.Join(modulesDir, m.Module)
	files := []string{path.Join(dir, "module.json")}
	if len(m.Settings) > 0 && string(m.Settings) != "null" {
		files = append(files, path.Join(dir, "settings.json"))
	}
	for _, s := range m.Secrets {
		files = append(files, path.Join(dir, "secrets", s.Name))
	}
	for _, b := range m.Bindings {
		if b.Credential != "" {
			files = append(files, path.Join(dir, "bindings", b.Provision+".credential"))
		}
	}
	for _, c := range m.Consumers {
		if c.Credential != "" && c.State != "retired" {
			files = append(files, path.Join(dir, "consumers", strings.ReplaceAll(c.Consumer, "/", "_"), c.Provision+".credential"))
		}
	}
	return files
}

// sealedFile is a file of a module that holds a value opened from a sealed
// copy, and the label the copy must carry.
type sealedFile struct {
	rel    string
	sealed string
	label  protocol.Label
}

// sealedFiles lists the secrets and credentials a declared module carries.
func sealedFiles(node string, m protocol.DeclaredModule) []sealedFile {
	dir := path.Join(modulesDir, m.Module)
	var out []sealedFile
	for _, s := range m.Secrets {
		out = append(out, sealedFile{path.Join(dir, "secrets", s.Name), s.Sealed, protocol.Label{Node: node, Module: m.Module, Name: s.Name, Version: s.Version}})
	}
	for _, b := range m.Bindings {
		if b.Credential == "" {
			continue
		}
		pn, pm, _ := strings.Cut(b.From, "/")
		out = append(out, sealedFile{path.Join(dir, "bindings", b.Provision+".credential"), b.Credential,
			protocol.Label{Node: pn, Module: pm, Name: b.CredentialName, Version: b.CredentialVersion}})
	}
	for _, c := range m.Consumers {
		if c.Credential == "" || c.State == "retired" {
			continue
		}
		out = append(out, sealedFile{path.Join(dir, "consumers", strings.ReplaceAll(c.Consumer, "/", "_"), c.Provision+".credential"), c.Credential,
			protocol.Label{Node: node, Module: m.Module, Name: c.CredentialName, Version: c.CredentialVersion}})
	}
	return out
}

// apply verifies and applies one declaration under root, returning the
// report to send. Refused: a signature that does not verify against the
// controller key from join, another node's declaration, a serial not above
// the last applied.
func apply(st *State, root string, last applied, env protocol.Envelope) (protocol.AppliedBody, applied) {
	start := time.Now()
	var tiers []protocol.Tier
	tier := func(name string, since time.Time) {
		tiers = append(tiers, protocol.Tier{Tier: name, MS: float64(time.Since(since).Microseconds()) / 1000})
	}
	fail := func(serial int64, format string, args ...any) (protocol.AppliedBody, applied) {
		return protocol.AppliedBody{Serial: serial, OK: false, Error: fmt.Sprintf(format, args...), Tiers: tiers,
			TotalMS: float64(time.Since(start).Microseconds()) / 1000}, last
	}

	t := time.Now()
	d, err := env.Verify(st.ControllerKey)
	if err != nil {
		return fail(0, "refused: %v against the controller key received at join", err)
	}
	if d.Node != st.Node {
		return fail(d.Serial, "refused: declaration %d is for node %q, this is %q", d.Serial, d.Node, st.Node)
	}
	if d.Serial <= last.Serial {
		return fail(d.Serial, "refused: serial %d is not above the last applied %d (replayed or old)", d.Serial, last.Serial)
	}
	var raw struct {
		Modules []json.RawMessage `json:"modules"`
	}
	if err := json.Unmarshal([]byte(env.Declaration), &raw); err != nil {
		return fail(d.Serial, "refused: modules: %v", err)
	}
	for _, m := range d.Modules {
		if !moduleName.MatchString(m.Module) {
			return fail(d.Serial, "refused: module name %q is not valid", m.Module)
		}
		for _, ds := range m.Data {
			if !path.IsAbs(ds.Path) || path.Clean(ds.Path) != ds.Path || ds.Path == "/" {
				return fail(d.Serial, "refused: module %s data %s: path %q must be absolute and clean", m.Module, ds.Name, ds.Path)
			}
		}
	}
	tier("verify", t)

	t = time.Now()
	next := applied{Serial: d.Serial}
	var waiting []string
	for i, m := range d.Modules {
		files := map[string][]byte{}
		sealed := map[string]bool{}
		for _, sf := range sealedFiles(st.Node, m) {
			sealed[sf.rel] = true
		}
		for _, rel := range Files(m) {
			if sealed[rel] {
				continue // written below, opened with the host's own key
			}
			doc := raw.Modules[i]
			if path.Base(rel) == "settings.json" {
				doc = m.Settings
			}
			var v any
			json.Unmarshal(doc, &v)
			b, _ := json.MarshalIndent(v, "", "  ")
			files[rel] = append(b, '\n')
		}
		for rel, content := range files {
			full := filepath.Join(root, filepath.FromSlash(rel))
			if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
				return fail(d.Serial, "write %s: %v", rel, err)
			}
			if err := writeFile(full, content); err != nil {
				return fail(d.Serial, "write %s: %v", rel, err)
			}
			next.Files = append(next.Files, rel)
		}
	}
	tier("files", t)

	// Secrets: each opened with this host's age identity, inside a declaration
	// whose signature verified, checked to be the one named, written 0600.
	t = time.Now()
	for _, m := range d.Modules {
		if len(m.WaitingFor) > 0 {
			waiting = append(waiting, fmt.Sprintf("%s waits for %v", m.Module, m.WaitingFor))
		}
		for _, sf := range sealedFiles(st.Node, m) {
			rel := sf.rel
			v, _, err := protocol.OpenSealed(sf.sealed, sf.label, st.Age)
			if err != nil {
				return fail(d.Serial, "%s of %s: %v", path.Base(rel), m.Module, err)
			}
			full := filepath.Join(root, filepath.FromSlash(rel))
			err = os.MkdirAll(filepath.Dir(full), 0o700)
			if err == nil {
				err = writeFile(full, v.Reveal())
			}
			if err != nil {
				return fail(d.Serial, "write %s of %s: %v", path.Base(rel), m.Module, err)
			}
			next.Files = append(next.Files, rel)
		}
	}
	sort.Strings(next.Files)
	tier("secrets", t)

	t = time.Now()
	for _, m := range d.Modules {
		for _, ds := range m.Data {
			if err := os.MkdirAll(filepath.Join(root, filepath.FromSlash(ds.Path)), 0o750); err != nil {
				return fail(d.Serial, "module %s data %s: %v", m.Module, ds.Name, err)
			}
			next.Data = append(next.Data, dataSet{Module: m.Module, Name: ds.Name, Path: ds.Path, Precious: ds.Precious})
		}
	}
	tier("data", t)

	// Deletions a person asked for with cleanup delete: the only data a host
	// ever removes, and only because a verified declaration says so.
	t = time.Now()
	for _, del := range d.Delete {
		var target string
		switch del.Kind {
		case "data":
			if !path.IsAbs(del.Path) || path.Clean(del.Path) != del.Path || del.Path == "/" {
				return fail(d.Serial, "refused: deletion of %s %s: path %q must be absolute and clean", del.Module, del.Target, del.Path)
			}
			target = filepath.Join(root, filepath.FromSlash(del.Path))
		case "consumer":
			target = filepath.Join(root, modulesDir, del.Module, "consumers", strings.ReplaceAll(del.Target, "/", "_"))
		default:
			return fail(d.Serial, "refused: deletion of kind %q", del.Kind)
		}
		if err := os.RemoveAll(target); err != nil {
			return fail(d.Serial, "delete %s of %s: %v", del.Target, del.Module, err)
		}
		next.Deleted = append(next.Deleted, del)
	}
	tier("delete", t)

	// Data sets no longer declared stay where they are, and are still
	// reported (their size is what cleanup shows) until deleted.
	declared := map[string]bool{}
	for _, ds := range next.Data {
		declared[ds.Module+"/"+ds.Name] = true
	}
	gone := map[string]bool{}
	for _, del := range next.Deleted {
		if del.Kind == "data" {
			gone[del.Module+"/"+del.Target] = true
		}
	}
	for _, ds := range last.Data {
		if !declared[ds.Module+"/"+ds.Name] && !gone[ds.Module+"/"+ds.Name] {
			next.Data = append(next.Data, ds)
		}
	}

	// Files an earlier declaration made and this one no longer declares go;
	// data directories never do: only a declaration that says so explicitly
	// may delete data (above).
	t = time.Now()
	keep := map[string]bool{}
	for _, f := range next.Files {
		keep[f] = true
	}
	for _, f := range last.Files {
		if keep[f] {
			continue
		}
		full := filepath.Join(root, filepath.FromSlash(f))
		if err := os.Remove(full); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fail(d.Serial, "remove %s: %v", f, err)
		}
		os.Remove(filepath.Dir(full)) // the module's directory, if now empty
	}
	tier("cleanup", t)

	return protocol.AppliedBody{Serial: d.Serial, OK: true, Tiers: tiers, Waiting: waiting, TotalMS: float64(time.Since(start).Microseconds()) / 1000}, next
}

// dataReport measures every declared data set under root.
func dataReport(root string, a applied) protocol.DataBody {
	sets := make([]protocol.DataSet, 0, len(a.Data))
	for _, ds := range a.Data {
		var total int64
		filepath.WalkDir(filepath.Join(root, filepath.FromSlash(ds.Path)), func(_ string, e fs.DirEntry, err error) error {
			if err == nil && e.Type().IsRegular() {
				if info, err := e.Info(); err == nil {
					total += info.Size()
				}
			}
			return nil
		})
		sets = append(sets, protocol.DataSet{Module: ds.Module, Name: ds.Name, Path: ds.Path, Bytes: total, Precious: ds.Precious})
	}
	return protocol.DataBody{Sets: sets, Deleted: a.Deleted}
}
