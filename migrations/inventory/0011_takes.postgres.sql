-- PostgreSQL twin of 0011_takes.sql: the same schema in PostgreSQL's words
-- (BIGINT for INTEGER, DOUBLE PRECISION for REAL, BYTEA for BLOB, identity
-- for a rowid key, patterns for GLOB; no STRICT).
-- A module taken onto an adopted node (take --yes) keeps how: the cutover a
-- person approved (its digest, the units and processes stopped) and what
-- ran there before, as JSON; NULL for a module assigned plainly. It goes
-- with its assignment: a module unassigned and assigned again was not taken.
ALTER TABLE assignments ADD COLUMN taken TEXT;

-- Each take preview shown, by its digest, for a while: take --yes with a
-- digest that is not of a preview of that node and module is refused as
-- such, and one whose preview changed since is refused saying what changed.
CREATE TABLE take_previews (
    digest   TEXT PRIMARY KEY,
    node     TEXT NOT NULL,
    module   TEXT NOT NULL,
    preview  TEXT NOT NULL,
    shown_at TEXT NOT NULL
);
CREATE INDEX take_previews_shown ON take_previews (shown_at);
