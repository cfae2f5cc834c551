CREATE TABLE join_tokens (
    hash       TEXT PRIMARY KEY,
    node       TEXT NOT NULL,
    issued_at  TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    used_at    TEXT,
    revoked_at TEXT
) STRICT;
CREATE TABLE schema_migrations (
	version    INTEGER PRIMARY KEY,
	name       TEXT NOT NULL,
	checksum   TEXT NOT NULL,
	applied_at TEXT NOT NULL
);
CREATE TABLE signing_keys (
    id          INTEGER PRIMARY KEY,
    public_key  BLOB NOT NULL CHECK (length(public_key) = 32),
    private_key BLOB NOT NULL CHECK (length(private_key) = 64),
    created_at  TEXT NOT NULL
) STRICT;
CREATE INDEX join_tokens_node ON join_tokens (node, issued_at);
