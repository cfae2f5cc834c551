-- PostgreSQL twin of 0010_acts_under_way.sql: the same schema in
-- PostgreSQL's words (no STRICT).
-- Acts under way: a person's command that moves plans (assign, unassign,
-- a seat handed over, a roll-out) says so here from its first write until
-- it has declared, so that the serving controller's catch-up leaves those
-- nodes to it instead of making the same broker users and secrets and
-- declaring every node a second time. A command that dies leaves its row
-- until it expires, or until a controller on its machine finds its
-- process gone; the catch-up then completes what it left.
CREATE TABLE acts_under_way (
    id    TEXT PRIMARY KEY,
    what  TEXT NOT NULL,
    pid   BIGINT NOT NULL,
    host  TEXT NOT NULL,
    until TEXT NOT NULL
);
