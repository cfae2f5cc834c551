-- The inventory's act revision (issue 30): one row, moved by every write
-- that can change what an act judges. An act judged on a snapshot of
-- revision R commits only while the revision is still R (an UPDATE that
-- matches no row otherwise), so two acts at once can never both pass a
-- rule that either alone would fail: the second is judged again.
CREATE TABLE act_revision (
    id  INTEGER PRIMARY KEY CHECK (id = 1),
    rev INTEGER NOT NULL
) STRICT;
INSERT INTO act_revision (id, rev) VALUES (1, 1); -- 1: a change Based on 0 is one not judged on a snapshot
