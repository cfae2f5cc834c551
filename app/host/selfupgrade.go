package host

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/sys/unix"

	"mesh-controller/app/archive"
	"mesh-controller/app/process"
	"mesh-controller/app/protocol"
)

// A host upgrades itself when a declaration names a host release other
// than the one it runs (protocol.DeclaredHost), before anything else of the
// declaration is applied:
//
//  1. it gets the release's binary: the one it kept of that version when
//     it last upgraded (a rollback needs no fetch, nor an archive the
//     controller may no longer keep), else the declared archive, fetched
//     and its digest verified, unpacked in its state dir;
//  2. it checks the binary runs here and says the version declared;
//  3. it keeps the binary it runs as the previous one;
//  4. it records the upgrade under way (upgrade.json), then replaces its
//     own executable by a rename on the executable's file system (atomic:
//     killed at any point, the host starts again on one of the two);
//  5. it hands its modules over (Supervisor.Handover) in a handover file
//     and re-executes itself, same pid, same arguments: its modules stay
//     its children, and the new program adopts them (Supervisor.Adopt).
//
// The new program applies the declaration again (it asks for it on
// connecting, as it was never applied) and reports it applied, then beats
// with its version. A binary that does not verify is refused in the apply
// report, and nothing is replaced.
//
// Started on the new release, the host is on trial until it applies a
// declaration: a release that cannot come up (it is started again and
// again by the machine's service manager, say) is given up after
// maxTrialStarts starts: the previous binary is put back and executed,
// and the host, back on it, refuses the release in its report until
// another is declared.

// maxTrialStarts is how many times a host on a new release may start
// without applying a declaration before it goes back to the previous one:
// the start the upgrade made, and one more (a kill, a reboot).
const maxTrialStarts = 2

// The host's own upgrade, in its state dir.
const (
	upgradeDir   = "host"
	fileUpgrade  = "upgrade.json"
	fileHandover = "handover.json"
	// handoverEnv carries, across the exec, the nonce the handover file
	// holds: a host started by anyone else finds no handover to take.
	handoverEnv = "MESH_HOST_HANDOVER"
)

// The phases of an upgrade record: on trial (the executable replaced, the
// new release not yet heard to work), or reverted (given up, back on the
// previous release).
const (
	upgradeTrial    = "trial"
	upgradeReverted = "reverted"
)

// upgradeRecord is the host's own upgrade under way or given up.
type upgradeRecord struct {
	Phase  string    `json:"phase"`
	From   string    `json:"from"`
	To     string    `json:"to"`
	Serial int64     `json:"serial"`
	Starts int       `json:"starts"`
	Why    string    `json:"why,omitempty"`
	At     time.Time `json:"at"`
}

// handover is what a host re-executing itself leaves its next program.
type handover struct {
	Nonce   string         `json:"nonce"`
	Pid     int            `json:"pid"`
	BootID  string         `json:"boot_id"`
	Modules []HandedModule `json:"modules"`
}

// upgradePath is a file or directory of the host's own upgrade.
func (r *Runner) upgradePath(name ...string) string {
	return filepath.Join(append([]string{r.State.Dir, upgradeDir}, name...)...)
}

