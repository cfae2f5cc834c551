-- What became of each data set's backups (issue 29): the last attempt
-- (a host's outcome, failed or not, with its snapshot and what it did) and
-- the last restore drill of the backup seat's holder, with when one last
-- passed, and when its first backup was made (a drill is due within seven
-- cadences of it). backups keeps the last backup heard, as before.
CREATE TABLE backup_states (
    node           TEXT NOT NULL,
    module         TEXT NOT NULL,
    name           TEXT NOT NULL,
    attempt_at     TEXT,
    attempt_ok     INTEGER NOT NULL DEFAULT 0,
    attempt_why    TEXT NOT NULL DEFAULT '',
    snapshot       TEXT NOT NULL DEFAULT '',
    files          INTEGER NOT NULL DEFAULT 0,
    bytes          INTEGER NOT NULL DEFAULT 0,
    bytes_added    INTEGER NOT NULL DEFAULT 0,
    duration_ms    REAL NOT NULL DEFAULT 0,
    drill_at       TEXT,
    drill_ok       INTEGER NOT NULL DEFAULT 0,
    drill_why      TEXT NOT NULL DEFAULT '',
    drill_snapshot TEXT NOT NULL DEFAULT '',
    verified_at    TEXT,
    first_backup   TEXT,
    PRIMARY KEY (node, module, name)
) STRICT;
-- Every backup, restore and drill, newest last, a bounded number a data
-- set (the writer drops the oldest): what data backup waits for by its
-- ask's id, and what data snapshots and the board show of lately.
CREATE TABLE backup_runs (
    id          INTEGER PRIMARY KEY,
    ask         TEXT NOT NULL,
    node        TEXT NOT NULL,
    module      TEXT NOT NULL,
    name        TEXT NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN ('backup', 'restore', 'drill')),
    at          TEXT NOT NULL,
    ok          INTEGER NOT NULL,
    why         TEXT NOT NULL DEFAULT '',
    snapshot    TEXT NOT NULL DEFAULT '',
    files       INTEGER NOT NULL DEFAULT 0,
    bytes       INTEGER NOT NULL DEFAULT 0,
    bytes_added INTEGER NOT NULL DEFAULT 0,
    duration_ms REAL NOT NULL DEFAULT 0,
    aside       TEXT NOT NULL DEFAULT ''
) STRICT;
CREATE INDEX backup_runs_set ON backup_runs (node, module, name, id);
CREATE INDEX backup_runs_ask ON backup_runs (ask);
-- Each node's access to its repository on the backup seat's holder, as
-- the holder sealed it to the node (ciphertext only): declared to the node.
CREATE TABLE backup_access (
    node      TEXT PRIMARY KEY,
    holder    TEXT NOT NULL,
    sealed    TEXT NOT NULL CHECK (sealed GLOB '-----BEGIN AGE ENCRYPTED FILE-----*'),
    issued_at TEXT NOT NULL
) STRICT;
