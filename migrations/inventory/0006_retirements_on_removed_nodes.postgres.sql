-- PostgreSQL twin of 0006_retirements_on_removed_nodes.sql: the same schema in PostgreSQL's words
-- (BIGINT for INTEGER, DOUBLE PRECISION for REAL, BYTEA for BLOB, identity
-- for a rowid key, patterns for GLOB; no STRICT).
-- A removed node's retired (and dropped) data stays remembered until a person
-- cleans it up: its bytes are still on that machine's disk. The row keeps
-- when its node was removed, so that a node added later under the same name
-- is a fresh record that never takes the old data for its own; and the last
-- backup heard of it, because the node's reports and backup records go with
-- the node (retirements.bytes keeps its size as last reported).
ALTER TABLE retirements ADD COLUMN node_removed_at TEXT;
ALTER TABLE retirements ADD COLUMN last_backup TEXT;
