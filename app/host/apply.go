package host

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"mesh-controller/app/archive"
	"mesh-controller/app/protocol"
)

// applied is what the host remembers of the last declaration it applied.
type applied struct {
	Serial int64 `json:"serial"`
	// Signature is the controller's signature of the declaration applied:
	// the same serial with the same signature is that declaration again.
	Signature string `json:"signature,omitempty"`
	// Files are the files it wrote, relative to the root; removed when a later
	// declaration no longer declares them.
	Files []string `json:"files"`
	// Data are the data sets declared, for data reports; never removed by the host.
	Data []dataSet `json:"data"`
	// Deleted are the deletions carried out, reported until no longer declared.
	Deleted []protocol.DeclaredDeletion `json:"deleted,omitempty"`
	// Runs are the declared modules as the supervisor runs them.
	Runs []runRecord `json:"runs,omitempty"`
	// Taken are the digests of the cutovers done (take): each is done once.
	Taken []string `json:"taken,omitempty"`
	// Overlay is the overlay declared: brought up again when the host
	// starts.
	Overlay *protocol.DeclaredOverlay `json:"overlay,omitempty"`
	// Backups are the node's data sets it backs up when asked, each with
	// its access still sealed (opened only for a backup, never kept open).
	Backups []protocol.DeclaredBackup `json:"backups,omitempty"`
}

// holdsBackupSeat says a module holds the backup seat: its host writes the
// declaration's backup lines for it (protocol.Files lists the file too).
func holdsBackupSeat(m protocol.DeclaredModule) bool { return m.HoldsBackup }

// linesFile is, beneath the root, the backup seat holder's lines file.
func linesFile(module string) string {
	return path.Join(protocol.ModulesDir, module, protocol.BackupLinesName)
}

type dataSet struct {
	Module   string `json:"module"`
	Name     string `json:"name"`
	Path     string `json:"path"`
	Precious string `json:"precious"`
	// Made says the host made its directory: only such a one is given to
	// the module's user.
	Made bool `json:"made,omitempty"`
}

// userIDs gives a module's own user and group, made if missing; nil when
// modules run as the host's user.
type userIDs func(module string) (uid, gid int, err error)

// fetcher brings an archive from the broker's object store into a local
// file, its sha256 verified; the caller removes the file.
type fetcher func(a protocol.Archive) (path string, err error)

// loadJSON reads the JSON file name in dir into a T; a file not there is
// the zero T.
func loadJSON[T any](dir, name string) (T, error) {
	var v T
	b, err := os.ReadFile(filepath.Join(dir, name))
	if errors.Is(err, os.ErrNotExist) {
		return v, nil
	}
	if err != nil {
		return v, err
	}
	return v, json.Unmarshal(b, &v)
}

// saveJSON writes v as the JSON file name in dir (writeFile: 0600, whole
// or not at all).
func saveJSON(dir, name string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return writeFile(filepath.Join(dir, name), b)
}

func loadApplied(dir string) (applied, error) { return loadJSON[applied](dir, fileApplied) }

func saveApplied(dir string, a applied) error { return saveJSON(dir, fileApplied, a) }

// maxReported is how many of a refused declaration's problems the report
// lists; the count says how many more there were.
const maxReported = 10

