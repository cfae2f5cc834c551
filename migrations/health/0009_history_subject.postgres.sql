-- PostgreSQL twin of 0009_history_subject.sql: the same schema in PostgreSQL's words
-- (BIGINT for INTEGER, DOUBLE PRECISION for REAL, BYTEA for BLOB, identity
-- for a rowid key, patterns for GLOB; no STRICT).
-- Condition history is bounded per subject as well as by age: each row
-- names what it counts against (the condition's machine, or for a
-- condition about none its key), and a write keeps at most a fixed number
-- of rows of that subject, the oldest going. Rows from before have none;
-- they go with the age window.
ALTER TABLE condition_history ADD COLUMN subject TEXT NOT NULL DEFAULT '';
CREATE INDEX condition_history_subject ON condition_history (subject, id);
-- node.unmanaged-listener is one condition a node (node.unmanaged-listener/
-- NODE, its listeners counted and the first few named), no longer one a
-- listener: the former keys, open or in the history, are cleared here, not
-- by a first self-check that would send a clearing message for each (a host
-- reporting a thousand listeners left a thousand).
DELETE FROM conditions WHERE kind = 'node.unmanaged-listener';
DELETE FROM condition_history WHERE kind = 'node.unmanaged-listener';
