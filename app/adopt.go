package app

import (
	"context"
)

// Adopt returns a converged node to adopted (adopt <node>): the mesh owns
// no packet filter there any more, so the node's next declaration, made
// and sent now, carries none and its host removes the mesh's table (and
// only that); what the mesh took there stays taken, its modules and data
// as they are. Refused for an unknown node, or one adopted already.
func (c *Nodes) Adopt(ctx context.Context, node string) (Pushed, error) {
	if err := CheckName(node); err != nil {
		return Pushed{}, err
	}
	st, err := c.stores(ctx)
	if err != nil {
		return Pushed{}, err
	}
	// Said before the write and until declared, so that a serving
	// controller's catch-up leaves the node to this act.
	under, err := st.Inventory.BeginAct(ctx, "adopt", c.Now().Add(actUnderWayFor))
	if err != nil {
		return Pushed{}, err
	}
	defer st.Inventory.EndAct(context.WithoutCancel(ctx), under, c.Now())
	if err := st.Inventory.Adopt(ctx, node); err != nil {
		return Pushed{}, err
	}
	pushed, err := c.sendPlans(ctx, st, []string{node})
	if err != nil {
		return Pushed{}, err
	}
	return pushed[0], nil
}
