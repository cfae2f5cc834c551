-- Acts done by hand outside the ordinary flow, with why and who.
CREATE TABLE hand_acts (
    id        INTEGER PRIMARY KEY,
    at        TEXT NOT NULL,
    what      TEXT NOT NULL,
    why       TEXT NOT NULL CHECK (why <> ''),
    cause     TEXT NOT NULL DEFAULT '',
    who       TEXT NOT NULL,
    condition TEXT NOT NULL DEFAULT ''
) STRICT;

CREATE INDEX hand_acts_at ON hand_acts (at);

-- Messages the controller dropped (a bad signature, an unknown sender),
-- counted per claimed node and reason.
CREATE TABLE dropped_messages (
    node     TEXT NOT NULL,
    reason   TEXT NOT NULL,
    count    INTEGER NOT NULL,
    first_at TEXT NOT NULL,
    last_at  TEXT NOT NULL,
    PRIMARY KEY (node, reason)
) STRICT;
