-- PostgreSQL twin of 0004_join_refusals.sql: the same schema in PostgreSQL's words
-- (BIGINT for INTEGER, DOUBLE PRECISION for REAL, BYTEA for BLOB, identity
-- for a rowid key, patterns for GLOB; no STRICT).
-- Joins the daemon refused, counted per source address (as the broker saw
-- it), reason and minute: the self-check raises join.refused when one
-- source is refused often within a window, and the minutes let it tell a
-- burst from a few refusals spread over days.
CREATE TABLE join_refusals (
    source  TEXT NOT NULL,
    reason  TEXT NOT NULL,
    minute  TEXT NOT NULL,
    count   BIGINT NOT NULL,
    last_at TEXT NOT NULL,
    PRIMARY KEY (source, reason, minute)
);

CREATE INDEX join_refusals_minute ON join_refusals (minute);
