-- Nodes: the machines the mesh knows, a record first, a joined machine once its
-- host presents its token. Names are checked here too, as a last defence.
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
