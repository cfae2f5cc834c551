-- PostgreSQL twin of 0001_asks_and_paused_builders.sql: the same schema in PostgreSQL's words
-- (BIGINT for INTEGER, DOUBLE PRECISION for REAL, BYTEA for BLOB, identity
-- for a rowid key, patterns for GLOB; no STRICT).
-- Build asks: the queue and the record of builds in one table, one row per
-- ask from the moment it is asked to its outcome. An ask is open while it is
-- waiting, in flight or dead (it shows in the queue), and ended once done,
-- failed, superseded, cancelled or killed. The outcome's columns stay empty
-- until a builder reports one; its bulky parts are in outcome_details, so
-- that rows stay narrow and the queue and lists read little.
CREATE TABLE asks (
    id            TEXT PRIMARY KEY,            -- b-<unix-millis>-<random>
    repository    TEXT NOT NULL CHECK (repository <> ''),
    ref           TEXT NOT NULL DEFAULT '',
    -- module is known when the ask names it (rebuild, plans) or once built.
    module        TEXT NOT NULL DEFAULT '',
    dry_run       BIGINT NOT NULL DEFAULT 0 CHECK (dry_run IN (0, 1)),
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
    tries         BIGINT NOT NULL DEFAULT 0,
    last_try_at   TEXT,
    -- late is 1 when the outcome came from a try already given up (a
    -- builder that answered after its bound).
    late          BIGINT NOT NULL DEFAULT 0 CHECK (late IN (0, 1)),
    source_commit TEXT NOT NULL DEFAULT '',
    version       TEXT NOT NULL DEFAULT '',
    digest        TEXT NOT NULL DEFAULT '',
    bytes         BIGINT NOT NULL DEFAULT 0,
    duration_ms   DOUBLE PRECISION NOT NULL DEFAULT 0,
    why           TEXT NOT NULL DEFAULT '',
    registered    BIGINT NOT NULL DEFAULT 0 CHECK (registered IN (0, 1)),
    -- Only an open ask has no end; an ask in flight was taken; a dry run is
    -- never taken in.
    CHECK ((finished_at IS NULL) = (state IN ('waiting', 'in-flight'))),
    CHECK (state <> 'in-flight' OR taken_at IS NOT NULL),
    CHECK (registered = 0 OR (state = 'done' AND dry_run = 0))
);

-- builds, newest first.
CREATE INDEX asks_asked ON asks (asked_at, id);
-- queue, the waiting asks, expiry, and builds filtered by state.
CREATE INDEX asks_state ON asks (state, asked_at, id);
-- builds <module>, the latest build of each module, prune.
CREATE INDEX asks_module ON asks (module, asked_at, id);

-- The bulky parts of an outcome, one row per ask that has one: the
-- manifest's problems and the log's last lines (JSON arrays, bounded as
-- they are kept) and mesh.json as built (JSON text, '' when there was none).
CREATE TABLE outcome_details (
    id       TEXT PRIMARY KEY REFERENCES asks (id) ON DELETE CASCADE,
    problems TEXT NOT NULL DEFAULT '[]',
    log_tail TEXT NOT NULL DEFAULT '[]',
    manifest TEXT NOT NULL DEFAULT ''
);

-- Holders of the build seat that take nothing new: a node, or '*' for
-- every holder. A row is removed when the holder resumes.
CREATE TABLE paused_builders (
    holder TEXT PRIMARY KEY CHECK (holder <> ''),
    since  TEXT NOT NULL,
    why    TEXT NOT NULL DEFAULT ''
);
