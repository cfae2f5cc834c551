package app

import (
	"context"
	"sort"
	"time"

	"mesh-controller/contexts/inventory"
)

// DataView is one data set a machine declares, or keeps after its module
// left, as last found.
type DataView struct {
	Node     string `json:"node"`
	Module   string `json:"module"`
	Name     string `json:"name"`
	Path     string `json:"path"`
	Bytes    *int64 `json:"bytes"`
	Precious string `json:"precious"`
	// State is active (declared), retired (precious data whose module left)
	// or dropped (rebuildable data whose module left): the last two stay on
	// the node's disk until 'cleanup delete'.
	State      string     `json:"state"`
	LastBackup *time.Time `json:"last_backup"`
	// LastVerified is the last restore drill of it that passed.
	LastVerified *time.Time `json:"last_verified"`
	BackupHolder string     `json:"backup_holder"`
	Since        *time.Time `json:"since,omitempty"`
	// NodeRemovedAt says its node was removed (and when); its size and last
	// backup are as last heard before.
	NodeRemovedAt *time.Time `json:"node_removed_at"`
}

// Data lists every data set every machine declares: active ones from the
// assignments; retired and dropped ones remembered after their module left,
// on nodes in the mesh and on removed ones, until a person cleans them up.
func (c *Seats) Data(ctx context.Context) ([]DataView, error) {
	st, err := c.stores(ctx)
	if err != nil {
		return nil, err
	}
	ds, err := readDataState(ctx, st.Inventory)
	if err != nil {
		return nil, err
	}
	return dataViews(ds.snap, ds.data, ds.retirements), nil
}

func dataViews(snap *inventory.Snapshot, data map[string][]inventory.DataSet, rs []inventory.Retirement) []DataView {
	holder := snap.BackupHolders()
	out := []DataView{}
	add := func(v DataView) {
		if v.Precious != inventory.Rebuildable {
			v.BackupHolder = holder
		}
		out = append(out, v)
	}
	heard := func(v DataView) DataView {
		if d := reportedSet(data[v.Node], v.Module, v.Name); d != nil {
			v.Bytes = &d.Bytes
		}
		v.LastBackup = lastBackupHeard(snap, data, v.Node, v.Module, v.Name)
		v.LastVerified = snap.Seats.BackupStates[v.Node+"/"+v.Module+"/"+v.Name].VerifiedAt
		return v
	}
	for _, a := range snap.Assignments {
		for _, d := range snap.Manifests[a.Module][a.Version].Data {
			add(heard(DataView{Node: a.Node, Module: a.Module, Name: d.Name, Path: d.Path, Precious: d.Precious, State: "active"}))
		}
	}
	for _, r := range rs {
		if (r.State != "retired" && r.State != "dropped") || r.Consumer != "" {
			continue
		}
		since := r.RetiredAt
		v := DataView{Node: r.Node, Module: r.Module, Name: r.DataSet, Path: r.Path, Precious: r.Precious, State: r.State, Since: &since}
		if r.NodeRemovedAt == nil {
			v = heard(v)
		} else {
			// The node is gone, and so are its reports; a node now bearing
			// its name reports its own data, never this.
			v.Bytes, v.LastBackup, v.NodeRemovedAt = r.Bytes, r.LastBackup, r.NodeRemovedAt
		}
		add(v)
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if ka, kb := a.Node+"/"+a.Module+"/"+a.Name, b.Node+"/"+b.Module+"/"+b.Name; ka != kb {
			return ka < kb
		}
		return a.NodeRemovedAt != nil && b.NodeRemovedAt == nil
	})
	return out
}
