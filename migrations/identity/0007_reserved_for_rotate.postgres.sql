-- Reserved: identity 0007 is the rotate branch's (signing key rotation). This
-- placeholder keeps the numbers without a gap on the compat branch alone;
-- the merge drops it for rotate's 0007.
SELECT 1;
