-- PostgreSQL twin of 0003_heartbeat_hours.sql: the same schema in PostgreSQL's words
-- (BIGINT for INTEGER, DOUBLE PRECISION for REAL, BYTEA for BLOB, identity
-- for a rowid key, patterns for GLOB; no STRICT).
-- Heartbeat intervals kept as one aggregate per node and hour, however often
-- the node beats: a row per beat grew by gigabytes a day at a thousand beats
-- a second. buckets is a JSON object of bucket index to count; bucket i holds
-- intervals up to 2^(i/4) ms (see health.Histogram), enough for p50 and p99
-- within 19 %.
CREATE TABLE heartbeat_hours (
    node    TEXT NOT NULL,
    hour    TEXT NOT NULL,
    count   BIGINT NOT NULL,
    sum_ms  DOUBLE PRECISION NOT NULL,
    max_ms  DOUBLE PRECISION NOT NULL,
    buckets TEXT NOT NULL,
    PRIMARY KEY (node, hour)
);

CREATE INDEX heartbeat_hours_hour ON heartbeat_hours (hour);

-- The per-beat rows are not converted: they were a window of measurements,
-- and the aggregates fill again within the hour.
DELETE FROM durations WHERE kind = 'heartbeat';
