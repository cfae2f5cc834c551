-- PostgreSQL twin of 0001_nodes.sql: the same schema in PostgreSQL's words
-- (BIGINT for INTEGER, DOUBLE PRECISION for REAL, BYTEA for BLOB, identity
-- for a rowid key, patterns for GLOB; no STRICT).
-- Nodes: the machines the mesh knows, a record first, a joined machine once its
-- host presents its token. Names are checked here too, as a last defence.
CREATE TABLE nodes (
    name       TEXT PRIMARY KEY
               CHECK (length(name) BETWEEN 1 AND 63
                      AND name ~ '^[a-z]'
                      AND name !~ '[^a-z0-9-]'),
    mode       TEXT NOT NULL CHECK (mode IN ('adopted', 'converged')),
    created_at TEXT NOT NULL,
    joined_at  TEXT,
    last_heard TEXT
);
