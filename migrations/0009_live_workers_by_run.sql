-- A drive's users are the workers that have not ended in the runs that mount it. Most of those
-- runs have ended (every seed, probe and fill leaves one behind), so each run's live workers
-- are found in an index of live workers only, not among every worker the run ever had.
CREATE INDEX workers_live_run_idx ON workers (run_id) WHERE state NOT IN ('Completed', 'Failed');
