package app

import (
	"context"

	"mesh-controller/contexts/inventory"
)

// Names are the names a person types after a command: the nodes and the
// modules the inventory records.
type Names struct {
	Nodes   []string
	Modules []string
}

// KnownNames reads the nodes' and modules' names from the inventory store,
// opened for this alone and only if it exists (a shell completing a line
// must not make one): what a shell completes a node or module with.
func (c *Controller) KnownNames(ctx context.Context) (Names, error) {
	db, err := c.openOne(ctx, "inventory")
	if err != nil {
		if db != nil {
			db.Close()
		}
		return Names{}, err
	}
	defer db.Close()
	inv := inventory.NewStore(db)
	var out Names
	nodes, err := inv.Nodes(ctx)
	if err != nil {
		return Names{}, err
	}
	for _, n := range nodes {
		out.Nodes = append(out.Nodes, n.Name)
	}
	mods, err := inv.Modules(ctx)
	if err != nil {
		return Names{}, err
	}
	for _, m := range mods {
		out.Modules = append(out.Modules, m.Name)
	}
	return out, nil
}
