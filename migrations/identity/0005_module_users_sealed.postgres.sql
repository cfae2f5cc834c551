-- PostgreSQL twin of 0005_module_users_sealed.sql: the same schema in PostgreSQL's words
-- (BIGINT for INTEGER, DOUBLE PRECISION for REAL, BYTEA for BLOB, identity
-- for a rowid key, patterns for GLOB; no STRICT).
-- A module's own broker user, made on assign (or join) and sealed to its
-- node alone: sealed is the .creds document as age armour (never the
-- plaintext), version the module version whose permissions it carries.
-- A user issued by hand (module issue) keeps sealed empty.
ALTER TABLE issued_users ADD COLUMN sealed TEXT NOT NULL DEFAULT '';
ALTER TABLE issued_users ADD COLUMN version TEXT NOT NULL DEFAULT '';
