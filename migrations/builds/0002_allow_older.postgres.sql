-- PostgreSQL twin of 0002_allow_older.sql: the same schema in PostgreSQL's words
-- (BIGINT for INTEGER, DOUBLE PRECISION for REAL, BYTEA for BLOB, identity
-- for a rowid key, patterns for GLOB; no STRICT).
-- replay --register --older: an ask that may register a version older than
-- the module's current one (any other older build is superseded).
ALTER TABLE asks ADD COLUMN allow_older BIGINT NOT NULL DEFAULT 0;
