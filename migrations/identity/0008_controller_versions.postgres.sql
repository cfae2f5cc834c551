-- PostgreSQL twin of 0008_controller_versions.sql: the same schema in PostgreSQL's words
-- (BIGINT for INTEGER, a plpgsql function for each trigger's body).
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
-- it the serving controller: it writes nothing, and says to upgrade.
ALTER TABLE fence ADD COLUMN controller TEXT NOT NULL DEFAULT '';
ALTER TABLE fence ADD COLUMN raised_to BIGINT NOT NULL DEFAULT 0;
UPDATE fence SET raised_to = generation;
CREATE FUNCTION fence_raised_by_an_older_controller() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.generation <> OLD.generation AND NEW.raised_to IS DISTINCT FROM NEW.generation THEN
        RAISE EXCEPTION 'these stores were migrated by %, which this older one cannot serve: upgrade this mesh-controller',
            CASE OLD.controller WHEN '' THEN 'a newer mesh-controller' ELSE 'mesh-controller ' || OLD.controller END
            USING ERRCODE = 'raise_exception';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER fence_raised_by_an_older_controller BEFORE UPDATE OF generation ON fence
FOR EACH ROW EXECUTE FUNCTION fence_raised_by_an_older_controller();

-- A controller standing by says its version, and why it stands aside when
-- it will not take the lease (the stores are newer than it knows). One
-- that predates this migration records no version, and is refused: it
-- would never serve these stores. Those recorded before are forgotten.
ALTER TABLE standbys ADD COLUMN version TEXT;
ALTER TABLE standbys ADD COLUMN aside TEXT NOT NULL DEFAULT '';
DELETE FROM standbys;
CREATE FUNCTION standbys_of_an_older_controller() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.version IS NULL THEN
        RAISE EXCEPTION 'these stores were migrated by a newer mesh-controller, which this older one cannot serve: upgrade this mesh-controller'
            USING ERRCODE = 'raise_exception';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER standbys_of_an_older_controller BEFORE INSERT ON standbys
FOR EACH ROW EXECUTE FUNCTION standbys_of_an_older_controller();

-- The protocol each node's host speaks, as last heard ('' until heard by
-- a controller that records it).
ALTER TABLE hosts ADD COLUMN protocol TEXT NOT NULL DEFAULT '';
