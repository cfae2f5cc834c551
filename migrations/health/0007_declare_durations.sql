-- How long the parts of a declare to many nodes took (plan, sign, store,
-- send) is a duration of its own kind. SQLite cannot change a CHECK in
-- place: the table is made again, rows kept.
CREATE TABLE durations_next (
    id      INTEGER PRIMARY KEY,
    kind    TEXT NOT NULL CHECK (kind IN ('apply', 'heartbeat', 'tier', 'build', 'start', 'declare')),
    subject TEXT NOT NULL,
    name    TEXT NOT NULL DEFAULT '',
    ms      REAL NOT NULL,
    at      TEXT NOT NULL
) STRICT;
INSERT INTO durations_next (id, kind, subject, name, ms, at) SELECT id, kind, subject, name, ms, at FROM durations;
DROP TABLE durations;
ALTER TABLE durations_next RENAME TO durations;
CREATE INDEX durations_kind_at ON durations (kind, at);