// resumeUpgrade reads the host's own upgrade when it starts: on the new
// release, a trial start is counted, and past maxTrialStarts the previous
// binary is put back and executed (it does not return then); on the
// previous one, an upgrade given up is remembered (the release refused
// until another is declared), one stopped before its executable was
// replaced is forgotten (the declaration is applied again).
func (r *Runner) resumeUpgrade() {
	rec, err := loadJSON[*upgradeRecord](r.upgradePath(), fileUpgrade)
	if err != nil || rec == nil {
		if err != nil {
			r.warnf("host upgrade: read %s: %v; forgotten", fileUpgrade, err)
			os.Remove(r.upgradePath(fileUpgrade))
		}
		return
	}
	switch {
	case rec.Phase == upgradeTrial && Version == rec.To:
		rec.Starts++
		if rec.Starts > maxTrialStarts {
			r.revert(rec, fmt.Sprintf("mesh-host %s did not come up: started %d times without applying a declaration", rec.To, rec.Starts-1))
			return
		}
		if err := saveJSON(r.upgradePath(), fileUpgrade, rec); err != nil {
			r.warnf("host upgrade: %v", err)
		}
		r.trial = rec
		r.logf("upgraded from mesh-host %s to %s for declaration %d: start %d of %d on trial", rec.From, rec.To, rec.Serial, rec.Starts, maxTrialStarts)
	case rec.Phase == upgradeTrial && Version == rec.From:
		r.logf("the upgrade to mesh-host %s stopped before the executable was replaced: declaration %d is applied again", rec.To, rec.Serial)
		os.Remove(r.upgradePath(fileUpgrade))
	case rec.Phase == upgradeReverted && Version == rec.From:
		r.reverted = rec
		r.warnf("back on mesh-host %s: %s", rec.From, rec.Why)
	default:
		os.Remove(r.upgradePath(fileUpgrade)) // another binary put in place by hand
	}
}

// revert puts the previous binary back and executes it, saying why the
// release was given up; it returns only if it could not.
func (r *Runner) revert(rec *upgradeRecord, why string) {
	prev := r.upgradePath("previous", protocol.HostBinaryName)
	if _, err := os.Stat(prev); err != nil {
		r.warnf("host upgrade: %s, and no previous binary is kept to go back to: going on", why)
		return
	}
	staged, err := stageBeside(r.exe, prev)
	if err == nil {
		rec.Phase, rec.Why = upgradeReverted, why
		err = saveJSON(r.upgradePath(), fileUpgrade, rec)
	}
	if err == nil {
		err = renameSynced(staged, r.exe)
	}
	if err != nil {
		os.Remove(staged)
		r.warnf("host upgrade: %s, and the previous binary could not be put back: %v; going on", why, err)
		return
	}
	r.warnf("host upgrade: %s: going back to mesh-host %s", why, rec.From)
	err = process.Exec(r.exe, os.Args, os.Environ())
	r.warnf("host upgrade: could not execute mesh-host %s again: %v; going on", rec.From, err)
}

// upgraded is told each declaration applied: the first the new release
// applies ends its trial, and one that declares another release than the
// one given up forgets it.
func (r *Runner) upgraded(d protocol.Declaration) {
	declared := ""
	if d.Host != nil {
		declared = d.Host.Version
	}
	switch {
	case r.trial != nil:
		r.logf("mesh-host %s applied declaration %d: the upgrade from %s is done", r.trial.To, d.Serial, r.trial.From)
		r.trial = nil
	case r.reverted != nil && declared != r.reverted.To:
		r.reverted = nil
	default:
		return
	}
	os.Remove(r.upgradePath(fileUpgrade))
	os.RemoveAll(r.upgradePath("next"))
}

// refusedRelease says why a host release is refused here before anything
// is fetched: one this host gave up already, or a host that cannot
// replace itself (one run inside another program); "" if none.
func (r *Runner) refusedRelease(h protocol.DeclaredHost) string {
	switch {
	case r.reverted != nil && r.reverted.To == h.Version:
		return fmt.Sprintf("refused: mesh-host %s failed here already (%s); this host is back on %s: declare another release, or roll the hosts back",
			h.Version, r.reverted.Why, Version)
	case !r.SelfUpgrade:
		return fmt.Sprintf("refused: mesh-host %s is declared, and this host (%s) does not upgrade itself (run inside another program, or with --no-self-upgrade)", h.Version, Version)
	}
	return ""
}

