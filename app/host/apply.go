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
	return (&applyJob{st: st, r: root{dir: dir}, last: last, env: env, ids: ids, fetch: fetch}).run()
}

// applyJob is one declaration being applied: what it starts from, and what
// each phase works out for the phases after it.
type applyJob struct {
	st    *State
	r     root
	last  applied
	env   protocol.Envelope
	ids   userIDs
	fetch fetcher
	// phase, if set, is told the name of each phase as it begins: the
	// host's beats say it while the apply runs.
	phase func(name string)
	// upgrade, if set, upgrades the host to the release the declaration
	// names, when it runs another (Runner.upgradeSelf): it returns only if
	// it did not. Without it such a declaration is refused.
	upgrade func(protocol.DeclaredHost) error
	// up, if set, is what the apply does to the modules whose version it
	// moves (prepare.go): a host that runs none has none.
	up *upgrading

	start time.Time
	tiers []protocol.Tier
	// d is the declaration once its signature verified; raw its modules
	// exactly as signed.
	d   protocol.Declaration
	raw []json.RawMessage
	// Worked out by verify, and written below from these lists only: each
	// module's documents (protocol.Files: module.json, settings.json,
	// bindings.json) and sealed files, every file declared, and each
	// deletion's target.
	docs     [][]document
	sealed   [][]protocol.SealedFile
	declared map[string]bool
	targets  []string
	// owners are each module's uid and gid (-1 for the host's own).
	owners map[string][2]int
	// next is what the host remembers once the declaration is applied;
	// waiting says which modules wait rather than run.
	next    applied
	waiting []string
}

// document is one JSON document a declaration has the host write.
type document struct {
	rel  string
	body json.RawMessage
}

// applyPhase is one phase of an apply, timed as the report's tier name;
// when, if set, says whether the declaration calls for it at all (a phase
// not called for is not reported).
type applyPhase struct {
	name string
	run  func(*applyJob) error
	when func(*applyJob) bool
}

// applyPhases are an apply's phases, in order: every path is judged and
// every archive unpacked before any file is written, so that a
// declaration refused for either is refused whole; then a module going
// back has its pre-upgrade snapshots fetched, and one moving to a version
// with a prepare is stopped, snapshotted and prepared (prepare.go); the
// modules start after (Runner.commit).
var applyPhases = []applyPhase{
	{name: "verify", run: (*applyJob).verify},
	{name: "host", run: (*applyJob).host, when: func(j *applyJob) bool { return j.d.Host != nil && j.d.Host.Version != Version }},
	{name: "archives", run: (*applyJob).archives},
	{name: "restore", run: (*applyJob).restoreBack, when: func(j *applyJob) bool { return j.up.has(j, moveBack) }},
	{name: "prepare", run: (*applyJob).prepare, when: func(j *applyJob) bool { return j.up.has(j, movePrepare) }},
	{name: "cutover", run: (*applyJob).cutover, when: func(j *applyJob) bool { return len(j.d.Taken) > 0 }},
	{name: "files", run: (*applyJob).files},
	{name: "secrets", run: (*applyJob).secrets},
	{name: "data", run: (*applyJob).data},
	{name: "delete", run: (*applyJob).deletions},
	{name: "cleanup", run: (*applyJob).cleanup},
}

// run runs the phases, stopping at the first that fails: its error is the
// report's, and what the host remembers stays the last applied.
func (j *applyJob) run() (protocol.AppliedBody, applied) {
	j.start = time.Now()
	for _, p := range applyPhases {
		if p.when != nil && !p.when(j) {
			continue
		}
		if j.phase != nil {
			j.phase(p.name)
		}
		t := time.Now()
		if err := p.run(j); err != nil {
			return protocol.AppliedBody{Serial: j.d.Serial, OK: false, Error: err.Error(), Tiers: j.tiers, TotalMS: msSince(j.start)}, j.last
		}
		j.tiers = append(j.tiers, protocol.Tier{Tier: p.name, MS: msSince(t)})
	}
	return protocol.AppliedBody{Serial: j.d.Serial, OK: true, Tiers: j.tiers, Waiting: j.waiting, TotalMS: msSince(j.start)}, j.next
}

// msSince is the time since t in milliseconds, to the microsecond.
func msSince(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1000 }

// pathFailure words a failed file operation (what, if given, says which);
// one the root refused (an escape, a link) is a refusal, not an accident.
func pathFailure(what string, err error) error {
	refused := ""
	if errors.Is(err, ErrSymlink) || errors.Is(err, ErrNotBeneath) {
		refused = "refused: "
	}
	if what == "" {
		return fmt.Errorf("%s%w", refused, err) // the error names the path
	}
	return fmt.Errorf("%s%s: %w", refused, what, err)
}

