-- PostgreSQL twin of 0006_lease_generation_fence_standbys.sql: the same schema in PostgreSQL's words
-- (BIGINT for INTEGER, DOUBLE PRECISION for REAL, BYTEA for BLOB, identity
-- for a rowid key, patterns for GLOB; no STRICT).
-- Fencing for a standby controller. Each takeover of the lease bumps its
-- generation; fence keeps the highest generation ever issued (it outlives
-- the lease row, which is deleted when the lease is given back), and is
-- this store's own fence: a write made by a deposed controller, carrying
-- an older generation, is refused in the same transaction.
ALTER TABLE lease ADD COLUMN generation BIGINT NOT NULL DEFAULT 0;

CREATE TABLE fence (
    id         BIGINT PRIMARY KEY CHECK (id = 1),
    generation BIGINT NOT NULL
);
INSERT INTO fence (id, generation) VALUES (1, 0);

-- Controllers standing by, each heard until expires_at (renewed as it
-- polls the lease), so that broker show and doctor say who would take over.
CREATE TABLE standbys (
    holder     TEXT PRIMARY KEY,
    pid        BIGINT NOT NULL,
    host       TEXT NOT NULL,
    since      TEXT NOT NULL,
    expires_at TEXT NOT NULL
);
