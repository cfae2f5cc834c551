-- PostgreSQL twin of 0021_rollouts.sql: the same schema in PostgreSQL's words
-- (BIGINT for INTEGER, DOUBLE PRECISION for REAL, BYTEA for BLOB, identity
-- for a rowid key, patterns for GLOB; no STRICT).
-- Health-gated roll-outs (issue 31): the last roll-out of each module, as
-- the serving controller drives it (canary, batches, soak) and rolls it
-- back; it survives the controller's restart, and its nodes' from versions
-- are what a rollback returns to (the collection keeps their archives).
-- One a module: a new roll-out replaces the module's ended one.
CREATE TABLE rollouts (
    module       TEXT PRIMARY KEY,
    id           TEXT NOT NULL,
    to_version   TEXT NOT NULL,
    canary       BIGINT NOT NULL,
    batch        TEXT NOT NULL,
    wait_ms      BIGINT NOT NULL,
    soak_ms      BIGINT NOT NULL,
    max_failures BIGINT NOT NULL,
    phase        TEXT NOT NULL CHECK (phase IN ('running', 'soaking', 'rolling-back', 'done', 'stopped', 'rolled-back')),
    why          TEXT NOT NULL DEFAULT '',
    who          TEXT NOT NULL DEFAULT '',
    started_at   TEXT NOT NULL,
    updated_at   TEXT NOT NULL
);
-- Each node of a roll-out: the version it ran, its batch (0 the canary),
-- what became of its move (result) and, once rolled back, of its return
-- (back), with the host's word on the module after it (detail).
CREATE TABLE rollout_nodes (
    module       TEXT NOT NULL,
    node         TEXT NOT NULL,
    from_version TEXT NOT NULL,
    batch        BIGINT NOT NULL,
    moved        BIGINT NOT NULL DEFAULT 0,
    serial       BIGINT NOT NULL DEFAULT 0,
    applied      BIGINT NOT NULL DEFAULT 0,
    result       TEXT NOT NULL DEFAULT 'waiting' CHECK (result IN ('waiting', 'moved', 'ready', 'failed')),
    error        TEXT NOT NULL DEFAULT '',
    back         TEXT NOT NULL DEFAULT '' CHECK (back IN ('', 'returning', 'returned', 'not-returned')),
    back_serial  BIGINT NOT NULL DEFAULT 0,
    back_error   TEXT NOT NULL DEFAULT '',
    detail       TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (module, node)
);
