-- A module's prepare (issue 31): a roll-out may be allowed, by a person
-- saying why (the why is its hand act's), to upgrade nodes where the
-- module's irreplaceable data cannot be snapshotted first; the planner
-- marks the module so in the declarations of the nodes it moves. Each
-- node's line keeps what its host said of the data once ready at the new
-- version (its prepare ran, on which snapshot).
ALTER TABLE rollouts ADD COLUMN without_snapshot INTEGER NOT NULL DEFAULT 0;
ALTER TABLE rollout_nodes ADD COLUMN prepared TEXT NOT NULL DEFAULT '';
