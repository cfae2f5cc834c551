-- PostgreSQL twin of 0008_declarations_versions.sql: the same schema in PostgreSQL's words
-- (BIGINT for INTEGER, DOUBLE PRECISION for REAL, BYTEA for BLOB, identity
-- for a rowid key, patterns for GLOB; no STRICT).
-- What a listing of nodes reads of each declaration (its serial and plan
-- version), kept apart from its body: node list, status and the snapshot
-- read every node's, and through the table they read every declaration's
-- page, about 4 KB each (at 10,000 nodes, 50 ms of a 75 ms listing). The
-- queries name this index (INDEXED BY): the planner, without statistics,
-- takes the primary key's instead.
CREATE INDEX declarations_versions ON declarations (node, serial, plan_version);
