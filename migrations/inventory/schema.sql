CREATE TABLE nodes (
    name       TEXT PRIMARY KEY
               CHECK (length(name) BETWEEN 1 AND 63
                      AND name GLOB '[a-z]*'
                      AND name NOT GLOB '*[^a-z0-9-]*'),
    mode       TEXT NOT NULL CHECK (mode IN ('adopted', 'converged')),
    created_at TEXT NOT NULL,
    joined_at  TEXT,
    last_heard TEXT
) STRICT;
CREATE TABLE schema_migrations (
	version    INTEGER PRIMARY KEY,
	name       TEXT NOT NULL,
	checksum   TEXT NOT NULL,
	applied_at TEXT NOT NULL
);
