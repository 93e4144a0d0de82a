-- Replicas answer a heartbeat that changes nothing from memory. What the server changes on its
-- side (a copy evicted, dropped or failed, the data location confirmed, the machine NotReady or
-- gone) is announced on `astraeus_report` with the machine's id, so every replica looks again.

CREATE FUNCTION astraeus_copy_report_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('astraeus_report', COALESCE(NEW.machine_id, OLD.machine_id)::text);
    RETURN NULL;
END $$;

CREATE TRIGGER copies_state_changed AFTER UPDATE OF state ON copies
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION astraeus_copy_report_changed();
CREATE TRIGGER copies_deleted AFTER DELETE ON copies
    FOR EACH ROW EXECUTE FUNCTION astraeus_copy_report_changed();

CREATE FUNCTION astraeus_machine_report_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('astraeus_report', COALESCE(NEW.id, OLD.id)::text);
    RETURN NULL;
END $$;

CREATE TRIGGER machines_report_changed AFTER UPDATE OF state, data_path, data_limit_bytes ON machines
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.data_path IS DISTINCT FROM NEW.data_path
                       OR OLD.data_limit_bytes IS DISTINCT FROM NEW.data_limit_bytes)
    EXECUTE FUNCTION astraeus_machine_report_changed();
CREATE TRIGGER machines_deleted AFTER DELETE ON machines
    FOR EACH ROW EXECUTE FUNCTION astraeus_machine_report_changed();
