CREATE TABLE fence (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    generation INTEGER NOT NULL
) STRICT;
CREATE TABLE operator_keys (
    id          INTEGER PRIMARY KEY,
    recipient   TEXT NOT NULL UNIQUE CHECK (recipient GLOB 'age1*'),
    set_at      TEXT NOT NULL,
    replaced_at TEXT
) STRICT;
CREATE TABLE schema_migrations (
	version    INTEGER PRIMARY KEY,
	name       TEXT NOT NULL,
	checksum   TEXT NOT NULL,
	applied_at TEXT NOT NULL
);
CREATE TABLE sealed (
    node           TEXT NOT NULL,
    module         TEXT NOT NULL,
    name           TEXT NOT NULL,
    version        INTEGER NOT NULL CHECK (version > 0),
    made_by        TEXT NOT NULL CHECK (made_by IN ('mesh', 'person')),
    node_recipient TEXT NOT NULL CHECK (node_recipient GLOB 'age1*'),
    operator_key   INTEGER NOT NULL REFERENCES operator_keys (id),
    sealed         TEXT NOT NULL CHECK (sealed GLOB '-----BEGIN AGE ENCRYPTED FILE-----*'),
    sealed_at      TEXT NOT NULL,
    PRIMARY KEY (node, module, name)
) STRICT;
CREATE TABLE secret_history (
    id      INTEGER PRIMARY KEY,
    node    TEXT NOT NULL,
    module  TEXT NOT NULL,
    name    TEXT NOT NULL,
    version INTEGER NOT NULL,
    event   TEXT NOT NULL CHECK (event IN ('made', 'accepted', 'forgotten')),
    at      TEXT NOT NULL
) STRICT;
