-- PostgreSQL twin of 0002_broker_lease_hosts.sql: the same schema in PostgreSQL's words
-- (BIGINT for INTEGER, DOUBLE PRECISION for REAL, BYTEA for BLOB, identity
-- for a rowid key, patterns for GLOB; no STRICT).
-- The broker's signing keys (nkey seeds): the operator, the mesh account, the
-- system account. Made by migrate beside the signing key.
CREATE TABLE broker_keys (
    role       TEXT PRIMARY KEY CHECK (role IN ('operator', 'account', 'system')),
    seed       BYTEA NOT NULL,
    created_at TEXT NOT NULL
);

-- The right to be the serving controller: one holder at a time, renewed
-- well before it expires, given back on exit. broker_url tells a person's
-- commands where the serving controller's broker is.
CREATE TABLE lease (
    id         BIGINT PRIMARY KEY CHECK (id = 1),
    holder     TEXT NOT NULL,
    pid        BIGINT NOT NULL,
    host       TEXT NOT NULL,
    taken_at   TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    broker_url TEXT NOT NULL DEFAULT ''
);

-- The keys a host presented when it joined: its signature on reports, the
-- age recipient its secrets are sealed to, and its broker user's nkey.
CREATE TABLE hosts (
    node          TEXT PRIMARY KEY,
    host_key      BYTEA NOT NULL CHECK (length(host_key) = 32),
    age_recipient TEXT NOT NULL,
    nkey          TEXT NOT NULL,
    host_version  TEXT NOT NULL,
    joined_at     TEXT NOT NULL
);

-- A token presented again after its use is refused and remembered.
ALTER TABLE join_tokens ADD COLUMN reused_count BIGINT NOT NULL DEFAULT 0;
ALTER TABLE join_tokens ADD COLUMN last_reused_at TEXT;