// apply verifies and applies one declaration beneath dir, returning the
// report to send. Refused: a signature that does not verify against the
// controller key from join, another node's declaration, a serial not above
// the last applied, a body with any of protocol's Problems, and a path that
// would pass through a link beneath the root; all but the last before any
// file is touched, and that one too when the link is there to be seen.
func apply(st *State, dir string, last applied, env protocol.Envelope, ids userIDs, fetch fetcher) (protocol.AppliedBody, applied) {
	start := time.Now()
	r := root{dir: dir}
	var tiers []protocol.Tier
	tier := func(name string, since time.Time) {
		tiers = append(tiers, protocol.Tier{Tier: name, MS: float64(time.Since(since).Microseconds()) / 1000})
	}
	fail := func(serial int64, format string, args ...any) (protocol.AppliedBody, applied) {
		return protocol.AppliedBody{Serial: serial, OK: false, Error: fmt.Sprintf(format, args...), Tiers: tiers,
			TotalMS: float64(time.Since(start).Microseconds()) / 1000}, last
	}
	// failPath reports a failed file operation (what, if given, says which);
	// one the root refused (an escape, a link) is a refusal, not an accident.
	failPath := func(serial int64, what string, err error) (protocol.AppliedBody, applied) {
		msg := err.Error()
		if what != "" {
			msg = what + ": " + msg
		}
		if errors.Is(err, ErrSymlink) || errors.Is(err, ErrNotBeneath) {
			msg = "refused: " + msg
		}
		return fail(serial, "%s", msg)
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
	if ps := d.Problems(); len(ps) > 0 {
		more := ""
		if len(ps) > maxReported {
			more = fmt.Sprintf(" (and %d more)", len(ps)-maxReported)
			ps = ps[:maxReported]
		}
		return fail(d.Serial, "refused: %s%s", strings.Join(ps, "; "), more)
	}
	if err := checkOverlay(d.Overlay, st.WireGuard); err != nil {
		return fail(d.Serial, "refused: the overlay: %v", err)
	}
	var raw struct {
		Modules []json.RawMessage `json:"modules"`
	}
	if err := json.Unmarshal([]byte(env.Declaration), &raw); err != nil {
		return fail(d.Serial, "refused: modules: %v", err)
	}

	// Every path this declaration touches, checked before any is: a link
	// planted on one refuses the whole declaration, not half of it. Each
	// module's files (protocol.Files: its documents, then its sealed files)
	// are worked out once, here, and written below from these lists only.
	type document struct {
		rel  string
		body json.RawMessage
	}
	docs := make([][]document, len(d.Modules))
	sealed := make([][]protocol.SealedFile, len(d.Modules))
	declared := map[string]bool{}
	var touched []string
	for i, m := range d.Modules {
		module, settings := protocol.DocumentFiles(m)
		docs[i] = []document{{module, raw.Modules[i]}}
		if settings != "" {
			docs[i] = append(docs[i], document{settings, m.Settings})
		}
		docs[i] = append(docs[i], document{path.Join(protocol.ModulesDir, m.Module, protocol.BindingsFile), bindingsDocument(dir, m)})
		sealed[i] = protocol.SealedFiles(st.Node, m)
		if holdsBackupSeat(m) {
			rel := linesFile(m.Module)
			declared[rel] = true
			touched = append(touched, rel)
		}
		for _, doc := range docs[i] {
			declared[doc.rel] = true
			touched = append(touched, doc.rel)
		}
		for _, sf := range sealed[i] {
			declared[sf.Rel] = true
			touched = append(touched, sf.Rel)
		}
		for _, ds := range m.Data {
			rel, err := dataRel(ds.Path)
			if err != nil {
				return failPath(d.Serial, fmt.Sprintf("module %s data %s", m.Module, ds.Name), err)
			}
			touched = append(touched, rel)
		}
	}
	targets := make([]string, len(d.Delete))
	for i, del := range d.Delete {
		if targets[i], err = deletionTarget(del); err != nil {
			return failPath(d.Serial, fmt.Sprintf("deletion of %s %s", del.Module, del.Target), err)
		}
		touched = append(touched, targets[i])
	}
	for _, f := range last.Files {
		if !declared[f] && beneath(f) {
			touched = append(touched, path.Dir(f)) // a link in the file's own place is removed as a link
		}
	}
	for _, rel := range touched {
		if err := r.check(rel); err != nil {
			return failPath(d.Serial, "", err) // the error names the path
		}
	}
	tier("verify", t)

	// Archives: each built module's, fetched, verified and unpacked into its
	// version's directory before any file is written, so that a declaration
	// whose archive cannot be had is refused whole. One unpacked already is
	// not fetched again.
	t = time.Now()
	for _, m := range d.Modules {
		if m.Archive == nil {
			continue
		}
		if err := unpackArchive(r, m, last.Runs, fetch); err != nil {
			return fail(d.Serial, "refused: archive of %s %s: %v", m.Module, m.Version, err)
		}
	}
	tier("archives", t)

	// Cutovers of modules taken onto this adopted node, before any of them
	// starts: what a person approved is stopped; the data is not touched.
	t = time.Now()
	taken, err := cutover(d.Taken, last.Taken)
	if err != nil {
		return fail(d.Serial, "cutover: %v", err)
	}
	if len(d.Taken) > 0 {
		tier("cutover", t)
	}

	t = time.Now()
	next := applied{Serial: d.Serial, Signature: env.Signature, Runs: runRecords(d, raw.Modules, last.Runs), Taken: taken, Overlay: d.Overlay,
		Backups: d.Backups}
	var waiting []string
	for i, m := range d.Modules {
		// The sealed files are written below, opened with the host's own key.
		for _, doc := range docs[i] {
			rel := doc.rel
			var v any
			if err := json.Unmarshal(doc.body, &v); err != nil {
				return fail(d.Serial, "refused: %s of %s is not JSON: %v", path.Base(rel), m.Module, err)
			}
			b, err := json.MarshalIndent(v, "", "  ")
			if err != nil {
				return fail(d.Serial, "write %s of %s: %v", path.Base(rel), m.Module, err)
			}
			// Not secret: readable by the module's user (a module's sealed
			// values in module.json open only with the host's key).
			if err := r.writeFileAs(rel, append(b, '\n'), 0o755, access{perm: 0o644, gid: -1}); err != nil {
				return failPath(d.Serial, "write "+rel, err)
			}
			next.Files = append(next.Files, rel)
		}
	}
	tier("files", t)

	// Secrets: each opened with this host's age identity, inside a declaration
	// whose signature verified, checked to be the one named, written 0600.
	t = time.Now()
	owners := map[string][2]int{}
	for _, m := range d.Modules {
		uid, gid := -1, -1
		if ids != nil && m.Run != nil {
			var err error
			if uid, gid, err = ids(m.Module); err != nil {
				return fail(d.Serial, "module %s: %v", m.Module, err)
			}
		}
		owners[m.Module] = [2]int{uid, gid}
	}
	for i, m := range d.Modules {
		if len(m.WaitingFor) > 0 {
			waiting = append(waiting, fmt.Sprintf("%s waits for %v", m.Module, m.WaitingFor))
		}
		if len(m.WaitingForLicences) > 0 {
			waiting = append(waiting, fmt.Sprintf("%s waits for licences %v", m.Module, m.WaitingForLicences))
		}
		for _, sf := range sealed[i] {
			rel := sf.Rel
			v, _, err := protocol.OpenSealed(sf.Sealed, sf.Label, st.Age)
			if err != nil {
				return fail(d.Serial, "%s of %s: %v", path.Base(rel), m.Module, err)
			}
			// Readable by the module's group, in a directory it may read
			// and not write; the module's own directory stays the host's.
			a := access{perm: 0o600, gid: -1}
			if gid := owners[m.Module][1]; gid >= 0 {
				a = access{perm: 0o640, gid: gid, groupDir: path.Dir(rel) != path.Join(protocol.ModulesDir, m.Module)}
			}
			if err := r.writeFileAs(rel, v.Reveal(), 0o700, a); err != nil {
				return failPath(d.Serial, fmt.Sprintf("write %s of %s", path.Base(rel), m.Module), err)
			}
			next.Files = append(next.Files, rel)
		}
		// The backup seat's holder's lines: not secret, but its module's
		// alone to read, as its secrets are; rewritten whole with every
		// declaration, and no restart: the module reads it again.
		if holdsBackupSeat(m) {
			rel := linesFile(m.Module)
			a := access{perm: 0o600, gid: -1}
			if gid := owners[m.Module][1]; gid >= 0 {
				a = access{perm: 0o640, gid: gid}
			}
			lines := protocol.BackupLines{Lines: d.BackupLines}
			if lines.Lines == nil {
				lines.Lines = []protocol.BackupLine{}
			}
			b, err := json.MarshalIndent(lines, "", "  ")
			if err != nil {
				return fail(d.Serial, "write %s of %s: %v", protocol.BackupLinesName, m.Module, err)
			}
			if err := r.writeFileAs(rel, append(b, '\n'), 0o755, a); err != nil {
				return failPath(d.Serial, "write "+rel, err)
			}
			next.Files = append(next.Files, rel)
		}
	}
	sort.Strings(next.Files)
	tier("secrets", t)

	t = time.Now()
	madeBefore := map[string]bool{}
	for _, ds := range last.Data {
		madeBefore[ds.Module+"/"+ds.Name+"/"+ds.Path] = ds.Made
	}
	for _, m := range d.Modules {
		for _, ds := range m.Data {
			rel, _ := dataRel(ds.Path) // judged above
			before := madeBefore[m.Module+"/"+ds.Name+"/"+ds.Path]
			uid, gid := owners[m.Module][0], owners[m.Module][1]
			if !givable(ds.Path) {
				uid, gid = -1, -1 // made, and kept the host's: see givable
			}
			made, err := r.mkdirData(rel, uid, gid, before)
			if err != nil {
				return failPath(d.Serial, fmt.Sprintf("module %s data %s", m.Module, ds.Name), err)
			}
			next.Data = append(next.Data, dataSet{Module: m.Module, Name: ds.Name, Path: ds.Path, Precious: ds.Precious, Made: made || before})
		}
	}
	tier("data", t)

	// Deletions a person asked for with cleanup delete: the only data a host
	// ever removes, and only because a verified declaration says so.
	t = time.Now()
	for i, del := range d.Delete {
		if err := r.removeAll(targets[i]); err != nil {
			return failPath(d.Serial, fmt.Sprintf("delete %s of %s", del.Target, del.Module), err)
		}
		next.Deleted = append(next.Deleted, del)
	}
	tier("delete", t)

	// Data sets no longer declared stay where they are, and are still
	// reported (their size is what cleanup shows) until deleted.
	declaredData := map[string]bool{}
	for _, ds := range next.Data {
		declaredData[ds.Module+"/"+ds.Name] = true
	}
	gone := map[string]bool{}
	for _, del := range next.Deleted {
		if del.Kind == "data" {
			gone[del.Module+"/"+del.Target] = true
		}
	}
	for _, ds := range last.Data {
		if !declaredData[ds.Module+"/"+ds.Name] && !gone[ds.Module+"/"+ds.Name] {
			next.Data = append(next.Data, ds)
		}
	}

	// Files an earlier declaration made and this one no longer declares go,
	// and so do the directories they leave empty, up to the modules
	// directory; data directories never do: only a declaration that says so
	// explicitly may delete data (above).
	t = time.Now()
	for _, f := range last.Files {
		if declared[f] || !beneath(f) {
			// One not beneath the modules directory was written by a host
			// before this one judged names; it is left alone rather than
			// removed, and no longer remembered.
			continue
		}
		if err := r.removeFile(f); err != nil {
			return failPath(d.Serial, "remove "+f, err)
		}
		for dir := path.Dir(f); strings.HasPrefix(dir, protocol.ModulesDir+"/"); dir = path.Dir(dir) {
			if r.removeEmptyDir(dir) != nil {
				break // not empty, or gone already
			}
		}
	}
	// Version directories no longer kept (older than the one before) go:
	// they are the host's copies of archives, never data.
	for _, old := range last.Runs {
		keep := map[string]bool{}
		for _, run := range next.Runs {
			if run.Module == old.Module {
				for _, v := range run.Kept {
					keep[v] = true
				}
			}
		}
		for _, v := range old.Kept {
			if !keep[v] {
				if err := r.removeAll(versionDir(old.Module, v)); err != nil {
					return failPath(d.Serial, "remove "+versionDir(old.Module, v), err)
				}
			}
		}
	}
	tier("cleanup", t)

	return protocol.AppliedBody{Serial: d.Serial, OK: true, Tiers: tiers, Waiting: waiting, TotalMS: float64(time.Since(start).Microseconds()) / 1000}, next
}

// beneath says whether a file remembered as written is where this host
// writes files: beneath the modules directory, and nowhere else.
func beneath(f string) bool {
	_, err := split(f)
	return err == nil && strings.HasPrefix(f, protocol.ModulesDir+"/")
}

// deletionTarget is what a deletion removes, as a path beneath the root: a
// data set's directory, or a provider's files for one consumer.
func deletionTarget(del protocol.DeclaredDeletion) (string, error) {
	switch del.Kind {
	case "data":
		return dataRel(del.Path)
	case "consumer":
		return path.Join(protocol.ModulesDir, del.Module, "consumers", strings.ReplaceAll(del.Target, "/", "_")), nil
	}
	return "", fmt.Errorf("deletion of kind %q: %w", del.Kind, ErrNotBeneath)
}

// dataReport measures every declared data set beneath dir, following no link.
func dataReport(dir string, a applied) protocol.DataBody {
	r := root{dir: dir}
	sets := make([]protocol.DataSet, 0, len(a.Data))
	for _, ds := range a.Data {
		var total int64
		if rel, err := dataRel(ds.Path); err == nil {
			total = r.size(rel)
		}
		sets = append(sets, protocol.DataSet{Module: ds.Module, Name: ds.Name, Path: ds.Path, Bytes: total, Precious: ds.Precious})
	}
	return protocol.DataBody{Sets: sets, Deleted: a.Deleted}
}

// givableDirs are where a host gives a module's user the data directories
// it makes. Elsewhere (/etc, /root, /usr…) a directory made for a module
// stays the host's: a module given /root/.ssh or /etc/cron.d, even one
// that was not there before, would be given the machine.
var givableDirs = []string{"/var/lib/", "/var/cache/", "/var/spool/", "/var/log/", "/srv/", "/opt/", "/mnt/", "/data/"}

// givable says a data path is beneath one of givableDirs.
func givable(p string) bool {
	for _, d := range givableDirs {
		if strings.HasPrefix(p, d) {
			return true
		}
	}
	return false
}

// versionDir is where a built module's archive is unpacked beneath the
// root: its module's directory, then its version.
func versionDir(module, version string) string {
	return path.Join(protocol.ModulesDir, module, version)
}

// unpackArchive makes a module's version directory hold its declared
// archive: left as it is when the last apply unpacked that very archive
// there, else fetched, verified and unpacked whole (a half-written tree is
// never left: archive.UnpackSized renames it into place), if it fits.
func unpackArchive(r root, m protocol.DeclaredModule, last []runRecord, fetch fetcher) error {
	rel := versionDir(m.Module, m.Version)
	if err := r.check(rel); err != nil {
		return err
	}
	abs := filepath.Join(r.dir, filepath.FromSlash(rel))
	for _, run := range last {
		// The same digest is the same bytes, whatever else the
		// declaration came to say of them (its unpacked size, since).
		if run.Module == m.Module && run.Archive != nil && run.Archive.Digest == m.Archive.Digest && run.Version == m.Version {
			if fi, err := os.Lstat(abs); err == nil && fi.IsDir() {
				return nil
			}
		}
	}
	if fetch == nil {
		return errors.New("this host cannot fetch archives")
	}
	file, err := fetch(*m.Archive)
	if err != nil {
		return err
	}
	defer os.Remove(file)
	// What is there is another archive of this version (or a person's
	// files): it gives way to the one declared.
	if err := r.removeAll(rel); err != nil {
		return err
	}
	// Held to the unpacked size the declaration signs with the digest:
	// refused before writing when it does not fit the disk it goes to,
	// stopped at the entry that passes it if the archive holds more.
	// Without one (an archive built before it was declared) the archive's
	// own headers, read first, say it.
	return archive.UnpackSized(file, abs, m.Archive.UnpackedBytes)
}
