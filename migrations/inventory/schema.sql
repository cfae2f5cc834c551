CREATE TABLE act_revision (
    id  INTEGER PRIMARY KEY CHECK (id = 1),
    rev INTEGER NOT NULL
) STRICT;
CREATE TABLE acts_under_way (
    id    TEXT PRIMARY KEY,
    what  TEXT NOT NULL,
    pid   INTEGER NOT NULL,
    host  TEXT NOT NULL,
    until TEXT NOT NULL
) STRICT;
CREATE TABLE assignments (
    node        TEXT NOT NULL REFERENCES nodes (name) ON DELETE CASCADE,
    module      TEXT NOT NULL,
    version     TEXT NOT NULL,
    assigned_at TEXT NOT NULL,
    unverified  TEXT NOT NULL DEFAULT '[]', pending_version TEXT, taken TEXT,
    PRIMARY KEY (node, module),
    FOREIGN KEY (module, version) REFERENCES module_versions (module, version)
) STRICT;
CREATE TABLE backup_access (
    node      TEXT PRIMARY KEY,
    holder    TEXT NOT NULL,
    sealed    TEXT NOT NULL CHECK (sealed GLOB '-----BEGIN AGE ENCRYPTED FILE-----*'),
    issued_at TEXT NOT NULL
) STRICT;
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
CREATE TABLE backups (
    node        TEXT NOT NULL,
    module      TEXT NOT NULL,
    name        TEXT NOT NULL,
    last_backup TEXT NOT NULL,
    PRIMARY KEY (node, module, name)
) STRICT;
CREATE TABLE bindings (
    node            TEXT NOT NULL,
    module          TEXT NOT NULL,
    provision       TEXT NOT NULL,
    provider_node   TEXT NOT NULL,
    provider_module TEXT NOT NULL,
    since           TEXT NOT NULL,
    PRIMARY KEY (node, module, provision),
    FOREIGN KEY (node, module) REFERENCES assignments (node, module) ON DELETE CASCADE
) STRICT;
CREATE TABLE consumers (
    provider_node   TEXT NOT NULL,
    provider_module TEXT NOT NULL,
    consumer        TEXT NOT NULL,
    provision       TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('active', 'waiting', 'retired', 'rejected', 'deleted')),
    since           TEXT NOT NULL,
    why             TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (provider_node, provider_module, consumer, provision)
) STRICT;
CREATE TABLE declarations (
    node      TEXT PRIMARY KEY REFERENCES nodes (name) ON DELETE CASCADE,
    serial    INTEGER NOT NULL CHECK (serial > 0),
    issued_at TEXT NOT NULL,
    body      TEXT NOT NULL,
    signature TEXT NOT NULL,
    key       TEXT NOT NULL
, plan_version INTEGER NOT NULL DEFAULT 0) STRICT;
CREATE TABLE deletions (
    id        INTEGER PRIMARY KEY,
    node      TEXT NOT NULL,
    module    TEXT NOT NULL,
    target    TEXT NOT NULL,
    kind      TEXT NOT NULL CHECK (kind IN ('data', 'consumer')),
    path      TEXT NOT NULL DEFAULT '',
    asked_at  TEXT NOT NULL,
    why       TEXT NOT NULL,
    done_at   TEXT
) STRICT;
CREATE TABLE fence (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    generation INTEGER NOT NULL
) STRICT;
CREATE TABLE host_releases (
    version        TEXT PRIMARY KEY CHECK (length(version) BETWEEN 1 AND 128),
    digest         TEXT NOT NULL,
    bytes          INTEGER NOT NULL,
    unpacked_bytes INTEGER NOT NULL,
    os             TEXT NOT NULL DEFAULT '',
    arch           TEXT NOT NULL DEFAULT '',
    added_at       TEXT NOT NULL,
    who            TEXT NOT NULL DEFAULT ''
) STRICT;
CREATE TABLE module_versions (
    module    TEXT NOT NULL REFERENCES modules (name) ON DELETE CASCADE,
    version   TEXT NOT NULL,
    manifest  TEXT NOT NULL,
    source    TEXT NOT NULL DEFAULT '',
    commit_id TEXT NOT NULL DEFAULT '',
    added_at  TEXT NOT NULL, archive_digest TEXT NOT NULL DEFAULT '', archive_bytes INTEGER NOT NULL DEFAULT 0, build_id TEXT NOT NULL DEFAULT '', archive_unpacked_bytes INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (module, version)
) STRICT;
CREATE TABLE modules (
    name            TEXT PRIMARY KEY
                    CHECK (length(name) BETWEEN 1 AND 63 AND name GLOB '[a-z]*' AND name NOT GLOB '*[^a-z0-9-]*'),
    current_version TEXT NOT NULL,
    source          TEXT NOT NULL DEFAULT '',
    moved_commit    TEXT NOT NULL DEFAULT '',
    added_at        TEXT NOT NULL
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
CREATE TABLE node_filters (
    node      TEXT PRIMARY KEY REFERENCES nodes (name) ON DELETE CASCADE,
    kind      TEXT NOT NULL CHECK (kind IN ('nftables')),
    close_ssh INTEGER NOT NULL DEFAULT 0 CHECK (close_ssh IN (0, 1)),
    since     TEXT NOT NULL
) STRICT;
CREATE TABLE node_found (
    node   TEXT NOT NULL REFERENCES nodes (name) ON DELETE CASCADE,
    kind   TEXT NOT NULL,
    name   TEXT NOT NULL,
    detail TEXT NOT NULL, addresses TEXT NOT NULL DEFAULT '', commands TEXT NOT NULL DEFAULT '',
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
, serial_applied INTEGER NOT NULL DEFAULT 0, heartbeat_interval_s REAL, uptime_s INTEGER, facts_at TEXT, applied_serial INTEGER, applied_ok INTEGER, applied_error TEXT, applied_ms REAL, applied_at TEXT, plan_version INTEGER NOT NULL DEFAULT 0, public_domain TEXT, networks TEXT, overlay_index INTEGER, overlay_endpoint TEXT, overlay_site TEXT, overlay_reach TEXT CHECK (overlay_reach IN ('public', 'behind-nat')), applying_serial INTEGER, applying_since TEXT, applying_phase TEXT, host_version TEXT, host_release TEXT) STRICT;
CREATE TABLE overlay_key_refusals (
    node   TEXT PRIMARY KEY REFERENCES nodes (name) ON DELETE CASCADE,
    holder TEXT NOT NULL,
    key    TEXT NOT NULL,
    since  TEXT NOT NULL
) STRICT;
CREATE TABLE overlay_mesh (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    prefix     TEXT,
    next_index INTEGER NOT NULL CHECK (next_index >= 1)
) STRICT;
CREATE TABLE overlay_silent_peers (
    node           TEXT NOT NULL REFERENCES nodes (name) ON DELETE CASCADE,
    peer           TEXT NOT NULL,
    since          TEXT NOT NULL,
    last_handshake TEXT,
    PRIMARY KEY (node, peer)
) STRICT;
CREATE TABLE pins (
    node            TEXT NOT NULL REFERENCES nodes (name) ON DELETE CASCADE,
    provision       TEXT NOT NULL,
    provider_node   TEXT NOT NULL,
    provider_module TEXT NOT NULL,
    since           TEXT NOT NULL,
    PRIMARY KEY (node, provision)
) STRICT;
CREATE TABLE replacements (
    id          INTEGER PRIMARY KEY,
    what        TEXT NOT NULL,
    new_holder  TEXT NOT NULL,
    old_holder  TEXT NOT NULL,
    data        TEXT NOT NULL,
    at          TEXT NOT NULL,
    resolved_at TEXT
) STRICT;
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
, node_removed_at TEXT, last_backup TEXT) STRICT;
CREATE TABLE rollout_nodes (
    module       TEXT NOT NULL,
    node         TEXT NOT NULL,
    from_version TEXT NOT NULL,
    batch        INTEGER NOT NULL,
    moved        INTEGER NOT NULL DEFAULT 0,
    serial       INTEGER NOT NULL DEFAULT 0,
    applied      INTEGER NOT NULL DEFAULT 0,
    result       TEXT NOT NULL DEFAULT 'waiting' CHECK (result IN ('waiting', 'moved', 'ready', 'failed')),
    error        TEXT NOT NULL DEFAULT '',
    back         TEXT NOT NULL DEFAULT '' CHECK (back IN ('', 'returning', 'returned', 'not-returned')),
    back_serial  INTEGER NOT NULL DEFAULT 0,
    back_error   TEXT NOT NULL DEFAULT '',
    detail       TEXT NOT NULL DEFAULT '', prepared TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (module, node)
) STRICT;
CREATE TABLE rollouts (
    module       TEXT PRIMARY KEY,
    id           TEXT NOT NULL,
    to_version   TEXT NOT NULL,
    canary       INTEGER NOT NULL,
    batch        TEXT NOT NULL,
    wait_ms      INTEGER NOT NULL,
    soak_ms      INTEGER NOT NULL,
    max_failures INTEGER NOT NULL,
    phase        TEXT NOT NULL CHECK (phase IN ('running', 'soaking', 'rolling-back', 'done', 'stopped', 'rolled-back')),
    why          TEXT NOT NULL DEFAULT '',
    who          TEXT NOT NULL DEFAULT '',
    started_at   TEXT NOT NULL,
    updated_at   TEXT NOT NULL
, kind TEXT NOT NULL DEFAULT 'module' CHECK (kind IN ('module', 'host')), without_snapshot INTEGER NOT NULL DEFAULT 0) STRICT;
CREATE TABLE schema_migrations (
	version    INTEGER PRIMARY KEY,
	name       TEXT NOT NULL,
	checksum   TEXT NOT NULL,
	applied_at TEXT NOT NULL
);
CREATE TABLE seat_aliases (
    alias TEXT PRIMARY KEY,
    seat  TEXT NOT NULL
) STRICT;
CREATE TABLE seat_holders (
    seat   TEXT NOT NULL,
    node   TEXT NOT NULL,
    module TEXT NOT NULL,
    since  TEXT NOT NULL,
    PRIMARY KEY (seat, node, module),
    FOREIGN KEY (node, module) REFERENCES assignments (node, module) ON DELETE CASCADE
) STRICT;
CREATE TABLE settings_layers (
    module TEXT NOT NULL REFERENCES modules (name) ON DELETE CASCADE,
    node   TEXT NOT NULL DEFAULT '',
    body   TEXT NOT NULL,
    set_at TEXT NOT NULL,
    PRIMARY KEY (module, node)
) STRICT;
CREATE TABLE take_previews (
    digest   TEXT PRIMARY KEY,
    node     TEXT NOT NULL,
    module   TEXT NOT NULL,
    preview  TEXT NOT NULL,
    shown_at TEXT NOT NULL
) STRICT;
CREATE INDEX assignments_module ON assignments (module);
CREATE INDEX backup_runs_ask ON backup_runs (ask);
CREATE INDEX backup_runs_set ON backup_runs (node, module, name, id);
CREATE INDEX declarations_versions ON declarations (node, serial, plan_version);
CREATE UNIQUE INDEX nodes_overlay_index ON nodes (overlay_index);
CREATE INDEX retirements_node ON retirements (node, module);
CREATE INDEX take_previews_shown ON take_previews (shown_at);
