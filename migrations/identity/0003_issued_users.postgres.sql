-- PostgreSQL twin of 0003_issued_users.sql: the same schema in PostgreSQL's words
-- (BIGINT for INTEGER, DOUBLE PRECISION for REAL, BYTEA for BLOB, identity
-- for a rowid key, patterns for GLOB; no STRICT).
-- Broker users issued for modules (and, later, builders): kept by public
-- nkey so they can be revoked when what they belong to is forgotten.
CREATE TABLE issued_users (
    pub        TEXT PRIMARY KEY,
    kind       TEXT NOT NULL CHECK (kind IN ('module', 'builder', 'host')),
    node       TEXT NOT NULL DEFAULT '',
    module     TEXT NOT NULL DEFAULT '',
    issued_at  TEXT NOT NULL,
    revoked_at TEXT
);

CREATE INDEX issued_users_module ON issued_users (module);
