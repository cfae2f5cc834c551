CREATE TABLE brake (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    engaged_at  TEXT NOT NULL,
    why         TEXT NOT NULL,
    released_at TEXT,
    released_by TEXT NOT NULL DEFAULT '',
    release_why TEXT NOT NULL DEFAULT ''
) STRICT;
CREATE TABLE condition_history (
    id       INTEGER PRIMARY KEY,
    key      TEXT NOT NULL,
    kind     TEXT NOT NULL,
    event    TEXT NOT NULL CHECK (event IN ('raised', 'changed', 'cleared', 'silenced')),
    severity TEXT NOT NULL,
    summary  TEXT NOT NULL,
    evidence TEXT NOT NULL DEFAULT '{}',
    at       TEXT NOT NULL
, subject TEXT NOT NULL DEFAULT '') STRICT;
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
CREATE TABLE dropped_messages (
    node     TEXT NOT NULL,
    reason   TEXT NOT NULL,
    count    INTEGER NOT NULL,
    first_at TEXT NOT NULL,
    last_at  TEXT NOT NULL,
    PRIMARY KEY (node, reason)
) STRICT;
CREATE TABLE "durations" (
    id      INTEGER PRIMARY KEY,
    kind    TEXT NOT NULL CHECK (kind IN ('apply', 'heartbeat', 'tier', 'build', 'start', 'declare')),
    subject TEXT NOT NULL,
    name    TEXT NOT NULL DEFAULT '',
    ms      REAL NOT NULL,
    at      TEXT NOT NULL
) STRICT;
CREATE TABLE fence (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    generation INTEGER NOT NULL
) STRICT;
CREATE TABLE hand_acts (
    id        INTEGER PRIMARY KEY,
    at        TEXT NOT NULL,
    what      TEXT NOT NULL,
    why       TEXT NOT NULL CHECK (why <> ''),
    cause     TEXT NOT NULL DEFAULT '',
    who       TEXT NOT NULL,
    condition TEXT NOT NULL DEFAULT ''
) STRICT;
CREATE TABLE healer_acts (
    id        INTEGER PRIMARY KEY,
    healer    TEXT NOT NULL,
    subject   TEXT NOT NULL,
    condition TEXT NOT NULL,
    detail    TEXT NOT NULL DEFAULT '',
    outcome   TEXT NOT NULL,
    at        TEXT NOT NULL
) STRICT;
CREATE TABLE heartbeat_hours (
    node    TEXT NOT NULL,
    hour    TEXT NOT NULL,
    count   INTEGER NOT NULL,
    sum_ms  REAL NOT NULL,
    max_ms  REAL NOT NULL,
    buckets TEXT NOT NULL,
    PRIMARY KEY (node, hour)
) STRICT;
CREATE TABLE join_refusals (
    source  TEXT NOT NULL,
    reason  TEXT NOT NULL,
    minute  TEXT NOT NULL,
    count   INTEGER NOT NULL,
    last_at TEXT NOT NULL,
    PRIMARY KEY (source, reason, minute)
) STRICT;
CREATE TABLE module_states (
    node        TEXT NOT NULL,
    module      TEXT NOT NULL,
    version     TEXT NOT NULL,
    state       TEXT NOT NULL,
    serial      INTEGER NOT NULL DEFAULT 0,
    pid         INTEGER NOT NULL DEFAULT 0,
    since       TEXT NOT NULL,
    restarts_1h INTEGER NOT NULL DEFAULT 0,
    last_exit   TEXT NOT NULL DEFAULT '',
    detail      TEXT NOT NULL DEFAULT '',
    log_tail    TEXT NOT NULL DEFAULT '[]',
    heard_at    TEXT NOT NULL,
    -- changed_at is when the controller heard this state begin: a bound
    -- (module.not-ready) is timed on the controller's clock.
    changed_at  TEXT NOT NULL, archive TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (node, module)
) STRICT;
CREATE TABLE schema_migrations (
	version    INTEGER PRIMARY KEY,
	name       TEXT NOT NULL,
	checksum   TEXT NOT NULL,
	applied_at TEXT NOT NULL
);
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
CREATE INDEX condition_history_at ON condition_history (at);
CREATE INDEX condition_history_key ON condition_history (key, at);
CREATE INDEX condition_history_subject ON condition_history (subject, id);
CREATE INDEX durations_kind_at ON durations (kind, at);
CREATE INDEX hand_acts_at ON hand_acts (at);
CREATE INDEX healer_acts_at ON healer_acts (at);
CREATE INDEX heartbeat_hours_hour ON heartbeat_hours (hour);
CREATE INDEX join_refusals_minute ON join_refusals (minute);
