CREATE TABLE asks (
    id            TEXT PRIMARY KEY,            -- b-<unix-millis>-<random>
    repository    TEXT NOT NULL CHECK (repository <> ''),
    ref           TEXT NOT NULL DEFAULT '',
    -- module is known when the ask names it (rebuild, plans) or once built.
    module        TEXT NOT NULL DEFAULT '',
    dry_run       INTEGER NOT NULL DEFAULT 0 CHECK (dry_run IN (0, 1)),
    plan_id       TEXT NOT NULL DEFAULT '',
    -- again_of is the ask this one asks again (rebuild, replay, the healer
    -- that re-asks a dead ask once), '' for a first ask.
    again_of      TEXT NOT NULL DEFAULT '',
    state         TEXT NOT NULL CHECK (state IN ('waiting', 'in-flight', 'done', 'failed', 'dead', 'superseded', 'cancelled', 'killed')),
    -- builder is the node/module that last took the ask.
    builder       TEXT NOT NULL DEFAULT '',
    asked_at      TEXT NOT NULL,
    -- taken_at is when the last try was taken; last_try_at is when a try
    -- was last given up (the ask went back to waiting): the waiting bound
    -- counts from it.
    taken_at      TEXT,
    finished_at   TEXT,
    tries         INTEGER NOT NULL DEFAULT 0,
    last_try_at   TEXT,
    -- late is 1 when the outcome came from a try already given up (a
    -- builder that answered after its bound).
    late          INTEGER NOT NULL DEFAULT 0 CHECK (late IN (0, 1)),
    source_commit TEXT NOT NULL DEFAULT '',
    version       TEXT NOT NULL DEFAULT '',
    digest        TEXT NOT NULL DEFAULT '',
    bytes         INTEGER NOT NULL DEFAULT 0,
    duration_ms   REAL NOT NULL DEFAULT 0,
    why           TEXT NOT NULL DEFAULT '',
    registered    INTEGER NOT NULL DEFAULT 0 CHECK (registered IN (0, 1)), allow_older INTEGER NOT NULL DEFAULT 0, commit_at TEXT NOT NULL DEFAULT '', unpacked_bytes INTEGER NOT NULL DEFAULT 0,
    -- Only an open ask has no end; an ask in flight was taken; a dry run is
    -- never taken in.
    CHECK ((finished_at IS NULL) = (state IN ('waiting', 'in-flight'))),
    CHECK (state <> 'in-flight' OR taken_at IS NOT NULL),
    CHECK (registered = 0 OR (state = 'done' AND dry_run = 0))
) STRICT;
CREATE TABLE fence (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    generation INTEGER NOT NULL
) STRICT;
CREATE TABLE outcome_details (
    id       TEXT PRIMARY KEY REFERENCES asks (id) ON DELETE CASCADE,
    problems TEXT NOT NULL DEFAULT '[]',
    log_tail TEXT NOT NULL DEFAULT '[]',
    manifest TEXT NOT NULL DEFAULT ''
) STRICT;
CREATE TABLE paused_builders (
    holder TEXT PRIMARY KEY CHECK (holder <> ''),
    since  TEXT NOT NULL,
    why    TEXT NOT NULL DEFAULT ''
) STRICT;
CREATE TABLE plan_steps (
    plan       TEXT NOT NULL REFERENCES plans (id) ON DELETE CASCADE,
    position   INTEGER NOT NULL CHECK (position >= 0),
    module     TEXT NOT NULL CHECK (module <> ''),
    repository TEXT NOT NULL CHECK (repository <> ''),
    ref        TEXT NOT NULL DEFAULT '',
    -- bases: the modules of this plan it waits for, a JSON array.
    bases      TEXT NOT NULL DEFAULT '[]',
    state      TEXT NOT NULL CHECK (state IN ('waiting', 'asked', 'done', 'failed', 'stopped')),
    ask        TEXT NOT NULL DEFAULT '',
    why        TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (plan, position),
    UNIQUE (plan, module),
    CHECK (state IN ('waiting', 'stopped') OR ask <> '')
) STRICT;
CREATE TABLE plans (
    id        TEXT PRIMARY KEY,                 -- p-<unix-millis>-<random>
    kind      TEXT NOT NULL CHECK (kind IN ('behind', 'on')),
    -- base is the module a plan 'on' rebuilds the dependants of.
    base      TEXT NOT NULL DEFAULT '',
    state     TEXT NOT NULL CHECK (state IN ('running', 'done', 'failed', 'stopped', 'closed')),
    made_at   TEXT NOT NULL,
    ended_at  TEXT,
    -- why a person stopped or closed it.
    why       TEXT NOT NULL DEFAULT '',
    CHECK ((ended_at IS NULL) = (state = 'running'))
) STRICT;
CREATE TABLE schema_migrations (
	version    INTEGER PRIMARY KEY,
	name       TEXT NOT NULL,
	checksum   TEXT NOT NULL,
	applied_at TEXT NOT NULL
);
CREATE INDEX asks_asked ON asks (asked_at, id);
CREATE INDEX asks_module ON asks (module, asked_at, id);
CREATE INDEX asks_state ON asks (state, asked_at, id);
CREATE INDEX plans_made ON plans (made_at, id);
CREATE INDEX plans_state ON plans (state, made_at, id);
