-- Host users are recorded too, one per join, and a join revokes the node's
-- earlier ones: found by node, not by scanning every user issued.
CREATE INDEX issued_users_node ON issued_users (node, kind);
