-- A version recorded for an assignment by 'upgrade record' and not yet sent:
-- the node is behind, the catch-up sends nothing for it, and 'push --behind'
-- or a roll-out moves the assignment to it.
ALTER TABLE assignments ADD COLUMN pending_version TEXT;