// verify judges the declaration, then every path it touches.
func (j *applyJob) verify() error {
	if err := j.verifySigned(); err != nil {
		return err
	}
	return j.checkPaths()
}

// verifySigned judges the declaration itself: signed by a controller key
// the host accepts (received at join, or handed over to by a rotation),
// in a protocol this host reads, for this node, newer than the last
// applied, with no problem protocol finds in it, and an overlay this host
// can be in.
func (j *applyJob) verifySigned() error {
	d, err := j.st.Verify(j.env)
	var mismatch *protocol.MismatchError
	if errors.As(err, &mismatch) {
		// Signed by the controller, in a protocol this host cannot read:
		// refused whole, nothing of it read further.
		j.d.Serial = d.Serial
		return fmt.Errorf("refused: %v", err)
	}
	if err != nil {
		return fmt.Errorf("refused: %v against the controller keys this host accepts", err)
	}
	if d.Node != j.st.Node {
		j.d.Serial = d.Serial
		return fmt.Errorf("refused: declaration %d is for node %q, this is %q", d.Serial, d.Node, j.st.Node)
	}
	j.d = d
	if d.Serial <= j.last.Serial {
		return fmt.Errorf("refused: serial %d is not above the last applied %d (replayed or old)", d.Serial, j.last.Serial)
	}
	if ps := d.Problems(); len(ps) > 0 {
		more := ""
		if len(ps) > maxReported {
			more = fmt.Sprintf(" (and %d more)", len(ps)-maxReported)
			ps = ps[:maxReported]
		}
		return fmt.Errorf("refused: %s%s", strings.Join(ps, "; "), more)
	}
	if err := checkOverlay(d.Overlay, j.st.WireGuard); err != nil {
		return fmt.Errorf("refused: the overlay: %v", err)
	}
	var raw struct {
		Modules []json.RawMessage `json:"modules"`
	}
	if err := json.Unmarshal([]byte(j.env.Declaration), &raw); err != nil {
		return fmt.Errorf("refused: modules: %v", err)
	}
	j.raw = raw.Modules
	j.next = applied{Serial: d.Serial, Signature: j.env.Signature, Runs: runRecords(d, raw.Modules, j.last.Runs), Overlay: d.Overlay, Backups: d.Backups}
	return nil
}

// checkPaths works out every path the declaration touches and checks each
// before any is touched: a link planted on one refuses the whole
// declaration, not half of it.
func (j *applyJob) checkPaths() error {
	d := j.d
	j.docs = make([][]document, len(d.Modules))
	j.sealed = make([][]protocol.SealedFile, len(d.Modules))
	j.declared = map[string]bool{}
	var touched []string
	declare := func(rel string) {
		j.declared[rel] = true
		touched = append(touched, rel)
	}
	for i, m := range d.Modules {
		module, settings := protocol.DocumentFiles(m)
		j.docs[i] = []document{{module, j.raw[i]}}
		if settings != "" {
			j.docs[i] = append(j.docs[i], document{settings, m.Settings})
		}
		j.docs[i] = append(j.docs[i], document{path.Join(protocol.ModulesDir, m.Module, protocol.BindingsFile), bindingsDocument(j.r.dir, m)})
		j.sealed[i] = protocol.SealedFiles(j.st.Node, m)
		if holdsBackupSeat(m) {
			declare(linesFile(m.Module))
		}
		for _, doc := range j.docs[i] {
			declare(doc.rel)
		}
		for _, sf := range j.sealed[i] {
			declare(sf.Rel)
		}
		for _, ds := range m.Data {
			rel, err := dataRel(ds.Path)
			if err != nil {
				return pathFailure(fmt.Sprintf("module %s data %s", m.Module, ds.Name), err)
			}
			touched = append(touched, rel)
		}
	}
	j.targets = make([]string, len(d.Delete))
	for i, del := range d.Delete {
		var err error
		if j.targets[i], err = deletionTarget(del); err != nil {
			return pathFailure(fmt.Sprintf("deletion of %s %s", del.Module, del.Target), err)
		}
		touched = append(touched, j.targets[i])
	}
	for _, f := range j.last.Files {
		if !j.declared[f] && beneath(f) {
			touched = append(touched, path.Dir(f)) // a link in the file's own place is removed as a link
		}
	}
	for _, rel := range touched {
		if err := j.r.check(rel); err != nil {
			return pathFailure("", err)
		}
	}
	return nil
}

