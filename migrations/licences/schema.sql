CREATE TABLE fence (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    generation INTEGER NOT NULL
) STRICT;
CREATE TABLE licence_copies (
    licence        TEXT NOT NULL,
    version        INTEGER NOT NULL,
    kind           TEXT NOT NULL CHECK (kind IN ('operator', 'holder', 'refresh')),
    node           TEXT NOT NULL,
    module         TEXT NOT NULL,
    node_recipient TEXT CHECK (node_recipient GLOB 'age1*'),
    operator_key   TEXT NOT NULL CHECK (operator_key GLOB 'age1*'),
    sealed         TEXT NOT NULL CHECK (sealed GLOB '-----BEGIN AGE ENCRYPTED FILE-----*'),
    sealed_at      TEXT NOT NULL,
    PRIMARY KEY (licence, version, kind, node, module),
    FOREIGN KEY (licence, version) REFERENCES licence_versions (licence, version),
    CHECK (kind <> 'holder' OR (node <> '' AND module <> '' AND node_recipient IS NOT NULL)),
    CHECK (kind <> 'operator' OR (node = '' AND module = '' AND node_recipient IS NULL))
) STRICT;
CREATE TABLE licence_history (
    id      INTEGER PRIMARY KEY,
    licence TEXT NOT NULL,
    version INTEGER NOT NULL,
    event   TEXT NOT NULL CHECK (event IN ('added', 'used', 'stopped', 'manager', 'refreshed', 'refresh-failed', 'discarded')),
    node    TEXT NOT NULL,
    module  TEXT NOT NULL,
    at      TEXT NOT NULL
) STRICT;
CREATE TABLE licence_holders (
    licence TEXT NOT NULL REFERENCES licences (name),
    node    TEXT NOT NULL,
    module  TEXT NOT NULL,
    since   TEXT NOT NULL,
    PRIMARY KEY (licence, node, module)
) STRICT;
CREATE TABLE licence_versions (
    licence       TEXT NOT NULL REFERENCES licences (name),
    version       INTEGER NOT NULL CHECK (version > 0),
    made_by       TEXT NOT NULL CHECK (made_by IN ('person', 'refresh')),
    made          TEXT NOT NULL,
    expires       TEXT,
    discard_after TEXT,
    PRIMARY KEY (licence, version)
) STRICT;
CREATE TABLE licences (
    name           TEXT PRIMARY KEY,
    provider       TEXT NOT NULL CHECK (provider <> ''),
    refreshable    INTEGER NOT NULL CHECK (refreshable IN (0, 1)),
    version        INTEGER NOT NULL CHECK (version > 0),
    expires        TEXT,
    made           TEXT NOT NULL,
    manager_node   TEXT,
    manager_module TEXT,
    CHECK ((manager_node IS NULL) = (manager_module IS NULL))
) STRICT;
CREATE TABLE schema_migrations (
	version    INTEGER PRIMARY KEY,
	name       TEXT NOT NULL,
	checksum   TEXT NOT NULL,
	applied_at TEXT NOT NULL
);
