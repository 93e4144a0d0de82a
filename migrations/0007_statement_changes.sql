-- The change log of workers and copies is written once per statement, not once per row: a
-- placement binds a thousand workers in one UPDATE, and row triggers cost more than the update.
-- A run (or drive) whose workers (or copies) changed is recorded once per statement.
-- Transition tables need one trigger per event and no column list, so what a person would
-- notice is found by joining the old rows with the new. The planner takes a transition table
-- for one row and would join them by nested loop, a thousand squared; the functions turn that
-- off, and look runs and drives up by an array of ids, which needs no join.

DROP TRIGGER workers_changed ON workers;
DROP TRIGGER workers_modified ON workers;
DROP FUNCTION record_worker_change();

CREATE FUNCTION record_worker_changes() RETURNS trigger LANGUAGE plpgsql SET enable_nestloop = off AS $$
DECLARE
    recorded bigint;
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO changes (kind, workspace_id, name, type)
        SELECT 'workers', n.workspace_id, n.name, 'ADDED' FROM new_rows n;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO changes (kind, workspace_id, name, type)
        SELECT 'workers', o.workspace_id, o.name, 'DELETED' FROM old_rows o
        UNION ALL
        SELECT DISTINCT 'runs', r.workspace_id, r.name, 'MODIFIED'
        FROM runs r WHERE r.id = ANY (ARRAY(SELECT run_id FROM old_rows));
    ELSE
        WITH changed AS (
            SELECT n.workspace_id, n.name, n.run_id FROM new_rows n JOIN old_rows o ON o.id = n.id
            WHERE (o.state, o.reason, o.machine_id, o.released, o.exit_code)
                  IS DISTINCT FROM (n.state, n.reason, n.machine_id, n.released, n.exit_code))
        INSERT INTO changes (kind, workspace_id, name, type)
        SELECT 'workers', c.workspace_id, c.name, 'MODIFIED' FROM changed c
        UNION ALL
        SELECT DISTINCT 'runs', r.workspace_id, r.name, 'MODIFIED'
        FROM runs r WHERE r.id = ANY (ARRAY(SELECT run_id FROM changed));
    END IF;
    GET DIAGNOSTICS recorded = ROW_COUNT;
    IF recorded > 0 THEN
        PERFORM pg_notify('astraeus_change', 'workers');
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER workers_added AFTER INSERT ON workers REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION record_worker_changes();
CREATE TRIGGER workers_modified AFTER UPDATE ON workers REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION record_worker_changes();
CREATE TRIGGER workers_deleted AFTER DELETE ON workers REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION record_worker_changes();

DROP TRIGGER copies_changed ON copies;
DROP TRIGGER copies_modified ON copies;
DROP FUNCTION record_copy_change();

-- A copy's change is a change of its drive (drives embed their copies).
CREATE FUNCTION record_copy_changes() RETURNS trigger LANGUAGE plpgsql SET enable_nestloop = off AS $$
DECLARE
    recorded bigint;
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO changes (kind, workspace_id, name, type)
        SELECT DISTINCT 'drives', d.workspace_id, d.name, 'MODIFIED'
        FROM drives d WHERE d.id = ANY (ARRAY(SELECT drive_id FROM new_rows));
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO changes (kind, workspace_id, name, type)
        SELECT DISTINCT 'drives', d.workspace_id, d.name, 'MODIFIED'
        FROM drives d WHERE d.id = ANY (ARRAY(SELECT drive_id FROM old_rows));
    ELSE
        INSERT INTO changes (kind, workspace_id, name, type)
        SELECT DISTINCT 'drives', d.workspace_id, d.name, 'MODIFIED'
        FROM drives d WHERE d.id = ANY (ARRAY(
            SELECT n.drive_id FROM new_rows n JOIN old_rows o ON o.id = n.id
            WHERE (o.state, o.bytes, o.last_used_at) IS DISTINCT FROM (n.state, n.bytes, n.last_used_at)));
    END IF;
    GET DIAGNOSTICS recorded = ROW_COUNT;
    IF recorded > 0 THEN
        PERFORM pg_notify('astraeus_change', 'drives');
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER copies_added AFTER INSERT ON copies REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION record_copy_changes();
CREATE TRIGGER copies_modified AFTER UPDATE ON copies REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION record_copy_changes();
CREATE TRIGGER copies_deleted_changes AFTER DELETE ON copies REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION record_copy_changes();
