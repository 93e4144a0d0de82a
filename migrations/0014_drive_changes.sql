-- Replicas keep the drives that agents' assignments name in memory (src/kept.rs): a
-- drive row is never updated, so a record stays true until its drive is deleted. Any deletion,
-- and any update should one ever be made, tells every replica to read them again.
CREATE FUNCTION announce_drive_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('astraeus_drive_changed', '');
    RETURN NULL;
END $$;

CREATE TRIGGER drives_announced AFTER UPDATE OR DELETE ON drives
    FOR EACH STATEMENT EXECUTE FUNCTION announce_drive_change();
