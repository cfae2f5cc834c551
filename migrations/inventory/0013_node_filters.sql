-- The packet filter the mesh owns on a converged node (converge --filter
-- nftables), and whether the person asked to close the SSH port the node
-- reports (--close-ssh; kept open otherwise, so no one is locked out by
-- default). A node without a row owns no filter: every adopted node, and
-- a converged one converged without --filter. adopt deletes the row.
CREATE TABLE node_filters (
    node      TEXT PRIMARY KEY REFERENCES nodes (name) ON DELETE CASCADE,
    kind      TEXT NOT NULL CHECK (kind IN ('nftables')),
    close_ssh INTEGER NOT NULL DEFAULT 0 CHECK (close_ssh IN (0, 1)),
    since     TEXT NOT NULL
) STRICT;
