package plan

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"time"

	"mesh-controller/app/protocol"
	"mesh-controller/contexts/inventory"
)

// BackupSet is one data set the mesh backs up: every precious data set of
// an assigned module, and every one retired and waiting for a person (its
// data is kept on its node, so it is kept backed up), but the backup
// seat holder's own (its repository holds the copies: a copy of it into
// itself would be none).
type BackupSet struct {
	Node, Module string
	Data         inventory.DataSpec
	Retired      bool
}

// Key is node/module/data.
func (b BackupSet) Key() string { return b.Node + "/" + b.Module + "/" + b.Data.Name }

// BackupSets are the data sets the mesh backs up, by node, module, name.
func BackupSets(snap *inventory.Snapshot) []BackupSet {
	holders := map[inventory.Holder]bool{}
	for _, h := range snap.Seats.Holders[snap.Seats.SeatName("backup")] {
		holders[h] = true
	}
	var out []BackupSet
	seen := map[string]bool{}
	for _, a := range snap.Assignments {
		if holders[inventory.Holder{Node: a.Node, Module: a.Module}] {
			continue
		}
		for _, d := range snap.Manifests[a.Module][a.Version].Data {
			if d.Precious == inventory.Rebuildable {
				continue
			}
			s := BackupSet{Node: a.Node, Module: a.Module, Data: d}
			seen[s.Key()] = true
			out = append(out, s)
		}
	}
	for _, r := range snap.Seats.Retired {
		if r.Precious == inventory.Rebuildable {
			continue
		}
		d := inventory.DataSpec{Name: r.DataSet, Path: r.Path, Precious: r.Precious}
		// Its manifest's word for it, when the module is still known.
		for _, md := range snap.Manifests[r.Module][snap.Current[r.Module]].Data {
			if md.Name == r.DataSet {
				d.Backup = md.Backup
			}
		}
		s := BackupSet{Node: r.Node, Module: r.Module, Data: d, Retired: true}
		if seen[s.Key()] || holders[inventory.Holder{Node: r.Node, Module: r.Module}] {
			continue // assigned again meanwhile, or the holder's own
		}
		seen[s.Key()] = true
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key() < out[j].Key() })
	return out
}

// WithRecipients gives the planner the hosts' age recipients, by node: the
// backup holder seals each node's access to its node's.
func (pl *Planner) WithRecipients(r map[string]string) *Planner {
	pl.recipients = r
	return pl
}

// backupLines are every data set the mesh backs up, for the backup seat's
// holder.
func (pl *Planner) backupLines() []protocol.BackupLine {
	lines := []protocol.BackupLine{}
	for _, s := range pl.shared().backupSets {
		d := s.Data
		l := protocol.BackupLine{Node: s.Node, Module: s.Module, Data: d.Name, Path: d.Path, Precious: d.Precious, Cadence: BackupCadence(d).String(),
			Keep: Retention(d), Recipient: pl.recipients[s.Node], Retired: s.Retired}
		if t, ok := pl.snap.Seats.Backups[s.Key()]; ok {
			l.LastBackup = &t
		}
		if st, ok := pl.snap.Seats.BackupStates[s.Key()]; ok && st.VerifiedAt != nil {
			l.LastVerified = st.VerifiedAt
		}
		lines = append(lines, l)
	}
	return lines
}

// Retention is what the holder keeps of a data set's snapshots: its
// manifest's keep, else protocol.DefaultRetention.
func Retention(d inventory.DataSpec) protocol.Retention {
	if k := d.Backup.Keep; k != nil {
		return protocol.Retention{Hourly: k.Hourly, Daily: k.Daily, Weekly: k.Weekly, Monthly: k.Monthly}
	}
	return protocol.DefaultRetention
}

// DefaultBackupPort is where the backup module listens for its REST
// server when neither its manifest (a port named rest) nor its settings
// ("port") name one.
const DefaultBackupPort = protocol.DefaultBackupPort

// BackupHolder is the backup seat's holder, and where nodes reach its
// repositories ("": no holder; Address "" with Why: it cannot be reached
// yet).
type BackupHolder struct {
	inventory.Holder
	Address string
	Port    int
	Why     string
}

// Backup is the holder of the backup seat and its address: the backup
// module's settings' "address" when a person set one, else its node's
// overlay address.
func (pl *Planner) Backup() BackupHolder {
	hs := pl.snap.Seats.Holders[pl.snap.Seats.SeatName("backup")]
	if len(hs) == 0 {
		return BackupHolder{Why: "no module holds the backup seat"}
	}
	h := BackupHolder{Holder: hs[0], Port: DefaultBackupPort}
	m := pl.snap.Manifests[h.Module][pl.snap.VersionOn(h.Node, h.Module)]
	named := false
	for _, p := range m.Ports {
		if p.Name == "rest" {
			h.Port, named = p.Port, true
		}
	}
	if sch, err := pl.schema(m); err == nil {
		settings, _ := pl.effective(m, sch, h.Node)
		var s struct {
			Address string `json:"address"`
			Port    int    `json:"port"`
		}
		if json.Unmarshal(settings, &s) == nil && s.Port > 0 && s.Port < 65536 && !named {
			h.Port = s.Port
		}
		if s.Address != "" {
			h.Address = s.Address
			return h
		}
	}
	if o := pl.Overlay(h.Node); o != nil {
		if p, err := netip.ParsePrefix(o.Address4); err == nil {
			h.Address = p.Addr().String()
			return h
		}
	}
	h.Why = fmt.Sprintf("%s has no overlay address yet and its settings give no address", h.Node)
	return h
}

// backups are node's own data sets its host backs up when asked, each
// with the holder's address and the node's access (once issued by this
// holder).
func (pl *Planner) backups(node string) []protocol.DeclaredBackup {
	w := pl.shared()
	var out []protocol.DeclaredBackup
	h := w.holder
	for _, i := range w.setsOf[node] {
		s := w.backupSets[i]
		if h.Address == "" {
			return nil
		}
		b := protocol.DeclaredBackup{Module: s.Module, Data: s.Data.Name, Path: s.Data.Path, Cadence: CadenceWord(s.Data),
			Before: s.Data.Backup.Before, Repository: Repository(h.Address, h.Port, node)}
		if a, ok := pl.snap.Seats.Access[node]; ok && a.Holder == h.Node {
			b.Access = a.Sealed
		}
		out = append(out, b)
	}
	return out
}

// Repository is node's repository on the holder at address:port, as restic
// names it, with no credential.
func Repository(address string, port int, node string) string {
	host := address
	if a, err := netip.ParseAddr(address); err == nil && a.Is6() {
		host = "[" + address + "]"
	}
	return "rest:http://" + host + ":" + strconv.Itoa(port) + "/" + node + "/"
}

// DrillEvery is how many cadences may pass between restore drills that
// pass: the holder drills each data set at least once in that many.
const DrillEvery = 7

// DrillBound is how long a data set may go without a passing drill.
func DrillBound(d inventory.DataSpec) time.Duration { return DrillEvery * BackupCadence(d) }
