-- Broker users issued for modules (and, later, builders): kept by public
-- nkey so they can be revoked when what they belong to is forgotten.
CREATE TABLE issued_users (
    pub        TEXT PRIMARY KEY,
    kind       TEXT NOT NULL CHECK (kind IN ('module', 'builder', 'host')),
    node       TEXT NOT NULL DEFAULT '',
    module     TEXT NOT NULL DEFAULT '',
    issued_at  TEXT NOT NULL,
    revoked_at TEXT
) STRICT;

CREATE INDEX issued_users_module ON issued_users (module);
