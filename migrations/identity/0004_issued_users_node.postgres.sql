-- PostgreSQL twin of 0004_issued_users_node.sql: the same schema in PostgreSQL's words
-- (BIGINT for INTEGER, DOUBLE PRECISION for REAL, BYTEA for BLOB, identity
-- for a rowid key, patterns for GLOB; no STRICT).
-- Host users are recorded too, one per join, and a join revokes the node's
-- earlier ones: found by node, not by scanning every user issued.
CREATE INDEX issued_users_node ON issued_users (node, kind);