// host upgrades the host to the release the declaration names, before
// anything else of it is applied: the next program applies it whole
// (selfupgrade.go). Still here, the upgrade did not happen: the
// declaration is refused, and why is the report's.
func (j *applyJob) host() error {
	if j.upgrade == nil {
		return fmt.Errorf("refused: mesh-host %s is declared, and this host (%s) cannot upgrade itself", j.d.Host.Version, Version)
	}
	return j.upgrade(*j.d.Host)
}

// archives fetches, verifies and unpacks each built module's archive into
// its version's directory before any file is written, so that a
// declaration whose archive cannot be had is refused whole. One unpacked
// already is not fetched again.
func (j *applyJob) archives() error {
	for _, m := range j.d.Modules {
		if m.Archive == nil {
			continue
		}
		if err := unpackArchive(j.r, m, j.last.Runs, j.fetch); err != nil {
			return fmt.Errorf("refused: archive of %s %s: %v", m.Module, m.Version, err)
		}
	}
	return nil
}

// cutover does the cutovers of modules taken onto this adopted node,
// before any of them starts: what a person approved is stopped; the data
// is not touched.
func (j *applyJob) cutover() error {
	taken, err := cutover(j.d.Taken, j.last.Taken)
	if err != nil {
		return fmt.Errorf("cutover: %v", err)
	}
	j.next.Taken = taken
	return nil
}

// files writes each module's documents, indented. The sealed files are
// written by secrets, opened with the host's own key.
func (j *applyJob) files() error {
	for i, m := range j.d.Modules {
		for _, doc := range j.docs[i] {
			rel := doc.rel
			var v any
			if err := json.Unmarshal(doc.body, &v); err != nil {
				return fmt.Errorf("refused: %s of %s is not JSON: %v", path.Base(rel), m.Module, err)
			}
			b, err := json.MarshalIndent(v, "", "  ")
			if err != nil {
				return fmt.Errorf("write %s of %s: %v", path.Base(rel), m.Module, err)
			}
			// Not secret: readable by the module's user (a module's sealed
			// values in module.json open only with the host's key).
			if err := j.r.writeFileAs(rel, append(b, '\n'), 0o755, access{perm: 0o644, gid: -1}); err != nil {
				return pathFailure("write "+rel, err)
			}
			j.next.Files = append(j.next.Files, rel)
		}
	}
	return nil
}

// secrets writes each module's sealed files, each opened with this host's
// age identity, inside a declaration whose signature verified, checked to
// be the one named, and the backup seat holder's lines; each readable by
// its module's user alone. It makes each module's user first.
func (j *applyJob) secrets() error {
	j.owners = map[string][2]int{}
	for _, m := range j.d.Modules {
		uid, gid := -1, -1
		if j.ids != nil && m.Run != nil {
			var err error
			if uid, gid, err = j.ids(m.Module); err != nil {
				return fmt.Errorf("module %s: %v", m.Module, err)
			}
		}
		j.owners[m.Module] = [2]int{uid, gid}
	}
	for i, m := range j.d.Modules {
		if len(m.WaitingFor) > 0 {
			j.waiting = append(j.waiting, fmt.Sprintf("%s waits for %v", m.Module, m.WaitingFor))
		}
		if len(m.WaitingForLicences) > 0 {
			j.waiting = append(j.waiting, fmt.Sprintf("%s waits for licences %v", m.Module, m.WaitingForLicences))
		}
		for _, sf := range j.sealed[i] {
			rel := sf.Rel
			v, _, err := protocol.OpenSealed(sf.Sealed, sf.Label, j.st.Age)
			if err != nil {
				return fmt.Errorf("%s of %s: %v", path.Base(rel), m.Module, err)
			}
			// Readable by the module's group, in a directory it may read
			// and not write; the module's own directory stays the host's.
			a := access{perm: 0o600, gid: -1}
			if gid := j.owners[m.Module][1]; gid >= 0 {
				a = access{perm: 0o640, gid: gid, groupDir: path.Dir(rel) != path.Join(protocol.ModulesDir, m.Module)}
			}
			if err := j.r.writeFileAs(rel, v.Reveal(), 0o700, a); err != nil {
				return pathFailure(fmt.Sprintf("write %s of %s", path.Base(rel), m.Module), err)
			}
			j.next.Files = append(j.next.Files, rel)
		}
		if holdsBackupSeat(m) {
			if err := j.backupLines(m); err != nil {
				return err
			}
		}
	}
	sort.Strings(j.next.Files)
	return nil
}

