-- Conditions: something wrong now, raised and cleared only by the
-- self-check. Raising an open key again changes it rather than opening a
-- second one.
CREATE TABLE conditions (
    key            TEXT PRIMARY KEY,
    kind           TEXT NOT NULL,
    scope          TEXT NOT NULL CHECK (scope IN ('mesh', 'machine', 'module')),
    machine        TEXT NOT NULL DEFAULT '',
    module         TEXT NOT NULL DEFAULT '',
    severity       TEXT NOT NULL CHECK (severity IN ('urgent', 'warning', 'notice')),
    summary        TEXT NOT NULL,
    evidence       TEXT NOT NULL DEFAULT '{}',
    raised_at      TEXT NOT NULL,
    changed_at     TEXT NOT NULL,
    silenced_until TEXT,
    silence_why    TEXT NOT NULL DEFAULT ''
) STRICT;

-- Every raising, change, clearing and silencing.
CREATE TABLE condition_history (
    id       INTEGER PRIMARY KEY,
    key      TEXT NOT NULL,
    kind     TEXT NOT NULL,
    event    TEXT NOT NULL CHECK (event IN ('raised', 'changed', 'cleared', 'silenced')),
    severity TEXT NOT NULL,
    summary  TEXT NOT NULL,
    evidence TEXT NOT NULL DEFAULT '{}',
    at       TEXT NOT NULL
) STRICT;

CREATE INDEX condition_history_at ON condition_history (at);
CREATE INDEX condition_history_key ON condition_history (key, at);

-- The self-check's verdicts: each probe's result and what the run changed.
CREATE TABLE verdicts (
    id      INTEGER PRIMARY KEY,
    at      TEXT NOT NULL,
    ok      INTEGER NOT NULL,
    probes  TEXT NOT NULL,
    raised  INTEGER NOT NULL,
    changed INTEGER NOT NULL,
    cleared INTEGER NOT NULL,
    open    INTEGER NOT NULL,
    took_ms REAL NOT NULL
) STRICT;

-- Durations measured on this mesh (apply, heartbeat, plan tiers, builds):
-- what bounds are set from. Kept for a window, deleted in small batches.
CREATE TABLE durations (
    id      INTEGER PRIMARY KEY,
    kind    TEXT NOT NULL CHECK (kind IN ('apply', 'heartbeat', 'tier', 'build')),
    subject TEXT NOT NULL,
    name    TEXT NOT NULL DEFAULT '',
    ms      REAL NOT NULL,
    at      TEXT NOT NULL
) STRICT;

CREATE INDEX durations_kind_at ON durations (kind, at);

-- What healers did, and the brake that stops them all.
CREATE TABLE healer_acts (
    id        INTEGER PRIMARY KEY,
    healer    TEXT NOT NULL,
    subject   TEXT NOT NULL,
    condition TEXT NOT NULL,
    detail    TEXT NOT NULL DEFAULT '',
    outcome   TEXT NOT NULL,
    at        TEXT NOT NULL
) STRICT;

CREATE INDEX healer_acts_at ON healer_acts (at);

CREATE TABLE brake (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    engaged_at  TEXT NOT NULL,
    why         TEXT NOT NULL,
    released_at TEXT,
    released_by TEXT NOT NULL DEFAULT '',
    release_why TEXT NOT NULL DEFAULT ''
) STRICT;
