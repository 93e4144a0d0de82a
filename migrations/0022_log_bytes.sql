-- Logs cost bytes, bounded per worker and per workspace (src/store/logs.rs `append`).
-- A line costs its UTF-8 bytes and a newline: the size of the log as the API prints it.
--   workers.log_taken   bytes this worker's output took towards its cap; never goes down, so a
--                       worker past its cap stores nothing more even after old lines rotate out
--   workers.log_bytes   bytes of this worker's lines kept now
--   workers.log_refused lines not kept because of the cap or the workspace's quota
--   workers.log_cut     why output is being dropped: 'cap' (for good) or 'quota' (until room is
--                       made); its one line saying so has been stored
--   workspaces.log_bytes bytes of its workers' lines kept now
-- Uploads lock the worker's row, then the workspace's, and decide what fits with both held, so
-- concurrent uploads (several replicas) never overshoot.
ALTER TABLE workers
    ADD COLUMN log_taken    bigint NOT NULL DEFAULT 0,
    ADD COLUMN log_bytes    bigint NOT NULL DEFAULT 0,
    ADD COLUMN log_refused  bigint NOT NULL DEFAULT 0,
    ADD COLUMN log_cut      text CONSTRAINT workers_log_cut_check CHECK (log_cut IN ('cap', 'quota'));
ALTER TABLE workspaces ADD COLUMN log_bytes bigint NOT NULL DEFAULT 0;

WITH kept AS (
    SELECT worker_id, sum(octet_length(line) + 1) AS bytes FROM worker_logs GROUP BY worker_id)
UPDATE workers w SET log_taken = k.bytes, log_bytes = k.bytes FROM kept k WHERE w.id = k.worker_id;
WITH kept AS (SELECT workspace_id, sum(log_bytes) AS bytes FROM workers GROUP BY workspace_id)
UPDATE workspaces ws SET log_bytes = k.bytes FROM kept k WHERE ws.id = k.workspace_id;

-- Deleting a run deletes its workers and, by cascade, their lines: the workspace gets their bytes
-- back here, once per statement, since the lines' own rows no longer name their workspace's
-- worker by the time their deletion is seen.
CREATE FUNCTION release_log_bytes() RETURNS trigger LANGUAGE plpgsql SET enable_nestloop = off AS $$
BEGIN
    UPDATE workspaces ws SET log_bytes = ws.log_bytes - g.bytes
    FROM (SELECT workspace_id, sum(log_bytes) AS bytes FROM old_rows GROUP BY workspace_id) g
    WHERE ws.id = g.workspace_id AND g.bytes > 0;
    RETURN NULL;
END $$;

CREATE TRIGGER workers_release_log_bytes AFTER DELETE ON workers REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION release_log_bytes();
