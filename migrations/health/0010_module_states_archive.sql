-- A module's state carries the digest of the archive its host runs it
-- from: what the collection says runs where is what hosts report, not what
-- the inventory last registered (a rebuild replaces a version's archive
-- while hosts still run the old one). Rows from before have none.
ALTER TABLE module_states ADD COLUMN archive TEXT NOT NULL DEFAULT '';
