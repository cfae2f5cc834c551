-- The operator's age public keys, newest current; a replaced key is kept,
-- because copies sealed to it open only with it.
CREATE TABLE operator_keys (
    id          INTEGER PRIMARY KEY,
    recipient   TEXT NOT NULL UNIQUE CHECK (recipient GLOB 'age1*'),
    set_at      TEXT NOT NULL,
    replaced_at TEXT
) STRICT;

-- Every secret's current sealed copy: one age file sealed to the node's
-- recipient and the operator key (so both open the same value), with the id
-- of each key it is sealed to, since age ciphertext does not say. Never a
-- plaintext.
CREATE TABLE sealed (
    node           TEXT NOT NULL,
    module         TEXT NOT NULL,
    name           TEXT NOT NULL,
    version        INTEGER NOT NULL CHECK (version > 0),
    made_by        TEXT NOT NULL CHECK (made_by IN ('mesh', 'person')),
    node_recipient TEXT NOT NULL CHECK (node_recipient GLOB 'age1*'),
    operator_key   INTEGER NOT NULL REFERENCES operator_keys (id),
    sealed         TEXT NOT NULL CHECK (sealed GLOB '-----BEGIN AGE ENCRYPTED FILE-----*'),
    sealed_at      TEXT NOT NULL,
    PRIMARY KEY (node, module, name)
) STRICT;

-- What happened to each secret, without its value.
CREATE TABLE secret_history (
    id      INTEGER PRIMARY KEY,
    node    TEXT NOT NULL,
    module  TEXT NOT NULL,
    name    TEXT NOT NULL,
    version INTEGER NOT NULL,
    event   TEXT NOT NULL CHECK (event IN ('made', 'accepted', 'forgotten')),
    at      TEXT NOT NULL
) STRICT;
