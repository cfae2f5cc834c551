-- PostgreSQL twin of 0014_found_holders.sql: the same schema in PostgreSQL's
-- words (no STRICT).
-- Where each listener a host found listens (its addresses: loopback only
-- is not reachable from elsewhere) and which commands hold it (the mesh's
-- own programs are not something it failed to declare), both space
-- separated and sorted: node.unmanaged-listener judges a converged node's
-- listeners by them.
ALTER TABLE node_found ADD COLUMN addresses TEXT NOT NULL DEFAULT '';
ALTER TABLE node_found ADD COLUMN commands TEXT NOT NULL DEFAULT '';
