-- Modules: every registered version is kept (its manifest as canonical JSON);
-- the newest is current. moved_commit is a source commit newer than the mesh
-- built, recorded by module moved.
CREATE TABLE modules (
    name            TEXT PRIMARY KEY
                    CHECK (length(name) BETWEEN 1 AND 63 AND name GLOB '[a-z]*' AND name NOT GLOB '*[^a-z0-9-]*'),
    current_version TEXT NOT NULL,
    source          TEXT NOT NULL DEFAULT '',
    moved_commit    TEXT NOT NULL DEFAULT '',
    added_at        TEXT NOT NULL
) STRICT;

CREATE TABLE module_versions (
    module    TEXT NOT NULL REFERENCES modules (name) ON DELETE CASCADE,
    version   TEXT NOT NULL,
    manifest  TEXT NOT NULL,
    source    TEXT NOT NULL DEFAULT '',
    commit_id TEXT NOT NULL DEFAULT '',
    added_at  TEXT NOT NULL,
    PRIMARY KEY (module, version)
) STRICT;

-- A module put on a node, at the version its plan declares there.
-- unverified lists requirements judged before the node reported the facts
-- to judge them by, for the self-check to judge again.
CREATE TABLE assignments (
    node        TEXT NOT NULL REFERENCES nodes (name) ON DELETE CASCADE,
    module      TEXT NOT NULL,
    version     TEXT NOT NULL,
    assigned_at TEXT NOT NULL,
    unverified  TEXT NOT NULL DEFAULT '[]',
    PRIMARY KEY (node, module),
    FOREIGN KEY (module, version) REFERENCES module_versions (module, version)
) STRICT;

CREATE INDEX assignments_module ON assignments (module);

-- Settings layers: node '' is the mesh layer, else that node's layer.
CREATE TABLE settings_layers (
    module TEXT NOT NULL REFERENCES modules (name) ON DELETE CASCADE,
    node   TEXT NOT NULL DEFAULT '',
    body   TEXT NOT NULL,
    set_at TEXT NOT NULL,
    PRIMARY KEY (module, node)
) STRICT;

-- What happened to data when its module was unassigned: precious data is
-- retired and remembered (kept on the node, deleted only by a person);
-- rebuildable data is dropped, and that is said. Not tied to the node or
-- module rows: the memory outlives them.
CREATE TABLE retirements (
    id         INTEGER PRIMARY KEY,
    node       TEXT NOT NULL,
    module     TEXT NOT NULL,
    data_set   TEXT NOT NULL,
    path       TEXT NOT NULL,
    precious   TEXT NOT NULL,
    consumer   TEXT NOT NULL DEFAULT '',
    state      TEXT NOT NULL CHECK (state IN ('retired', 'dropped', 'deleted', 'reactivated')),
    bytes      INTEGER,
    retired_at TEXT NOT NULL,
    why        TEXT NOT NULL
) STRICT;

CREATE INDEX retirements_node ON retirements (node, module);

-- A node's plan moves each time something it depends on changes; a
-- declaration remembers which plan it was made from, so a node whose
-- declaration is older than its plan is behind.
ALTER TABLE nodes ADD COLUMN plan_version INTEGER NOT NULL DEFAULT 0;
ALTER TABLE declarations ADD COLUMN plan_version INTEGER NOT NULL DEFAULT 0;
