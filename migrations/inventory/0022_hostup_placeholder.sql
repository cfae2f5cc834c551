-- Placeholder for inventory 0022, which is the hostup branch's (issue 31,
-- host self-upgrade): migrations are numbered without gaps, and this
-- branch's 0023 must run on its own. It changes nothing. The integrator
-- drops this file (and its twin) when merging hostup's 0022.
SELECT 1;
