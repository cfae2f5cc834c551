-- PostgreSQL twin of 0002_fence.sql: the same schema in PostgreSQL's words
-- (BIGINT for INTEGER, DOUBLE PRECISION for REAL, BYTEA for BLOB, identity
-- for a rowid key, patterns for GLOB; no STRICT).
-- This store's fence: the highest lease generation a controller has taken
-- over with (the lease is in the identity store, and no query joins two
-- stores). A serving controller's writes check, in their own transaction,
-- that no newer controller has raised it: a deposed controller's writes are
-- refused by the store.
CREATE TABLE fence (
    id         BIGINT PRIMARY KEY CHECK (id = 1),
    generation BIGINT NOT NULL
);
INSERT INTO fence (id, generation) VALUES (1, 0);
