-- replay --register --older: an ask that may register a version older than
-- the module's current one (any other older build is superseded).
ALTER TABLE asks ADD COLUMN allow_older INTEGER NOT NULL DEFAULT 0;
