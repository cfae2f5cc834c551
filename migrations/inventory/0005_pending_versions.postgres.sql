-- PostgreSQL twin of 0005_pending_versions.sql: the same schema in PostgreSQL's words
-- (BIGINT for INTEGER, DOUBLE PRECISION for REAL, BYTEA for BLOB, identity
-- for a rowid key, patterns for GLOB; no STRICT).
-- A version recorded for an assignment by 'upgrade record' and not yet sent:
-- the node is behind, the catch-up sends nothing for it, and 'push --behind'
-- or a roll-out moves the assignment to it.
ALTER TABLE assignments ADD COLUMN pending_version TEXT;
