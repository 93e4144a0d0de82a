-- Events that explain decisions, and the change log behind `?watch=true`.

-- Repeated events fold into one row whose count grows; old ones expire.
CREATE TABLE events (
    id            bigserial PRIMARY KEY,
    -- NULL for objects of the organisation (machines).
    workspace_id  uuid REFERENCES workspaces (id) ON DELETE CASCADE,
    object_kind   text NOT NULL,
    object_name   text NOT NULL,
    type          text NOT NULL CONSTRAINT events_type_check CHECK (type IN ('Normal', 'Warning')),
    reason        text NOT NULL,
    message       text NOT NULL,
    source        text NOT NULL,
    count         integer NOT NULL DEFAULT 1,
    first_at      timestamptz NOT NULL DEFAULT now(),
    last_at       timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX events_fold_key ON events
    (COALESCE(workspace_id, '00000000-0000-0000-0000-000000000000'::uuid), object_kind, object_name, reason, message);
CREATE INDEX events_object_idx ON events (object_kind, object_name, last_at);
CREATE INDEX events_last_at_idx ON events (last_at);

-- Every change to a watched object, in one global order.
CREATE TABLE changes (
    version       bigserial PRIMARY KEY,
    kind          text NOT NULL,
    workspace_id  uuid,
    name          text NOT NULL,
    type          text NOT NULL,
    at            timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX changes_kind_idx ON changes (kind, workspace_id, version);

-- Versions below this were compacted away: a watch from before it must list again (410).
CREATE TABLE changes_compacted (
    one      boolean PRIMARY KEY DEFAULT true CHECK (one),
    version  bigint NOT NULL
);
INSERT INTO changes_compacted (version) VALUES (0);

CREATE FUNCTION record_change() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    row jsonb := to_jsonb(CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END);
    change text := CASE TG_OP WHEN 'INSERT' THEN 'ADDED' WHEN 'DELETE' THEN 'DELETED' ELSE 'MODIFIED' END;
BEGIN
    INSERT INTO changes (kind, workspace_id, name, type)
    VALUES (TG_ARGV[0], (row ->> 'workspace_id')::uuid, row ->> 'name', change);
    PERFORM pg_notify('astraeus_change', TG_ARGV[0]);
    RETURN NULL;
END $$;

-- A worker's change is a change of its run (runs embed their workers) and of itself.
CREATE FUNCTION record_worker_change() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    w workers := CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    run_name text;
BEGIN
    INSERT INTO changes (kind, workspace_id, name, type)
    VALUES ('workers', w.workspace_id, w.name,
            CASE TG_OP WHEN 'INSERT' THEN 'ADDED' WHEN 'DELETE' THEN 'DELETED' ELSE 'MODIFIED' END);
    SELECT name INTO run_name FROM runs WHERE id = w.run_id;
    IF run_name IS NOT NULL AND TG_OP <> 'INSERT' THEN
        INSERT INTO changes (kind, workspace_id, name, type) VALUES ('runs', w.workspace_id, run_name, 'MODIFIED');
    END IF;
    PERFORM pg_notify('astraeus_change', 'workers');
    RETURN NULL;
END $$;

-- A copy's change is a change of its drive (drives embed their copies).
CREATE FUNCTION record_copy_change() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    c copies := CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
BEGIN
    INSERT INTO changes (kind, workspace_id, name, type)
    SELECT 'drives', d.workspace_id, d.name, 'MODIFIED' FROM drives d WHERE d.id = c.drive_id;
    PERFORM pg_notify('astraeus_change', 'drives');
    RETURN NULL;
END $$;

CREATE TRIGGER runs_changed AFTER INSERT OR UPDATE OR DELETE ON runs
    FOR EACH ROW EXECUTE FUNCTION record_change('runs');
CREATE TRIGGER drives_changed AFTER INSERT OR UPDATE OR DELETE ON drives
    FOR EACH ROW EXECUTE FUNCTION record_change('drives');
CREATE TRIGGER secrets_changed AFTER INSERT OR UPDATE OR DELETE ON secrets
    FOR EACH ROW EXECUTE FUNCTION record_change('secrets');
CREATE TRIGGER workers_changed AFTER INSERT OR DELETE ON workers
    FOR EACH ROW EXECUTE FUNCTION record_worker_change();
-- Log uploads bump counters on the worker; only what a person sees is recorded.
CREATE TRIGGER workers_modified AFTER UPDATE ON workers
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.reason IS DISTINCT FROM NEW.reason
        OR OLD.machine_id IS DISTINCT FROM NEW.machine_id OR OLD.released IS DISTINCT FROM NEW.released
        OR OLD.exit_code IS DISTINCT FROM NEW.exit_code)
    EXECUTE FUNCTION record_worker_change();
-- Heartbeats rewrite usage every few seconds; only changes a person would notice are recorded.
CREATE TRIGGER machines_changed AFTER INSERT OR DELETE ON machines
    FOR EACH ROW EXECUTE FUNCTION record_change('machines');
CREATE TRIGGER machines_modified AFTER UPDATE ON machines
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state
        OR OLD.cpu_alloc IS DISTINCT FROM NEW.cpu_alloc OR OLD.memory_alloc IS DISTINCT FROM NEW.memory_alloc
        OR OLD.gpus_alloc IS DISTINCT FROM NEW.gpus_alloc OR OLD.data_path IS DISTINCT FROM NEW.data_path
        OR OLD.data_limit_bytes IS DISTINCT FROM NEW.data_limit_bytes OR OLD.labels IS DISTINCT FROM NEW.labels
        OR OLD.cpu_millis IS DISTINCT FROM NEW.cpu_millis OR OLD.memory_bytes IS DISTINCT FROM NEW.memory_bytes)
    EXECUTE FUNCTION record_change('machines');
CREATE TRIGGER copies_changed AFTER INSERT OR DELETE ON copies
    FOR EACH ROW EXECUTE FUNCTION record_copy_change();
CREATE TRIGGER copies_modified AFTER UPDATE ON copies
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.bytes IS DISTINCT FROM NEW.bytes
        OR OLD.last_used_at IS DISTINCT FROM NEW.last_used_at)
    EXECUTE FUNCTION record_copy_change();
