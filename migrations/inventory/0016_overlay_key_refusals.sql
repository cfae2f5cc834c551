-- A WireGuard key a node's host reported while another node held it
-- (overlay.key-conflict): the key is not recorded as the node's, the first
-- holder keeps it, and the node is out of the overlay until its host
-- reports a key of its own. A row while refused, holder the node found
-- holding it; since when it was first refused.
CREATE TABLE overlay_key_refusals (
    node   TEXT PRIMARY KEY REFERENCES nodes (name) ON DELETE CASCADE,
    holder TEXT NOT NULL,
    key    TEXT NOT NULL,
    since  TEXT NOT NULL
) STRICT;
