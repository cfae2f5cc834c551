-- PostgreSQL twin of 0017_archive_unpacked_bytes.sql: the same schema in PostgreSQL's words
-- (BIGINT for INTEGER, DOUBLE PRECISION for REAL, BYTEA for BLOB, identity
-- for a rowid key, patterns for GLOB; no STRICT).
-- What a built version's archive unpacks to (the sum of its regular files'
-- sizes), declared to hosts with its digest and signed with it: a host
-- refuses one that does not fit its disk before unpacking it, and stops
-- one that unpacks past it. 0 for versions built before it was kept: their
-- hosts learn it from the archive's own headers.
ALTER TABLE module_versions ADD COLUMN archive_unpacked_bytes BIGINT NOT NULL DEFAULT 0;
