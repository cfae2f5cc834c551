package host

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"mesh-controller/app/nftables"
	"mesh-controller/app/protocol"
)

// The mesh's packet filter on this machine is one nftables table of its
// own (protocol.FilterTable): replaced atomically with nft -f, never
// touching another table, and rolled back by the host itself when it
// cannot hear the controller within the confirm window after applying it
// (a person locked out of a machine is the failure to prevent).

// DefaultFilterConfirm is how long a host waits to hear the controller
// after applying a filter before it rolls the filter back.
const DefaultFilterConfirm = 60 * time.Second

// Files of the state dir (0600, as every file there) about the filter.
const (
	// fileFilter is what the host remembers of the mesh's filter (filterState).
	fileFilter = "filter.json"
	// fileFilterBefore is the mesh's table as it was before the filter
	// waiting to be confirmed, as nft list printed it, or "none": what a
	// rollback restores.
	fileFilterBefore = "filter.before"
	noTable          = "none"
)

// filterState is what the host remembers of the mesh's filter.
type filterState struct {
	// State is one of protocol's Filter… states; "" when the mesh never
	// declared a filter here.
	State  string    `json:"state,omitempty"`
	Serial int64     `json:"serial,omitempty"`
	Why    string    `json:"why,omitempty"`
	At     time.Time `json:"at,omitzero"`
	// Digest is the sha256 of the ruleset applied: the same ruleset
	// declared again (other parts of the declaration changed) is not
	// applied and confirmed again.
	Digest string `json:"digest,omitempty"`
	// Owned says the mesh's table is in place and this host put it
	// there: a declaration without a filter then removes it.
	Owned bool `json:"owned,omitempty"`
}

func loadFilter(dir string) (filterState, error) { return loadJSON[filterState](dir, fileFilter) }

func saveFilter(dir string, f filterState) error { return saveJSON(dir, fileFilter, f) }

// fact is the filter's state as a fact (protocol.FilterFact), or false
// when the mesh never declared a filter here.
func (f filterState) fact() (protocol.Fact, bool) {
	if f.State == "" {
		return protocol.Fact{}, false
	}
	return protocol.Fact{Name: protocol.FilterFact, Value: f.State, Why: f.Why}, true
}

// nftElsewhere are where nft is looked for when it is not on PATH.
var nftElsewhere = []string{"/usr/sbin/nft", "/sbin/nft"}

// nftBin finds the nft tool: on PATH, else where Debian's nftables puts it
// (a PATH without /usr/sbin is common outside root's login shell).
func nftBin() (string, error) {
	return toolBin("nft", nftElsewhere, "nft is not installed: this host cannot apply the mesh's packet filter (apt-get install nftables)")
}

