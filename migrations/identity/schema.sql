CREATE TRIGGER fence_raised_by_an_older_controller BEFORE UPDATE OF generation ON fence
WHEN NEW.generation <> OLD.generation AND NEW.raised_to IS NOT NEW.generation
BEGIN
    SELECT RAISE(ABORT, 'these stores were migrated by a newer mesh-controller, which this older one cannot serve: upgrade this mesh-controller');
END;
CREATE TRIGGER standbys_of_an_older_controller BEFORE INSERT ON standbys
WHEN NEW.version IS NULL
BEGIN
    SELECT RAISE(ABORT, 'these stores were migrated by a newer mesh-controller, which this older one cannot serve: upgrade this mesh-controller');
END;
CREATE TABLE broker_keys (
    role       TEXT PRIMARY KEY CHECK (role IN ('operator', 'account', 'system')),
    seed       BLOB NOT NULL,
    created_at TEXT NOT NULL
) STRICT;
CREATE TABLE fence (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    generation INTEGER NOT NULL
, controller TEXT NOT NULL DEFAULT '', raised_to INTEGER NOT NULL DEFAULT 0) STRICT;
CREATE TABLE hosts (
    node          TEXT PRIMARY KEY,
    host_key      BLOB NOT NULL CHECK (length(host_key) = 32),
    age_recipient TEXT NOT NULL,
    nkey          TEXT NOT NULL,
    host_version  TEXT NOT NULL,
    joined_at     TEXT NOT NULL
, protocol TEXT NOT NULL DEFAULT '') STRICT;
CREATE TABLE issued_users (
    pub        TEXT PRIMARY KEY,
    kind       TEXT NOT NULL CHECK (kind IN ('module', 'builder', 'host')),
    node       TEXT NOT NULL DEFAULT '',
    module     TEXT NOT NULL DEFAULT '',
    issued_at  TEXT NOT NULL,
    revoked_at TEXT
, sealed TEXT NOT NULL DEFAULT '', version TEXT NOT NULL DEFAULT '', expires_at TEXT) STRICT;
CREATE TABLE join_tokens (
    hash       TEXT PRIMARY KEY,
    node       TEXT NOT NULL,
    issued_at  TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    used_at    TEXT,
    revoked_at TEXT
, reused_count INTEGER NOT NULL DEFAULT 0, last_reused_at TEXT) STRICT;
CREATE TABLE key_acks (
    node       TEXT PRIMARY KEY,
    key        TEXT NOT NULL,
    acked_at   TEXT NOT NULL,
    refused    TEXT NOT NULL DEFAULT '',
    refused_at TEXT
) STRICT;
CREATE TABLE key_links (
    sequence      INTEGER PRIMARY KEY CHECK (sequence > 0),
    old_key       BLOB NOT NULL CHECK (length(old_key) = 32),
    new_key       BLOB NOT NULL CHECK (length(new_key) = 32),
    made_at       TEXT NOT NULL,
    overlap_until TEXT NOT NULL,
    announcement  TEXT NOT NULL,
    old_signature TEXT NOT NULL,
    new_signature TEXT NOT NULL,
    why           TEXT NOT NULL,
    retired_at    TEXT
) STRICT;
CREATE TABLE lease (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    holder     TEXT NOT NULL,
    pid        INTEGER NOT NULL,
    host       TEXT NOT NULL,
    taken_at   TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    broker_url TEXT NOT NULL DEFAULT ''
, generation INTEGER NOT NULL DEFAULT 0, version TEXT NOT NULL DEFAULT '') STRICT;
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
CREATE TABLE standbys (
    holder     TEXT PRIMARY KEY,
    pid        INTEGER NOT NULL,
    host       TEXT NOT NULL,
    since      TEXT NOT NULL,
    expires_at TEXT NOT NULL
, version TEXT, aside TEXT NOT NULL DEFAULT '') STRICT;
CREATE INDEX issued_users_module ON issued_users (module);
CREATE INDEX issued_users_node ON issued_users (node, kind);
CREATE INDEX join_tokens_node ON join_tokens (node, issued_at);
