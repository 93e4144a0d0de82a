-- The scheduler and the fill controller look for a few live rows among many finished ones on
-- every pass: the fill runs still going, and the bound workers still waiting for a copy. Every
-- seed, probe and fill leaves a row behind, so without these both read the whole table.
CREATE INDEX runs_live_fills_idx ON runs (id) WHERE fill_drive_id IS NOT NULL AND state NOT IN ('Completed', 'Failed');
CREATE INDEX workers_waiting_idx ON workers (run_id) WHERE state = 'Preparing' AND NOT released;
