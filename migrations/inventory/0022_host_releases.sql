-- Host self-upgrade (issue 31): the host releases the controller keeps,
-- each a mesh-host binary packed as an archive and kept in the broker's
-- archive store under its digest, as built archives are; the release each
-- node is declared to run, and the version each host says it runs.
CREATE TABLE host_releases (
    version        TEXT PRIMARY KEY CHECK (length(version) BETWEEN 1 AND 128),
    digest         TEXT NOT NULL,
    bytes          INTEGER NOT NULL,
    unpacked_bytes INTEGER NOT NULL,
    os             TEXT NOT NULL DEFAULT '',
    arch           TEXT NOT NULL DEFAULT '',
    added_at       TEXT NOT NULL,
    who            TEXT NOT NULL DEFAULT ''
) STRICT;
-- host_version is what the node's host says it runs (when it joins, and in
-- every beat); host_release is the version declared to it: NULL, none (the
-- host is left on what it runs). No key to host_releases: a rollback
-- declares the version a host ran, which the controller may keep no
-- release of (the host kept its binary).
ALTER TABLE nodes ADD COLUMN host_version TEXT;
ALTER TABLE nodes ADD COLUMN host_release TEXT;
-- A roll-out moves a module's nodes to a version (kind module, keyed by
-- the module) or hosts to a host release (kind host, keyed by '', which no
-- module is named: one host roll-out at a time).
ALTER TABLE rollouts ADD COLUMN kind TEXT NOT NULL DEFAULT 'module' CHECK (kind IN ('module', 'host'));
