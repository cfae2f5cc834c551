CREATE TABLE declarations (
    node      TEXT PRIMARY KEY REFERENCES nodes (name) ON DELETE CASCADE,
    serial    INTEGER NOT NULL CHECK (serial > 0),
    issued_at TEXT NOT NULL,
    body      TEXT NOT NULL,
    signature TEXT NOT NULL,
    key       TEXT NOT NULL
) STRICT;
CREATE TABLE node_data_sets (
    node        TEXT NOT NULL REFERENCES nodes (name) ON DELETE CASCADE,
    module      TEXT NOT NULL,
    name        TEXT NOT NULL,
    path        TEXT NOT NULL,
    bytes       INTEGER NOT NULL,
    precious    TEXT NOT NULL,
    last_backup TEXT,
    reported_at TEXT NOT NULL,
    PRIMARY KEY (node, module, name)
) STRICT;
CREATE TABLE node_facts (
    node  TEXT NOT NULL REFERENCES nodes (name) ON DELETE CASCADE,
    name  TEXT NOT NULL,
    value TEXT NOT NULL,
    why   TEXT NOT NULL,
    PRIMARY KEY (node, name)
) STRICT;
CREATE TABLE node_found (
    node   TEXT NOT NULL REFERENCES nodes (name) ON DELETE CASCADE,
    kind   TEXT NOT NULL,
    name   TEXT NOT NULL,
    detail TEXT NOT NULL,
    PRIMARY KEY (node, kind, name)
) STRICT;
CREATE TABLE nodes (
    name       TEXT PRIMARY KEY
               CHECK (length(name) BETWEEN 1 AND 63
                      AND name GLOB '[a-z]*'
                      AND name NOT GLOB '*[^a-z0-9-]*'),
    mode       TEXT NOT NULL CHECK (mode IN ('adopted', 'converged')),
    created_at TEXT NOT NULL,
    joined_at  TEXT,
    last_heard TEXT
, serial_applied INTEGER NOT NULL DEFAULT 0, heartbeat_interval_s REAL, uptime_s INTEGER, facts_at TEXT, applied_serial INTEGER, applied_ok INTEGER, applied_error TEXT, applied_ms REAL, applied_at TEXT) STRICT;
CREATE TABLE schema_migrations (
	version    INTEGER PRIMARY KEY,
	name       TEXT NOT NULL,
	checksum   TEXT NOT NULL,
	applied_at TEXT NOT NULL
);