// upgradeSelf upgrades the host to the release h for declaration serial
// (the package's doc says how); it returns only if it did not, saying why
// (a refusal, nothing replaced), or after putting back what it replaced.
func (r *Runner) upgradeSelf(nc *nats.Conn, serial int64, h protocol.DeclaredHost, fetch fetcher) error {
	bin, err := r.releaseBinary(h, fetch)
	if err != nil {
		return err
	}
	if err := checkHostBinary(bin, h.Version); err != nil {
		return fmt.Errorf("refused: mesh-host %s: %v", h.Version, err)
	}
	// What runs beside the apply ends first: a backup's restic is a
	// child that no next program would wait for.
	if running := r.bk.hold(time.Minute); running != "" {
		return fmt.Errorf("refused for now: %s still runs after a minute: the host upgrades itself once it ended; push the declaration again", running)
	}
	defer r.bk.unhold()
	// Staged first: the binary may be the previous one kept (a rollback),
	// which keeping this one as the previous replaces.
	staged, err := stageBeside(r.exe, bin)
	if err != nil {
		return fmt.Errorf("put mesh-host %s beside %s: %v (the host's executable's directory must be the host's to write)", h.Version, r.exe, err)
	}
	if err := r.keepPrevious(); err != nil {
		os.Remove(staged)
		return fmt.Errorf("keep mesh-host %s as the previous binary: %v", Version, err)
	}
	rec := &upgradeRecord{Phase: upgradeTrial, From: Version, To: h.Version, Serial: serial, At: time.Now().UTC()}
	if err := saveJSON(r.upgradePath(), fileUpgrade, rec); err != nil {
		os.Remove(staged)
		return fmt.Errorf("record the upgrade: %v", err)
	}
	fault("host-upgrade-before-rename")
	if err := renameSynced(staged, r.exe); err != nil {
		os.Remove(staged)
		os.Remove(r.upgradePath(fileUpgrade))
		return fmt.Errorf("replace %s: %v", r.exe, err)
	}
	fault("host-upgrade-before-exec")
	r.logf("upgrading to mesh-host %s for declaration %d: re-executing, the modules running on", h.Version, serial)
	err = r.reexec(nc)
	// Still here: the exec failed. The previous binary goes back, and the
	// modules are taken back; the declaration is reported failed.
	r.warnf("host upgrade: re-execute %s: %v", r.exe, err)
	if prev, perr := stageBeside(r.exe, r.upgradePath("previous", protocol.HostBinaryName)); perr == nil {
		if perr = renameSynced(prev, r.exe); perr != nil {
			os.Remove(prev)
		}
	}
	os.Remove(r.upgradePath(fileUpgrade))
	for _, line := range r.sup.Resume() {
		r.logf("%s", line)
	}
	return fmt.Errorf("mesh-host %s could not be executed here: %v; back on %s", h.Version, err, Version)
}

// reexec hands the modules over and executes the host's executable again,
// with the same arguments: it returns only if the exec failed.
func (r *Runner) reexec(nc *nats.Conn) error {
	nonce := make([]byte, 16)
	rand.Read(nonce)
	h := handover{Nonce: hex.EncodeToString(nonce), Pid: os.Getpid(), BootID: bootID()}
	// The overlay's interface lives in this process: the next brings it
	// up again from what was declared.
	r.mu.Lock()
	r.stopOverlay()
	r.mu.Unlock()
	h.Modules = r.sup.Handover()
	if err := saveJSON(r.State.Dir, fileHandover, h); err != nil {
		return err
	}
	if nc != nil {
		nc.Flush()
	}
	env := []string{handoverEnv + "=" + h.Nonce}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, handoverEnv+"=") {
			env = append(env, kv)
		}
	}
	err := process.Exec(r.exe, os.Args, env)
	os.Remove(filepath.Join(r.State.Dir, fileHandover))
	return err
}

