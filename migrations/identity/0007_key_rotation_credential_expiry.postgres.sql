-- PostgreSQL twin of 0007_key_rotation_credential_expiry.sql: the same schema in PostgreSQL's words
-- (BIGINT for INTEGER, DOUBLE PRECISION for REAL, BYTEA for BLOB, identity
-- for a rowid key, patterns for GLOB; no STRICT).
-- Each rotation of the controller's signing key (identity rotate): a link
-- of the chain hosts follow from the key they know. announcement is the
-- canonical announcement {sequence, old key, new key, at, overlap until},
-- signed by the old key and by the new one. Hosts accept both keys until
-- overlap_until; retired_at is when the controller let the old key go
-- (its private half deleted from signing_keys; its public half stays here).
CREATE TABLE key_links (
    sequence      BIGINT PRIMARY KEY CHECK (sequence > 0),
    old_key       BYTEA NOT NULL CHECK (length(old_key) = 32),
    new_key       BYTEA NOT NULL CHECK (length(new_key) = 32),
    made_at       TEXT NOT NULL,
    overlap_until TEXT NOT NULL,
    announcement  TEXT NOT NULL,
    old_signature TEXT NOT NULL,
    new_signature TEXT NOT NULL,
    why           TEXT NOT NULL,
    retired_at    TEXT
);

-- The controller key each host says it verifies with (its heartbeats),
-- one row a node written when it changes, and the last chain it refused.
CREATE TABLE key_acks (
    node       TEXT PRIMARY KEY,
    key        TEXT NOT NULL,
    acked_at   TEXT NOT NULL,
    refused    TEXT NOT NULL DEFAULT '',
    refused_at TEXT
);

-- A host's broker user expires (serve --host-credentials-ttl) and is
-- renewed by its host: when it stops admitting its holder. NULL for users
-- issued before, and for those that never expire.
ALTER TABLE issued_users ADD COLUMN expires_at TEXT;
