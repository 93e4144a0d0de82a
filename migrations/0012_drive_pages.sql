-- A drive's users and copies are read a page at a time. The users are the live workers of the
-- runs that mount the drive, and most of those runs have completed (every seed, probe and fill
-- leaves one behind): each mount says whether its run has, kept so by a trigger on the run, so
-- that a drive's live mounts come from a partial index, newest run first, and each run's live
-- workers in index order, without a probe per completed run.
ALTER TABLE run_mounts ADD COLUMN run_completed boolean NOT NULL DEFAULT false;
UPDATE run_mounts m SET run_completed = true FROM runs r WHERE r.id = m.run_id AND r.state = 'Completed';
CREATE INDEX run_mounts_drive_live_idx ON run_mounts (drive_id, run_id) WHERE NOT run_completed;

CREATE FUNCTION mark_run_mounts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE run_mounts SET run_completed = (NEW.state = 'Completed') WHERE run_id = NEW.id;
    RETURN NULL;
END $$;
CREATE TRIGGER runs_completed AFTER UPDATE OF state ON runs
    FOR EACH ROW WHEN ((OLD.state = 'Completed') IS DISTINCT FROM (NEW.state = 'Completed'))
    EXECUTE FUNCTION mark_run_mounts();

DROP INDEX workers_live_run_idx;
CREATE INDEX workers_live_run_idx ON workers (run_id, index) WHERE state NOT IN ('Completed', 'Failed');
