-- A licence: access to a model or an outside service (an API key, or an
-- access token with its refresh token) under the name a person chose for
-- it. expires is the current version's expiry (NULL: it does not say);
-- the manager is the node (and its module) that holds the refresh token
-- and answers refresh, NULL until one is named.
CREATE TABLE licences (
    name           TEXT PRIMARY KEY,
    provider       TEXT NOT NULL CHECK (provider <> ''),
    refreshable    INTEGER NOT NULL CHECK (refreshable IN (0, 1)),
    version        INTEGER NOT NULL CHECK (version > 0),
    expires        TEXT,
    made           TEXT NOT NULL,
    manager_node   TEXT,
    manager_module TEXT,
    CHECK ((manager_node IS NULL) = (manager_module IS NULL))
) STRICT;

-- Each version of a licence's token: the first is a person's, the next a
-- refresh's. A superseded version's copies are kept, recoverable by the
-- operator, until discard_after, then discarded.
CREATE TABLE licence_versions (
    licence       TEXT NOT NULL REFERENCES licences (name),
    version       INTEGER NOT NULL CHECK (version > 0),
    made_by       TEXT NOT NULL CHECK (made_by IN ('person', 'refresh')),
    made          TEXT NOT NULL,
    expires       TEXT,
    discard_after TEXT,
    PRIMARY KEY (licence, version)
) STRICT;

-- Which module on which node holds a licence: each holder gets a copy of
-- the current version sealed to its node.
CREATE TABLE licence_holders (
    licence TEXT NOT NULL REFERENCES licences (name),
    node    TEXT NOT NULL,
    module  TEXT NOT NULL,
    since   TEXT NOT NULL,
    PRIMARY KEY (licence, node, module)
) STRICT;

-- Every sealed copy of every version: 'operator' is the token sealed to the
-- operator key alone (node and module empty); 'holder' the token sealed to
-- a holder's node and the operator; 'refresh' the refresh token, sealed to
-- the operator and to the manager's node (empty until one is named). The
-- operator key and node recipient each copy is sealed to are kept beside
-- it, since age ciphertext does not say. Never a plaintext.
CREATE TABLE licence_copies (
    licence        TEXT NOT NULL,
    version        INTEGER NOT NULL,
    kind           TEXT NOT NULL CHECK (kind IN ('operator', 'holder', 'refresh')),
    node           TEXT NOT NULL,
    module         TEXT NOT NULL,
    node_recipient TEXT CHECK (node_recipient GLOB 'age1*'),
    operator_key   TEXT NOT NULL CHECK (operator_key GLOB 'age1*'),
    sealed         TEXT NOT NULL CHECK (sealed GLOB '-----BEGIN AGE ENCRYPTED FILE-----*'),
    sealed_at      TEXT NOT NULL,
    PRIMARY KEY (licence, version, kind, node, module),
    FOREIGN KEY (licence, version) REFERENCES licence_versions (licence, version),
    CHECK (kind <> 'holder' OR (node <> '' AND module <> '' AND node_recipient IS NOT NULL)),
    CHECK (kind <> 'operator' OR (node = '' AND module = '' AND node_recipient IS NULL))
) STRICT;

-- What happened to each licence, without its value.
CREATE TABLE licence_history (
    id      INTEGER PRIMARY KEY,
    licence TEXT NOT NULL,
    version INTEGER NOT NULL,
    event   TEXT NOT NULL CHECK (event IN ('added', 'used', 'stopped', 'manager', 'refreshed', 'refresh-failed', 'discarded')),
    node    TEXT NOT NULL,
    module  TEXT NOT NULL,
    at      TEXT NOT NULL
) STRICT;

-- This store's fence: the highest lease generation a controller has taken
-- over with (the lease is in the identity store, and no query joins two
-- stores). A serving controller's writes check, in their own transaction,
-- that no newer controller has raised it.
CREATE TABLE fence (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    generation INTEGER NOT NULL
) STRICT;
INSERT INTO fence (id, generation) VALUES (1, 0);
