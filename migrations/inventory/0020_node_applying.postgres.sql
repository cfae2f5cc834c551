-- PostgreSQL twin of 0020_node_applying.sql: the same schema in PostgreSQL's words
-- (BIGINT for INTEGER, DOUBLE PRECISION for REAL, BYTEA for BLOB, identity
-- for a rowid key, patterns for GLOB; no STRICT).
-- What a node's host says it is applying, from its latest heartbeat: the
-- declaration's serial, since when (the host's clock) and the phase under
-- way; NULL between applies, and for hosts that predate it. An apply that
-- fetches a large archive takes minutes, and node list and node show say
-- so rather than leave the node looking stuck.
ALTER TABLE nodes ADD COLUMN applying_serial BIGINT;
ALTER TABLE nodes ADD COLUMN applying_since TEXT;
ALTER TABLE nodes ADD COLUMN applying_phase TEXT;