// backupLines writes the backup seat holder's lines: not secret, but its
// module's alone to read, as its secrets are; rewritten whole with every
// declaration, and no restart: the module reads it again.
func (j *applyJob) backupLines(m protocol.DeclaredModule) error {
	rel := linesFile(m.Module)
	a := access{perm: 0o600, gid: -1}
	if gid := j.owners[m.Module][1]; gid >= 0 {
		a = access{perm: 0o640, gid: gid}
	}
	lines := protocol.BackupLines{Lines: j.d.BackupLines}
	if lines.Lines == nil {
		lines.Lines = []protocol.BackupLine{}
	}
	b, err := json.MarshalIndent(lines, "", "  ")
	if err != nil {
		return fmt.Errorf("write %s of %s: %v", protocol.BackupLinesName, m.Module, err)
	}
	if err := j.r.writeFileAs(rel, append(b, '\n'), 0o755, a); err != nil {
		return pathFailure("write "+rel, err)
	}
	j.next.Files = append(j.next.Files, rel)
	return nil
}

// data makes each declared data set's directory, given to its module's
// user when the host made it where a module may be given one (givable).
func (j *applyJob) data() error {
	madeBefore := map[string]bool{}
	for _, ds := range j.last.Data {
		madeBefore[ds.Module+"/"+ds.Name+"/"+ds.Path] = ds.Made
	}
	for _, m := range j.d.Modules {
		for _, ds := range m.Data {
			rel, _ := dataRel(ds.Path) // judged by verify
			before := madeBefore[m.Module+"/"+ds.Name+"/"+ds.Path]
			uid, gid := j.owners[m.Module][0], j.owners[m.Module][1]
			if !givable(ds.Path) {
				uid, gid = -1, -1 // made, and kept the host's: see givable
			}
			made, err := j.r.mkdirData(rel, uid, gid, before)
			if err != nil {
				return pathFailure(fmt.Sprintf("module %s data %s", m.Module, ds.Name), err)
			}
			j.next.Data = append(j.next.Data, dataSet{Module: m.Module, Name: ds.Name, Path: ds.Path, Precious: ds.Precious, Made: made || before})
		}
	}
	return nil
}

// deletions carries out the deletions a person asked for with cleanup
// delete: the only data a host ever removes, and only because a verified
// declaration says so. Data sets no longer declared and not deleted stay
// where they are, and are still reported (their size is what cleanup
// shows) until deleted.
func (j *applyJob) deletions() error {
	for i, del := range j.d.Delete {
		if err := j.r.removeAll(j.targets[i]); err != nil {
			return pathFailure(fmt.Sprintf("delete %s of %s", del.Target, del.Module), err)
		}
		j.next.Deleted = append(j.next.Deleted, del)
	}
	declaredData := map[string]bool{}
	for _, ds := range j.next.Data {
		declaredData[ds.Module+"/"+ds.Name] = true
	}
	gone := map[string]bool{}
	for _, del := range j.next.Deleted {
		if del.Kind == "data" {
			gone[del.Module+"/"+del.Target] = true
		}
	}
	for _, ds := range j.last.Data {
		if !declaredData[ds.Module+"/"+ds.Name] && !gone[ds.Module+"/"+ds.Name] {
			j.next.Data = append(j.next.Data, ds)
		}
	}
	return nil
}

// cleanup removes the files an earlier declaration made and this one no
// longer declares, and the directories they leave empty, up to the
// modules directory; data directories never go: only a declaration that
// says so explicitly may delete data (deletions). Version directories no
// longer kept (older than the one before) go too: they are the host's
// copies of archives, never data.
func (j *applyJob) cleanup() error {
	for _, f := range j.last.Files {
		if j.declared[f] || !beneath(f) {
			// One not beneath the modules directory was written by a host
			// before this one judged names; it is left alone rather than
			// removed, and no longer remembered.
			continue
		}
		if err := j.r.removeFile(f); err != nil {
			return pathFailure("remove "+f, err)
		}
		for dir := path.Dir(f); strings.HasPrefix(dir, protocol.ModulesDir+"/"); dir = path.Dir(dir) {
			if j.r.removeEmptyDir(dir) != nil {
				break // not empty, or gone already
			}
		}
	}
	for _, old := range j.last.Runs {
		keep := map[string]bool{}
		for _, run := range j.next.Runs {
			if run.Module == old.Module {
				for _, v := range run.Kept {
					keep[v] = true
				}
			}
		}
		for _, v := range old.Kept {
			if !keep[v] {
				if err := j.r.removeAll(versionDir(old.Module, v)); err != nil {
					return pathFailure("remove "+versionDir(old.Module, v), err)
				}
			}
		}
	}
	return nil
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