// takeHandover takes the handover the host's previous program left, if
// this program is the one it executed (the nonce in its environment, the
// same pid and boot); any other is removed unread.
func takeHandover(dir string) []HandedModule {
	nonce := os.Getenv(handoverEnv)
	os.Unsetenv(handoverEnv)
	h, err := loadJSON[*handover](dir, fileHandover)
	os.Remove(filepath.Join(dir, fileHandover))
	if err != nil || h == nil || nonce == "" || h.Nonce != nonce || h.Pid != os.Getpid() || h.BootID != bootID() {
		return nil
	}
	return h.Modules
}

// releaseBinary is the binary of release h: the one kept as the previous
// if it is that version, else the declared archive's, fetched (its digest
// verified) and unpacked into the state dir.
func (r *Runner) releaseBinary(h protocol.DeclaredHost, fetch fetcher) (string, error) {
	prev := r.upgradePath("previous")
	if v, err := os.ReadFile(filepath.Join(prev, "version")); err == nil && string(v) == h.Version {
		return filepath.Join(prev, protocol.HostBinaryName), nil
	}
	if h.Archive == nil {
		return "", fmt.Errorf("refused: mesh-host %s is declared without an archive, and this host keeps no binary of it", h.Version)
	}
	if fetch == nil {
		return "", fmt.Errorf("refused: mesh-host %s: this host cannot fetch archives", h.Version)
	}
	file, err := fetch(*h.Archive)
	if err != nil {
		return "", fmt.Errorf("refused: archive of mesh-host %s: %v", h.Version, err)
	}
	defer os.Remove(file)
	next := r.upgradePath("next")
	if err := os.RemoveAll(next); err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(next), 0o700); err != nil {
		return "", err
	}
	if err := archive.UnpackSized(file, next, h.Archive.UnpackedBytes); err != nil {
		return "", fmt.Errorf("refused: archive of mesh-host %s: %v", h.Version, err)
	}
	return filepath.Join(next, protocol.HostBinaryName), nil
}

// checkHostBinary runs 'bin version' (no environment, ten seconds at
// most): it must run here and say version.
func checkHostBinary(bin, version string) error {
	fi, err := os.Lstat(bin)
	switch {
	case err != nil:
		return fmt.Errorf("the release holds no %s: %v", protocol.HostBinaryName, err)
	case !fi.Mode().IsRegular():
		return fmt.Errorf("the release's %s is not a regular file", protocol.HostBinaryName)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "version")
	cmd.Env = []string{}
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("the binary does not run here: %v", err)
	}
	if says := strings.TrimSpace(out.String()); says != "mesh-host "+version {
		return fmt.Errorf("the binary says %.80q, not mesh-host %s", says, version)
	}
	return nil
}

// keepPrevious keeps the binary this process runs (/proc/self/exe: the
// image running, whatever the executable's path holds now) as the
// previous one, with its version.
func (r *Runner) keepPrevious() error {
	dir := r.upgradePath("previous")
	tmp := dir + ".new"
	os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return err
	}
	if err := copyExecutable("/proc/self/exe", filepath.Join(tmp, protocol.HostBinaryName)); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(tmp, "version"), []byte(Version)); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	return renameSynced(tmp, dir)
}

// stageBeside copies bin to a new file in exe's directory (the same file
// system, so that a rename puts it in exe's place atomically), synced.
func stageBeside(exe, bin string) (string, error) {
	staged := filepath.Join(filepath.Dir(exe), fmt.Sprintf(".%s.%d.new", filepath.Base(exe), os.Getpid()))
	os.Remove(staged)
	if err := copyExecutable(bin, staged); err != nil {
		os.Remove(staged)
		return "", err
	}
	return staged, nil
}

// copyExecutable copies a file to a new one, mode 0755, synced.
func copyExecutable(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// renameSynced renames from to to, and syncs the directory: the rename is
// on disk once it returns.
func renameSynced(from, to string) error {
	if err := os.Rename(from, to); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(to))
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, unix.EINVAL) {
		return err
	}
	return nil
}
