-- This store's fence: the highest lease generation a controller has taken
-- over with (the lease is in the identity store, and no query joins two
-- stores). A serving controller's writes check, in their own transaction,
-- that no newer controller has raised it: a deposed controller's writes are
-- refused by the store.
CREATE TABLE fence (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    generation INTEGER NOT NULL
) STRICT;
INSERT INTO fence (id, generation) VALUES (1, 0);
