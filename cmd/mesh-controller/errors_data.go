package main

import (
	"errors"
	"fmt"

	"mesh-controller/app"
	"mesh-controller/contexts/inventory"
)

// dataHint is the "what to do" half of the errors of cleanup and node
// removal, kept apart from hint so each is read where its commands are.
func dataHint(err error) string {
	var refused *app.RefusedError
	switch {
	case errors.As(err, &refused):
		return "each line above is what would be lost and the command that deletes exactly that"
	case errors.Is(err, app.ErrDigestChanged):
		return "check the preview above, which is the one now, and run again with its digest if it is what you mean to lose"
	case errors.Is(err, app.ErrAmbiguous):
		return "each preview above has its own digest: run again with --yes and the digest of the one you mean"
	case errors.Is(err, app.ErrNeedsDigest):
		return "check the preview, and if it is what you mean to lose, run the same command with --yes and its digest"
	case errors.Is(err, app.ErrBeingDeleted):
		return "see 'mesh-controller cleanup': it stops being listed once its host reports it gone"
	case errors.Is(err, app.ErrTooManyNodes):
		return fmt.Sprintf("split the list: one command removes at most %d nodes", app.MaxNodesAtOnce)
	case errors.Is(err, app.ErrNamedTwice):
		return "name each node once"
	case errors.Is(err, app.ErrNoNodes):
		return "write one node name a line"
	case errors.Is(err, app.ErrInvalidName):
		return "fix that line: node names are as 'mesh-controller node list' shows them"
	case errors.Is(err, inventory.ErrStillAssigned):
		return "something was assigned there meanwhile: run node remove again, with --and-unassign to take it off"
	case errors.Is(err, inventory.ErrNotCleanable):
		return "see what is left with 'mesh-controller cleanup' and run again"
	}
	return ""
}
