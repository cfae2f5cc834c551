-- Controllers of different versions on the same stores (an upgrade).
--
-- The serving controller records its version with the lease, so that a
-- controller standing by, and broker show, can name it.
ALTER TABLE lease ADD COLUMN version TEXT NOT NULL DEFAULT '';

-- The fence says which controller last raised it (took the lease) or
-- migrated these stores, and to which generation it raised it. A
-- controller that knows this migration raises both together; one that
-- predates it (v0.2.0 and older) raises the generation alone when it takes
-- the lease, and is refused here, in the transaction that would have made
-- it the serving controller: it writes nothing, and says to upgrade. (The
-- message is a literal: an older sqlite3, a person's, cannot read a
-- schema whose RAISE computes one; the newer controller's version is on
-- the fence, and broker show names it.)
ALTER TABLE fence ADD COLUMN controller TEXT NOT NULL DEFAULT '';
ALTER TABLE fence ADD COLUMN raised_to INTEGER NOT NULL DEFAULT 0;
UPDATE fence SET raised_to = generation;
CREATE TRIGGER fence_raised_by_an_older_controller BEFORE UPDATE OF generation ON fence
WHEN NEW.generation <> OLD.generation AND NEW.raised_to IS NOT NEW.generation
BEGIN
    SELECT RAISE(ABORT, 'these stores were migrated by a newer mesh-controller, which this older one cannot serve: upgrade this mesh-controller');
END;

-- A controller standing by says its version, and why it stands aside when
-- it will not take the lease (the stores are newer than it knows). One
-- that predates this migration records no version, and is refused: it
-- would never serve these stores. Those recorded before are forgotten.
ALTER TABLE standbys ADD COLUMN version TEXT;
ALTER TABLE standbys ADD COLUMN aside TEXT NOT NULL DEFAULT '';
DELETE FROM standbys;
CREATE TRIGGER standbys_of_an_older_controller BEFORE INSERT ON standbys
WHEN NEW.version IS NULL
BEGIN
    SELECT RAISE(ABORT, 'these stores were migrated by a newer mesh-controller, which this older one cannot serve: upgrade this mesh-controller');
END;

-- The protocol each node's host speaks, as last heard ('' until heard by
-- a controller that records it).
ALTER TABLE hosts ADD COLUMN protocol TEXT NOT NULL DEFAULT '';
