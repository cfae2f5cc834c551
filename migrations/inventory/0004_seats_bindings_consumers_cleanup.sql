-- Seats: who holds each seat (a replicated seat has several holders), and
-- former names that still resolve after a rename.
CREATE TABLE seat_holders (
    seat   TEXT NOT NULL,
    node   TEXT NOT NULL,
    module TEXT NOT NULL,
    since  TEXT NOT NULL,
    PRIMARY KEY (seat, node, module),
    FOREIGN KEY (node, module) REFERENCES assignments (node, module) ON DELETE CASCADE
) STRICT;

CREATE TABLE seat_aliases (
    alias TEXT PRIMARY KEY,
    seat  TEXT NOT NULL
) STRICT;

-- Bindings: which provider each consumer's need is bound to. Sticky once
-- made; pins are a person's choice.
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

CREATE TABLE pins (
    node            TEXT NOT NULL REFERENCES nodes (name) ON DELETE CASCADE,
    provision       TEXT NOT NULL,
    provider_node   TEXT NOT NULL,
    provider_module TEXT NOT NULL,
    since           TEXT NOT NULL,
    PRIMARY KEY (node, provision)
) STRICT;

-- Each provider's consumers, and where each stands: active while bound;
-- waiting for a person once no longer asked for; retired (access off, data
-- kept); rejected (kept active by a person); deleted by cleanup.
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

-- Deletions a person asked for with cleanup delete, carried in the node's
-- declaration until its host reports them done.
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

-- Backups the backup seat's holder reported done, per data set.
CREATE TABLE backups (
    node        TEXT NOT NULL,
    module      TEXT NOT NULL,
    name        TEXT NOT NULL,
    last_backup TEXT NOT NULL,
    PRIMARY KEY (node, module, name)
) STRICT;

-- Seats or bindings moved to a holder that starts without the data the old
-- one kept, until a person records a hand act for it or the data is there.
CREATE TABLE replacements (
    id          INTEGER PRIMARY KEY,
    what        TEXT NOT NULL,
    new_holder  TEXT NOT NULL,
    old_holder  TEXT NOT NULL,
    data        TEXT NOT NULL,
    at          TEXT NOT NULL,
    resolved_at TEXT
) STRICT;