// toolBin finds a tool on PATH, else at one of elsewhere; missing says
// what its absence means.
func toolBin(name string, elsewhere []string, missing string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, p := range elsewhere {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New(missing)
}

// filterUsable says why this host cannot apply a packet filter, or nil.
func filterUsable() error {
	if os.Geteuid() != 0 {
		return errors.New("this host does not run as root: it cannot apply the mesh's packet filter; run mesh-host as root, or converge the node with no filter ('mesh-controller converge NODE')")
	}
	_, err := nftBin()
	return err
}

// nft runs the nft tool with args, script on its stdin; its error is one
// line with nft's own message.
func nft(script string, args ...string) (string, error) {
	bin, err := nftBin()
	if err != nil {
		return "", err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdin = strings.NewReader(script)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		msg := strings.Join(strings.Fields(errOut.String()), " ")
		if msg == "" {
			msg = err.Error()
		}
		return "", fmt.Errorf("nft %s: %s", strings.Join(args, " "), msg)
	}
	return out.String(), nil
}

// checkRuleset judges a ruleset with nft -c (nothing applied), on a host
// that can apply one at all.
func checkRuleset(ruleset string) error {
	if err := filterUsable(); err != nil {
		return err
	}
	_, err := nft(nftables.Replace(ruleset), "-c", "-f", "-")
	return err
}

// installRuleset replaces the mesh's table with ruleset, atomically.
func installRuleset(ruleset string) error {
	_, err := nft(nftables.Replace(ruleset), "-f", "-")
	return err
}

// noSuchTable says an nft error is about the mesh's table not being there.
func noSuchTable(err error) bool {
	return err != nil && strings.Contains(err.Error(), "No such file or directory")
}

// currentTable is the mesh's table as nft lists it, or noTable.
func currentTable() (string, error) {
	out, err := nft("", "list", "table", "inet", "mesh")
	if noSuchTable(err) {
		return noTable, nil
	}
	return out, err
}

// deleteTable deletes the mesh's table, and only it; gone already is done.
func deleteTable() error {
	_, err := nft("", "delete", "table", "inet", "mesh")
	if noSuchTable(err) {
		return nil
	}
	return err
}

// declaredFilter reads the filter of a declaration this host is about to
// apply, and says why it cannot be applied here (refused), before any of
// the declaration is: not root, no nft, or a ruleset nft -c refuses. A
// declaration apply will refuse anyway is left to apply, whose refusal
// says more.
func declaredFilter(st *State, last int64, env protocol.Envelope) (f *protocol.DeclaredFilter, serial int64, refused string) {
	d, err := st.Verify(env)
	if err != nil || d.Node != st.Node || d.Serial <= last {
		return nil, 0, ""
	}
	if d.Filter == nil || len(d.Problems()) > 0 {
		return d.Filter, d.Serial, ""
	}
	if err := checkRuleset(d.Filter.Ruleset); err != nil {
		return nil, d.Serial, "refused: the packet filter: " + err.Error()
	}
	return d.Filter, d.Serial, ""
}

// setFilter makes the mesh's table what declaration serial declares,
// with r.mu held: removed when it declares none (if this host put one
// there), else replaced, after keeping what was there for a rollback, and
// then confirmed (confirmFilter) or rolled back.
func (r *Runner) setFilter(nc *nats.Conn, f *protocol.DeclaredFilter, serial int64) error {
	now := time.Now().UTC()
	if f == nil {
		if !r.filter.Owned {
			return nil
		}
		r.endConfirm()
		if err := deleteTable(); err != nil {
			return fmt.Errorf("remove the mesh's packet filter: %w", err)
		}
		os.Remove(filepath.Join(r.State.Dir, fileFilterBefore))
		r.filter = filterState{State: protocol.FilterRemoved, Serial: serial, At: now,
			Why: fmt.Sprintf("declaration %d carries no filter: the mesh's table (%s) removed at %s", serial, protocol.FilterTable, now.Format(time.RFC3339))}
		r.logf("removed the mesh's packet filter (table %s)", protocol.FilterTable)
		return saveFilter(r.State.Dir, r.filter)
	}
	sum := sha256.Sum256([]byte(f.Ruleset))
	digest := hex.EncodeToString(sum[:])
	// What a rollback restores is the last table kept (or none): a filter
	// replaced while it waited to be confirmed was never kept.
	if r.filter.State != protocol.FilterWaiting {
		before, err := currentTable()
		if err != nil {
			return fmt.Errorf("keep the ruleset before the filter: %w", err)
		}
		// The same ruleset, applied and kept already: left as it is,
		// unless someone removed the table meanwhile.
		if r.filter.State == protocol.FilterKept && r.filter.Digest == digest && before != noTable {
			return nil
		}
		if err := writeFile(filepath.Join(r.State.Dir, fileFilterBefore), []byte(before)); err != nil {
			return err
		}
	}
	r.endConfirm()
	if err := installRuleset(f.Ruleset); err != nil {
		return fmt.Errorf("apply the packet filter: %w", err)
	}
	window := r.FilterConfirm
	r.filter = filterState{State: protocol.FilterWaiting, Serial: serial, At: now, Digest: digest, Owned: true,
		Why: fmt.Sprintf("declaration %d's filter applied at %s; rolled back unless the controller is heard within %s", serial, now.Format(time.RFC3339), window)}
	if err := saveFilter(r.State.Dir, r.filter); err != nil {
		return err
	}
	r.logf("applied the packet filter of declaration %d; waiting up to %s to hear the controller", serial, window)
	r.startConfirm(nc, serial, now.Add(window))
	return nil
}

// startConfirm runs confirmFilter until it ends or endConfirm, with r.mu held.
func (r *Runner) startConfirm(nc *nats.Conn, serial int64, deadline time.Time) {
	ctx, cancel := context.WithCancel(r.ctx)
	r.confirming = cancel
	go r.confirmFilter(ctx, nc, serial, deadline)
}

// endConfirm ends the confirmation under way, if any, with r.mu held.
func (r *Runner) endConfirm() {
	if r.confirming != nil {
		r.confirming()
		r.confirming = nil
	}
}

// confirmFilter keeps the filter of declaration serial if the controller
// is heard before deadline, and rolls it back if not. Hearing is a round
// trip to the controller itself, asking for this node's latest
// declaration: only a serving controller answers it (the broker alone
// answers no one), over the very connection the filter now judges, so an
// answer proves that what the controller sends still reaches this host
// after the filter is in place. Any answer will do; a newer declaration
// in it comes by the usual ask and push.
func (r *Runner) confirmFilter(ctx context.Context, nc *nats.Conn, serial int64, deadline time.Time) {
	req, err := protocol.Sign(r.State.HostKey, protocol.DeclarationAskBody{SerialApplied: serial})
	for attempt := 1; err == nil; attempt++ {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		actx, cancel := context.WithTimeout(ctx, min(left, protocol.AnswerTimeout))
		_, aerr := askOnceLatest(actx, nc, r.State.Node, req)
		cancel()
		if ctx.Err() != nil {
			return // replaced, removed, or the host stops
		}
		if aerr == nil {
			r.keepFilter(nc, serial)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(min(backoff(attempt, 250*time.Millisecond, 2*time.Second), time.Until(deadline))):
		}
	}
	r.rollBack(nc, serial, err)
}

// keepFilter records the filter of declaration serial kept and says so.
func (r *Runner) keepFilter(nc *nats.Conn, serial int64) {
	r.mu.Lock()
	if r.filter.State != protocol.FilterWaiting || r.filter.Serial != serial {
		r.mu.Unlock()
		return
	}
	now := time.Now().UTC()
	r.filter.State, r.filter.At = protocol.FilterKept, now
	r.filter.Why = fmt.Sprintf("declaration %d's filter applied and kept: the controller heard at %s", serial, now.Format(time.RFC3339))
	r.endConfirm() // its own context, done with
	err := saveFilter(r.State.Dir, r.filter)
	r.mu.Unlock()
	if err != nil {
		r.warnf("remember the filter kept: %v", err)
	}
	r.logf("kept the packet filter of declaration %d: the controller was heard", serial)
	r.reportFacts(nc, true)
}

// rollBack restores what the mesh's table was before the filter of
// declaration serial (or deletes the table if there was none), records
// why, and reports it in the facts until the broker has them.
func (r *Runner) rollBack(nc *nats.Conn, serial int64, signErr error) {
	r.mu.Lock()
	if r.filter.State != protocol.FilterWaiting || r.filter.Serial != serial {
		r.mu.Unlock()
		return
	}
	now := time.Now().UTC()
	why := fmt.Sprintf("declaration %d's filter rolled back at %s: the controller was not heard within %s after applying it", serial, now.Format(time.RFC3339), r.FilterConfirm)
	if signErr != nil {
		why = fmt.Sprintf("declaration %d's filter rolled back at %s: %v", serial, now.Format(time.RFC3339), signErr)
	}
	owned := true
	before, err := os.ReadFile(filepath.Join(r.State.Dir, fileFilterBefore))
	switch {
	case err != nil:
		err = fmt.Errorf("read the ruleset before it: %w", err)
	case strings.TrimSpace(string(before)) == noTable:
		err, owned = deleteTable(), false
	default:
		err = installRuleset(string(before))
	}
	if err != nil {
		why += "; restoring the ruleset before it failed: " + err.Error()
	} else {
		why += "; the ruleset before it is restored"
	}
	r.filter = filterState{State: protocol.FilterRolledBack, Serial: serial, At: now, Why: why, Owned: owned}
	r.endConfirm() // its own context, done with
	serr := saveFilter(r.State.Dir, r.filter)
	r.mu.Unlock()
	if serr != nil {
		r.warnf("remember the rollback: %v", serr)
	}
	r.warnf("%s", why)
	// Reported until the broker has it (and at every reconnection after):
	// the connection may take a moment to come back once the filter is gone.
	for attempt := 1; r.ctx.Err() == nil; attempt++ {
		r.reportFacts(nc, true)
		if nc.FlushTimeout(protocol.AnswerTimeout) == nil {
			return
		}
		select {
		case <-r.ctx.Done():
		case <-time.After(backoff(attempt, 250*time.Millisecond, 4*time.Second)):
		}
	}
}

// reportFacts reports the machine's facts: always, or only when they
// changed since the last report, leaving aside what moves all the time
// (the free disk space, carried by the next report that goes anyway), so
// that a fleet's hosts looking every minute send next to nothing.
func (r *Runner) reportFacts(nc *nats.Conn, always bool) {
	body := r.facts()
	compared := factsCompared(body)
	r.factsMu.Lock()
	same := bytes.Equal(compared, r.factsSent)
	if always || !same {
		r.factsSent = compared
	}
	r.factsMu.Unlock()
	if always || !same {
		r.publish(nc, protocol.FactsReport, body)
	}
}

// factsCompared is a facts report's bytes less the facts that move all the
// time, as reportFacts compares them.
func factsCompared(body protocol.FactsBody) []byte {
	kept := body
	kept.Facts = nil
	for _, f := range body.Facts {
		if f.Name != "disk_free_mb" {
			kept.Facts = append(kept.Facts, f)
		}
	}
	b, _ := json.Marshal(kept)
	return b
}

// facts are the machine's facts, and the mesh's filter's and overlay's
// states among them.
func (r *Runner) facts() protocol.FactsBody {
	body := Facts(r.Root)
	r.mu.Lock()
	f, ok := r.filter.fact()
	body.Facts = append(body.Facts, r.overlayFacts()...)
	r.mu.Unlock()
	if ok {
		body.Facts = append(body.Facts, f)
	}
	return body
}
