-- PostgreSQL twin of 0002_reports_and_declarations.sql: the same schema in PostgreSQL's words
-- (BIGINT for INTEGER, DOUBLE PRECISION for REAL, BYTEA for BLOB, identity
-- for a rowid key, patterns for GLOB; no STRICT).
-- What hosts report: the latest heartbeat and apply outcome per node, kept
-- in place (one row per node, written in batches), its facts and what it
-- found beside the mesh, and its data sets as last reported.
ALTER TABLE nodes ADD COLUMN serial_applied BIGINT NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN heartbeat_interval_s DOUBLE PRECISION;
ALTER TABLE nodes ADD COLUMN uptime_s BIGINT;
ALTER TABLE nodes ADD COLUMN facts_at TEXT;
ALTER TABLE nodes ADD COLUMN applied_serial BIGINT;
ALTER TABLE nodes ADD COLUMN applied_ok BIGINT;
ALTER TABLE nodes ADD COLUMN applied_error TEXT;
ALTER TABLE nodes ADD COLUMN applied_ms DOUBLE PRECISION;
ALTER TABLE nodes ADD COLUMN applied_at TEXT;

CREATE TABLE node_facts (
    node  TEXT NOT NULL REFERENCES nodes (name) ON DELETE CASCADE,
    name  TEXT NOT NULL,
    value TEXT NOT NULL,
    why   TEXT NOT NULL,
    PRIMARY KEY (node, name)
);

CREATE TABLE node_found (
    node   TEXT NOT NULL REFERENCES nodes (name) ON DELETE CASCADE,
    kind   TEXT NOT NULL,
    name   TEXT NOT NULL,
    detail TEXT NOT NULL,
    PRIMARY KEY (node, kind, name)
);

CREATE TABLE node_data_sets (
    node        TEXT NOT NULL REFERENCES nodes (name) ON DELETE CASCADE,
    module      TEXT NOT NULL,
    name        TEXT NOT NULL,
    path        TEXT NOT NULL,
    bytes       BIGINT NOT NULL,
    precious    TEXT NOT NULL,
    last_backup TEXT,
    reported_at TEXT NOT NULL,
    PRIMARY KEY (node, module, name)
);

-- Each node's latest signed declaration: the truth of what it should run.
-- The serial only ever grows.
CREATE TABLE declarations (
    node      TEXT PRIMARY KEY REFERENCES nodes (name) ON DELETE CASCADE,
    serial    BIGINT NOT NULL CHECK (serial > 0),
    issued_at TEXT NOT NULL,
    body      TEXT NOT NULL,
    signature TEXT NOT NULL,
    key       TEXT NOT NULL
);
