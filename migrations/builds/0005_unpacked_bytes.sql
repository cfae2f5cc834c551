-- What a build's archive unpacks to (the sum of its regular files' sizes),
-- as its builder packed it: declared to hosts with the digest, so that one
-- that does not fit a host's disk is refused before it is unpacked. 0 for
-- builds from before it was kept.
ALTER TABLE asks ADD COLUMN unpacked_bytes INTEGER NOT NULL DEFAULT 0;
