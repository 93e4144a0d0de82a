-- How fast a copy's fill wrote, in bytes a second, between its last two progress observations
-- some seconds apart (store::copies::reconcile); kept once the copy is whole. Placement takes a
-- machine's most recent one as how fast a new fill there would go.
ALTER TABLE copies ADD COLUMN fill_rate bigint;
