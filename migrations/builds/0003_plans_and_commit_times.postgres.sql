-- PostgreSQL twin of 0003_plans_and_commit_times.sql: the same schema in PostgreSQL's words
-- (BIGINT for INTEGER, DOUBLE PRECISION for REAL, BYTEA for BLOB, identity
-- for a rowid key, patterns for GLOB; no STRICT).
-- Build plans: build --behind and build --on make one, whose steps are
-- module builds that wait for the steps they stand on (their bases). A
-- plan runs until every step is done, a step fails (its dependants are
-- stopped and the plan is failed until retried or closed), or a person
-- stops it.
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
);

CREATE INDEX plans_made ON plans (made_at, id);
CREATE INDEX plans_state ON plans (state, made_at, id);

-- One row per module a plan builds, in an order where every step comes
-- after its bases. ask is the build asking for it now ('' until asked).
CREATE TABLE plan_steps (
    plan       TEXT NOT NULL REFERENCES plans (id) ON DELETE CASCADE,
    position   BIGINT NOT NULL CHECK (position >= 0),
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
);

-- When a build's commit was made (the committer's time, as git says it):
-- of two builds of one module version, the newer commit wins.
ALTER TABLE asks ADD COLUMN commit_at TEXT NOT NULL DEFAULT '';
