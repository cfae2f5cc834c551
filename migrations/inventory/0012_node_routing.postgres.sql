-- PostgreSQL twin of 0012_node_routing.sql: the same schema in PostgreSQL's
-- words (no STRICT).
-- What a node routes: the domain its public ports' routed names are
-- composed under (<port>.<module>.<domain>; NULL: none, its public ports are
-- not reachable), and the networks it routes for what it hosts (a JSON
-- array of canonical CIDR prefixes; NULL: none). Both are carried in its
-- declaration; its packet filter follows them.
ALTER TABLE nodes ADD COLUMN public_domain TEXT;
ALTER TABLE nodes ADD COLUMN networks TEXT;
