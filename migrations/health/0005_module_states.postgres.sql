-- PostgreSQL twin of 0005_module_states.sql: the same schema in PostgreSQL's words
-- (BIGINT for INTEGER, DOUBLE PRECISION for REAL, BYTEA for BLOB, identity
-- for a rowid key, patterns for GLOB; no STRICT).
-- Each supervised module as its host last reported it (heartbeats and
-- apply reports): one row per node and module, replaced when it changes,
-- removed when its host no longer reports it. log_tail is a JSON array.
CREATE TABLE module_states (
    node        TEXT NOT NULL,
    module      TEXT NOT NULL,
    version     TEXT NOT NULL,
    state       TEXT NOT NULL,
    serial      BIGINT NOT NULL DEFAULT 0,
    pid         BIGINT NOT NULL DEFAULT 0,
    since       TEXT NOT NULL,
    restarts_1h BIGINT NOT NULL DEFAULT 0,
    last_exit   TEXT NOT NULL DEFAULT '',
    detail      TEXT NOT NULL DEFAULT '',
    log_tail    TEXT NOT NULL DEFAULT '[]',
    heard_at    TEXT NOT NULL,
    -- changed_at is when the controller heard this state begin: a bound
    -- (module.not-ready) is timed on the controller's clock.
    changed_at  TEXT NOT NULL,
    PRIMARY KEY (node, module)
);
