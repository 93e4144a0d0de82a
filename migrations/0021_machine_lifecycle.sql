-- A machine's lifecycle, set by organisation admins: cordoned (no new workers but fills for
-- those already there) and draining (cordoned; its waiting workers go back to be placed
-- elsewhere, and its running workers have until the deadline).
ALTER TABLE machines
    ADD COLUMN cordoned        boolean NOT NULL DEFAULT false,
    ADD COLUMN drain_deadline  timestamptz,
    ADD CONSTRAINT machines_drain_cordoned CHECK (drain_deadline IS NULL OR cordoned);

-- A change of either is one a person notices: watchers of machines hear of it.
CREATE OR REPLACE FUNCTION record_machine_changes() RETURNS trigger LANGUAGE plpgsql SET enable_nestloop = off AS $$
DECLARE
    recorded bigint;
BEGIN
    INSERT INTO changes (kind, workspace_id, name, type)
    SELECT 'machines', NULL, n.name, 'MODIFIED' FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE (o.state, o.cpu_alloc, o.memory_alloc, o.gpus_alloc, o.data_path, o.data_limit_bytes, o.labels,
           o.cpu_millis, o.memory_bytes, o.cordoned, o.drain_deadline)
          IS DISTINCT FROM (n.state, n.cpu_alloc, n.memory_alloc, n.gpus_alloc, n.data_path,
           n.data_limit_bytes, n.labels, n.cpu_millis, n.memory_bytes, n.cordoned, n.drain_deadline);
    GET DIAGNOSTICS recorded = ROW_COUNT;
    IF recorded > 0 THEN
        PERFORM pg_notify('astraeus_change', 'machines');
    END IF;
    RETURN NULL;
END $$;

-- The drain controller's question, asked every few seconds: which machines are draining.
CREATE INDEX machines_draining_idx ON machines (drain_deadline) WHERE drain_deadline IS NOT NULL;
