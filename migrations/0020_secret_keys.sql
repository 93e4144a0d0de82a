-- A sealed secret names the key that sealed it; NULL for values sealed before key ids (without
-- associated data), which still open and are resealed under the newest key by the server.
ALTER TABLE secrets ADD COLUMN key_id text
    CONSTRAINT secrets_key_id_check CHECK (key_id ~ '^[0-9a-f]{16}$');

-- Resealing rewrites `sealed` and `key_id`, which nobody watching sees: only changes to what a
-- secret shows are recorded.
DROP TRIGGER secrets_changed ON secrets;
CREATE TRIGGER secrets_changed AFTER INSERT OR DELETE ON secrets
    FOR EACH ROW EXECUTE FUNCTION record_change('secrets');
CREATE TRIGGER secrets_modified AFTER UPDATE ON secrets
    FOR EACH ROW WHEN (OLD.workspace_id IS DISTINCT FROM NEW.workspace_id
        OR OLD.name IS DISTINCT FROM NEW.name OR OLD.keys IS DISTINCT FROM NEW.keys)
    EXECUTE FUNCTION record_change('secrets');
