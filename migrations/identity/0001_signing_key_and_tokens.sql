-- The controller's ed25519 signing key: made by the first migrate, never
-- printed in private form.
CREATE TABLE signing_keys (
    id          INTEGER PRIMARY KEY,
    public_key  BLOB NOT NULL CHECK (length(public_key) = 32),
    private_key BLOB NOT NULL CHECK (length(private_key) = 64),
    created_at  TEXT NOT NULL
) STRICT;

-- One-time rights to join, kept only as the SHA-256 of the token.
CREATE TABLE join_tokens (
    hash       TEXT PRIMARY KEY,
    node       TEXT NOT NULL,
    issued_at  TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    used_at    TEXT,
    revoked_at TEXT
) STRICT;

CREATE INDEX join_tokens_node ON join_tokens (node, issued_at);
