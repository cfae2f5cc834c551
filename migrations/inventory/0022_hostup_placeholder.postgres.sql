-- PostgreSQL twin of 0022_hostup_placeholder.sql: the same schema in PostgreSQL's words
-- (BIGINT for INTEGER, DOUBLE PRECISION for REAL, BYTEA for BLOB, identity
-- for a rowid key, patterns for GLOB; no STRICT).
-- Placeholder for inventory 0022, which is the hostup branch's (issue 31,
-- host self-upgrade): migrations are numbered without gaps, and this
-- branch's 0023 must run on its own. It changes nothing. The integrator
-- drops this file (and its twin) when merging hostup's 0022.
SELECT 1;
