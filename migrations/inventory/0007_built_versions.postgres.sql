-- PostgreSQL twin of 0007_built_versions.sql: the same schema in PostgreSQL's words
-- (BIGINT for INTEGER, DOUBLE PRECISION for REAL, BYTEA for BLOB, identity
-- for a rowid key, patterns for GLOB; no STRICT).
-- A version the mesh built carries its archive (content-addressed by its
-- sha256, in the broker's object store) and the build that made it; a
-- version registered by hand has none and runs from what its host has.
ALTER TABLE module_versions ADD COLUMN archive_digest TEXT NOT NULL DEFAULT '';
ALTER TABLE module_versions ADD COLUMN archive_bytes BIGINT NOT NULL DEFAULT 0;
ALTER TABLE module_versions ADD COLUMN build_id TEXT NOT NULL DEFAULT '';
