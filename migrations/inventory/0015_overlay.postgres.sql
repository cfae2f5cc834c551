-- PostgreSQL twin of 0015_overlay.sql: the same schema in PostgreSQL's
-- words (no STRICT).
-- The overlay (overlay place, overlay show): the mesh's own IPv6 ULA /48,
-- made once at random by the store on first need (NULL until then: SQL has
-- no cryptographic randomness), and the counter overlay indexes are taken
-- from. The counter only goes forward: a forgotten node's index (and so
-- its addresses) is never given again.
CREATE TABLE overlay_mesh (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    prefix     TEXT,
    next_index INTEGER NOT NULL CHECK (next_index >= 1)
);
-- Each node's overlay index (its addresses are the overlay's prefixes plus
-- it), taken when the node is recorded and kept for its life, and where it
-- is and how it is reached: an endpoint host:port, a site name, whether it
-- is public or behind NAT (NULL: not placed).
ALTER TABLE nodes ADD COLUMN overlay_index INTEGER;
ALTER TABLE nodes ADD COLUMN overlay_endpoint TEXT;
ALTER TABLE nodes ADD COLUMN overlay_site TEXT;
ALTER TABLE nodes ADD COLUMN overlay_reach TEXT CHECK (overlay_reach IN ('public', 'behind-nat'));
CREATE UNIQUE INDEX nodes_overlay_index ON nodes (overlay_index);
-- Nodes recorded before the overlay existed take the first indexes.
UPDATE nodes SET overlay_index = (SELECT count(*) FROM nodes m WHERE m.name <= nodes.name);
INSERT INTO overlay_mesh (id, prefix, next_index) VALUES (1, NULL, (SELECT count(*) + 1 FROM nodes));
-- The direct overlay peers a node's host has not heard a handshake from
-- within protocol.OverlayPeerSilentAfter (node.overlay-peer-silent): a row
-- while silent, written only when a pair turns silent or is heard again,
-- so that heartbeats stay one update per node. last_handshake is NULL for
-- none ever.
CREATE TABLE overlay_silent_peers (
    node           TEXT NOT NULL REFERENCES nodes (name) ON DELETE CASCADE,
    peer           TEXT NOT NULL,
    since          TEXT NOT NULL,
    last_handshake TEXT,
    PRIMARY KEY (node, peer)
);
